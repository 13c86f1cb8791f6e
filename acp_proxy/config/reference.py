"""What is generated from the config's declarations: the JSON Schema and the docs' tables.

Contract: pure functions of ``config.schema`` (the settings and fields) and ``config.checks``
(the rules across keys): ``json_schema`` (``acp-proxy schema``, ``config/acp-proxy.schema.json``,
for editors) and ``settings_table`` (docs/configuration.md's Settings table; a test keeps the
page equal to it). Nothing here validates a file: the parser does, from the same tables.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.budget.schema import budgets_schema
from acp_proxy.config.checks import MIDDLEWARE_CHECKS, RULE_CHECKS, Check
from acp_proxy.config.model import Config, MiddlewareSpec, _json_text, _RulesFactory, _size_text
from acp_proxy.config.rules import W3C_TRACE_KEYS, Rule
from acp_proxy.config.schema import (
    MIDDLEWARE_FIELDS,
    RULE_FIELDS,
    SETTINGS,
    SIZE_PATTERN,
    Kind,
    Setting,
)
from acp_proxy.meta.annotate import V1Mode
from acp_proxy.policy.schema import policy_schema

_ENV_REF: Final = {"type": "string", "pattern": r"\$\{"}  # "${VAR}": known only at start-up
_META_KEY: Final[JsonObject] = {
    "anyOf": [
        {"enum": cast(JsonValue, sorted(W3C_TRACE_KEYS))},
        {"type": "string", "pattern": "^[^/]+/.+$"},
    ]
}


def _defaults(instance: object) -> dict[str, object]:
    """The default of each field of a dataclass, from an instance built with its defaults."""
    return {f.name: getattr(instance, f.name) for f in dataclasses.fields(cast(Any, instance))}


def _json_default(value: object) -> JsonValue:
    if isinstance(value, enum.Enum):
        return cast(JsonValue, value.value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    return cast(JsonValue, value)


def _setting_schema(setting: Setting, defaults: Mapping[str, object]) -> JsonObject:
    """The schema of one setting; ``defaults`` maps its owner's fields to their defaults."""
    kind = setting.kind
    out: JsonObject = {"description": setting.doc}
    if kind is Kind.BOOL:
        out["type"] = "boolean"
    elif kind is Kind.INT:
        out.update(type="integer", minimum=setting.minimum)
    elif kind is Kind.SIZE:
        out["anyOf"] = [
            {"type": "integer", "minimum": 1},
            {"type": "string", "pattern": SIZE_PATTERN},
            dict(_ENV_REF),
        ]
    elif kind is Kind.SECONDS:
        out["type"] = "number"
        out["exclusiveMinimum" if setting.positive else "minimum"] = 0
    elif kind is Kind.CHOICE:
        assert setting.choices is not None
        out["anyOf"] = [{"enum": [e.value for e in setting.choices]}, dict(_ENV_REF)]
    elif kind is Kind.ADDRESS:
        pattern = "^(tcp://.+:[0-9]+|unix:///.+)$"
        if setting.http:  # telemetry.endpoint: HOST:PORT, http://HOST:PORT[/...]
            pattern = "^(tcp://.+:[0-9]+|unix:///.+|http://[^/]+:[0-9]+(/.*)?|[^/]+:[0-9]+)$"
        out["anyOf"] = [
            {"type": "null"},
            {"type": "string", "pattern": pattern},
            dict(_ENV_REF),
        ]
    elif kind is Kind.ENV:
        out.update(
            type=["object", "null"],
            propertyNames={"pattern": "^[^=]+$"},
            additionalProperties={"type": ["string", "number"]},
        )
    elif kind is Kind.SECTION:
        inner = defaults
        if setting.attr is not None:
            inner = _defaults(defaults[setting.attr])
        out.update(_mapping_schema(setting.children, inner), type=["object", "null"])
    elif kind is Kind.RULES:
        out.update(type=["array", "null"], items={"$ref": "#/$defs/rule"})
    elif kind is Kind.MIDDLEWARE:
        out.update(type=["array", "null"], items={"$ref": "#/$defs/middleware"})
    elif kind is Kind.POLICY:
        out["anyOf"] = [{"$ref": "#/$defs/policy"}, {"type": "null"}]
    elif kind is Kind.BUDGETS:
        out["anyOf"] = [{"$ref": "#/$defs/budgets"}, {"type": "null"}]
    elif kind is Kind.STRING:
        out.update(type="string", minLength=1)
    elif kind is Kind.UPDATE:
        out["anyOf"] = [
            {"type": "string"},
            {"type": "array", "minItems": 1, "items": {"type": "string"}},
        ]
    elif kind is Kind.META_MAP:
        out.update(
            type="object",
            propertyNames=_META_KEY,
            additionalProperties={"not": {"type": "null"}},
        )
    elif kind is Kind.META_LIST:
        out.update(type=["array", "null"], items={"type": "string", **_META_KEY})
    elif kind is Kind.OPTIONS:
        out["type"] = ["object", "null"]
    elif kind in (Kind.STRINGS, Kind.REGEXES, Kind.DIRECTORIES):
        out.update(type=["array", "null"], items={"type": "string", "minLength": 1})
    else:
        assert kind is Kind.USE, kind
        out.update(type="string", pattern=r"^(rules|[A-Za-z_][\w.]*:[A-Za-z_][\w.]*)$")
    if setting.attr is not None and kind is not Kind.SECTION:
        default = defaults[setting.attr]
        if default is not None:
            out["default"] = _json_default(default)
    return out


