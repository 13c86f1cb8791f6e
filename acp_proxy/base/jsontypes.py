"""JSON value types and the single "omitted" sentinel used across acp_proxy.

Contract: this module owns the representation of JSON values in the core. A value that is
*omitted* (the key is absent) is ``OMITTED``; a value that is ``null`` is ``None``. The two
are never conflated (ACP v2 migration guide, SDK checklist item 2: "A plain nullable/optional
type erases a distinction the protocol depends on"). Pure: no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final, Literal, TypeAlias, Union

# A JSON value as decoded by orjson: dict/list/str/int/float/bool/None.
JsonValue: TypeAlias = Union[  # noqa: UP007 - a recursive alias needs the string forward refs
    bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"], None
]
JsonObject: TypeAlias = dict[str, JsonValue]


class _Omitted(enum.Enum):
    """The type of ``OMITTED``: a key that is absent, as opposed to present with ``null``."""

    OMITTED = "OMITTED"

    def __repr__(self) -> str:
        return "OMITTED"

    def __bool__(self) -> bool:  # pragma: no cover - guard against accidental truthiness use
        raise TypeError("OMITTED has no truth value; compare with `is OMITTED`")


OMITTED: Final = _Omitted.OMITTED
Omitted: TypeAlias = Literal[_Omitted.OMITTED]

# A three-state field: omitted, null, or a value.
Field: TypeAlias = Omitted | JsonValue


def get_field(obj: Mapping[str, JsonValue], key: str) -> Field:
    """Return ``obj[key]``, or ``OMITTED`` when the key is absent (``None`` means ``null``)."""
    return obj.get(key, OMITTED)


def is_object(value: object) -> bool:
    """True for a JSON object (a ``dict``); arrays, strings, numbers and ``null`` are not."""
    return isinstance(value, dict)
