"""Validate test data against the official ACP JSON Schemas copied into ``tests/schemas``.

Contract: the one place tests load the schemas (the unstable files, which define every draft kind
acp_proxy handles: ``subagent_update``, ``session_message``, ``compaction_update``...). Each file
is parsed once and cached; each ``$defs`` entry gets one cached validator. Only files inside the
repository are read (``/work/shared`` does not exist on CI).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SCHEMAS = Path(__file__).parent / "schemas"


@functools.cache
def _registry(version: int) -> tuple[str, Any]:
    path = SCHEMAS / f"v{version}" / "schema.unstable.json"
    contents = json.loads(path.read_text(encoding="utf-8"))
    uri = f"urn:acp-schema:v{version}:unstable"
    resource = Resource.from_contents(contents, default_specification=DRAFT202012)
    return uri, Registry().with_resource(uri, resource)


@functools.cache
def _validator(version: int, defname: str) -> Any:
    uri, registry = _registry(version)
    return Draft202012Validator({"$ref": f"{uri}#/$defs/{defname}"}, registry=registry)


@functools.cache
def schema_defs(version: int) -> dict[str, Any]:
    """The ``$defs`` of the unstable schema of ``version`` (read-only by convention)."""
    path = SCHEMAS / f"v{version}" / "schema.unstable.json"
    defs: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))["$defs"]
    return defs


# Instances already found valid, by (version, defname, canonical JSON): property tests validate
# the same small values again and again, and a validation costs milliseconds. Only successes
# are kept, so an invalid instance raises every time; values orjson cannot write canonically
# (big integers, Decimals, non-string keys) are validated without the cache.
_VALID: set[tuple[int, str, bytes]] = set()
_VALID_MAX = 200_000


def _validate(version: int, defname: str, instance: object) -> None:
    try:
        key = (version, defname, orjson.dumps(instance, option=orjson.OPT_SORT_KEYS))
    except TypeError:
        _validator(version, defname).validate(instance)
        return
    if key in _VALID:
        return
    _validator(version, defname).validate(instance)
    if len(_VALID) < _VALID_MAX:
        _VALID.add(key)


def validate_v2(defname: str, instance: object) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``instance`` is a valid v2 ``defname``."""
    _validate(2, defname, instance)


def validate_v1(defname: str, instance: object) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``instance`` is a valid v1 ``defname``."""
    _validate(1, defname, instance)


def validate_v2_message(message: dict[str, Any]) -> None:
    """Validate a v2 `session/update` or `session/request_permission` message's params."""
    method = message.get("method")
    if method == "session/update":
        validate_v2("UpdateSessionNotification", message["params"])
    elif method == "session/request_permission":
        validate_v2("RequestPermissionRequest", message["params"])
    else:
        raise ValueError(f"no schema chosen for method {method!r}")


def validate_v1_message(message: dict[str, Any]) -> None:
    """Validate a v1 `session/update` or `session/request_permission` message's params."""
    method = message.get("method")
    if method == "session/update":
        validate_v1("SessionNotification", message["params"])
    elif method == "session/request_permission":
        validate_v1("RequestPermissionRequest", message["params"])
    else:
        raise ValueError(f"no schema chosen for method {method!r}")