def _mapping_schema(fields: Sequence[Setting], defaults: Mapping[str, object]) -> JsonObject:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {f.key: _setting_schema(f, defaults) for f in fields},
    }


def _entry_schema(
    fields: Sequence[Setting], checks: Sequence[Check], defaults: Mapping[str, object]
) -> JsonObject:
    """A rule's or a middleware entry's schema: its fields, those required, and the checks
    across keys that JSON Schema can say."""
    out = _mapping_schema(fields, defaults)
    required = [f.key for f in fields if f.required is not None]
    if required:
        out["required"] = cast(JsonValue, required)
    said = [c.schema for c in checks if c.schema is not None]
    if said:
        out["allOf"] = cast(JsonValue, said)
    return out


def json_schema() -> JsonObject:
    """The JSON schema of the config file (``acp-proxy schema``), generated from SETTINGS,
    RULE_FIELDS and MIDDLEWARE_FIELDS.

    It checks the shape of the file for editors, and the checks across keys that JSON Schema can
    say; ``check-config`` checks more (imports, the other checks across keys, environment
    variables, the socket addresses).
    """
    rule = _entry_schema(RULE_FIELDS, RULE_CHECKS, _defaults(Rule(name="")))
    middleware = _entry_schema(
        MIDDLEWARE_FIELDS,
        MIDDLEWARE_CHECKS,
        _defaults(MiddlewareSpec("", factory=_RulesFactory((), V1Mode.OFF, 1))),
    )
    top = _mapping_schema(SETTINGS, _defaults(Config()))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "acp-proxy configuration file",
        **top,
        "type": ["object", "null"],
        "$defs": {"rule": rule, "middleware": middleware, **policy_schema(), **budgets_schema()},
    }


def _documented_default(setting: Setting, section: Setting | None) -> str:
    if setting.default_doc is not None:
        return setting.default_doc
    defaults = _defaults(Config())
    if section is not None and section.attr is not None:
        defaults = _defaults(defaults[section.attr])
    assert setting.attr is not None
    value = defaults[setting.attr]
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if setting.kind is Kind.SIZE:
        assert isinstance(value, int)
        return f"`{_size_text(value).replace(' ', '')}`"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if isinstance(value, Mapping):
        return "`{}`" if not value else f"`{_json_text(dict(value))}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, tuple):
        return f"`{_json_text(list(value))}`"
    return f"`{value}`"


def settings_table() -> str:
    """The Settings table of docs/configuration.md (a test keeps the page equal to it)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for setting in SETTINGS:
        if setting.kind in (Kind.RULES, Kind.MIDDLEWARE, Kind.POLICY, Kind.BUDGETS):
            continue
        if setting.kind is Kind.SECTION:
            for child in setting.children:
                rows.append(
                    f"| `{setting.key}.{child.key}` | {_documented_default(child, setting)} "
                    f"| {child.doc} |"
                )
        else:
            rows.append(
                f"| `{setting.key}` | {_documented_default(setting, None)} | {setting.doc} |"
            )
    return "\n".join(rows)
