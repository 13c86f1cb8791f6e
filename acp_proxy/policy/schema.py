"""The JSON Schema of the ``policy:`` section (for editors; ``acp-proxy schema`` includes it).

Contract: declarations only, the same keys ``policy.parse`` reads; the parser checks more
(globs, regexes, examples).
"""

from __future__ import annotations

from typing import cast

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.policy.model import Decision, OnUnasked, PolicyMode

_NAMES: JsonObject = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
    ]
}
_GLOBS: JsonObject = {
    "description": 'Path globs: absolute, or starting with "{cwd}", "~" or "**".',
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
    ],
}
_ARGV: JsonObject = {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}


def _match() -> JsonObject:
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "Every condition given must hold.",
        "properties": {
            "method": {**_NAMES, "description": "JSON-RPC methods: exact names or globs."},
            "kind": {**_NAMES, "description": "Tool kinds (read, edit, execute...)."},
            "agent": {**_NAMES, "description": "Agent names from initialize: names or globs."},
            "command": {
                "description": "An argv prefix (a string is shlex-split), or a list of them.",
                "anyOf": [
                    {"type": "string", "minLength": 1},
                    _ARGV,
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": {"anyOf": [{"type": "string", "minLength": 1}, _ARGV]},
                    },
                ],
            },
            "paths": _GLOBS,
            "paths_outside": _GLOBS,
            "title": {"type": "string", "description": "A regular expression (linear-time)."},
        },
    }


def _example() -> JsonObject:
    keys = ("method", "kind", "title", "agent", "cwd")
    props: JsonObject = {k: {"type": "string"} for k in keys}
    props["command"] = {"anyOf": [{"type": "string"}, _ARGV]}
    props["paths"] = {"type": "array", "items": {"type": "string"}}
    return {"type": "object", "additionalProperties": False, "properties": props}


def policy_schema() -> JsonObject:
    """The ``$defs`` entries of the policy: ``policy`` and ``policy_rule``."""
    decisions = cast(JsonValue, [d.value for d in Decision])
    rule: JsonObject = {
        "type": "object",
        "additionalProperties": False,
        "required": ["decision"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "match": _match(),
            "decision": {"enum": decisions},
            "remember": {"type": "boolean", "default": False},
            "priority": {"type": "integer", "default": 0},
            "examples": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "match": {"type": "array", "items": _example()},
                    "not_match": {"type": "array", "items": _example()},
                },
            },
        },
    }
    policy: JsonObject = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "mode": {"enum": cast(JsonValue, [m.value for m in PolicyMode]), "default": "enforce"},
            "audit": {"type": ["string", "null"], "description": "The audit file (JSON lines)."},
            "default": {"enum": decisions, "default": "ask"},
            "forbid_modes": {"type": ["array", "null"], "items": {"type": "string"}},
            "on_unasked": {
                "enum": cast(JsonValue, [o.value for o in OnUnasked]),
                "default": "audit",
                "description": "A tool call that ran unasked and that a deny rule matches: "
                "audited (audit), or also its session cancelled with session/cancel (cancel; "
                "enforce mode only).",
            },
            "rules": {"type": ["array", "null"], "items": {"$ref": "#/$defs/policy_rule"}},
        },
    }
    return {"policy": policy, "policy_rule": rule}
