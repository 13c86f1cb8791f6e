"""The JSON Schema of the ``budgets:`` section (for editors; ``acp-proxy schema`` includes it).

Contract: declarations only, the same keys ``budget.parse`` reads; the parser checks more
(durations, fractions, labels, unique names).
"""

from __future__ import annotations

from typing import cast

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.budget.model import Action, Meter, Per


def _enum(values: type[Per] | type[Meter] | type[Action]) -> JsonValue:
    return cast(JsonValue, [v.value for v in values])


def budgets_schema() -> JsonObject:
    """The ``$defs`` entries of the budgets: ``budgets`` and ``budget_limit``."""
    fraction: JsonObject = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}
    limit: JsonObject = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "meter", "max"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "per": {"enum": _enum(Per), "default": "session"},
            "meter": {"enum": _enum(Meter)},
            "max": {"type": "number", "minimum": 0},
            "window": {
                "type": "string",
                "description": "An ISO 8601 duration (P1D, PT12H, P1W): the spend starts again "
                "from zero this long after the window's first spend.",
                "pattern": r"^P(\d+W)?(\d+D)?(T(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?$",
            },
            "warn_at": {"anyOf": [fraction, {"type": "array", "items": fraction}]},
            "action": {"enum": _enum(Action), "default": "refuse_next_prompt"},
            "label": {"type": "string", "minLength": 1},
        },
    }
    budgets: JsonObject = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "state": {
                "type": "string",
                "minLength": 1,
                "default": "budgets.json",
                "description": "The state file (relative to the config file's directory).",
            },
            "limits": {"type": ["array", "null"], "items": {"$ref": "#/$defs/budget_limit"}},
        },
    }
    return {"budgets": budgets, "budget_limit": limit}
