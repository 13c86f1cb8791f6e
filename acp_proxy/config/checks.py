"""The checks across the keys of one rule or one middleware entry, declared once.

Contract: each ``Check`` is one rule of the config format that no single key's type can say: what
it requires (``doc``, the documentation's line), how a document breaks it (``find``: the place
inside the entry and the exact message the parser reports there), and the same rule in JSON
Schema when JSON Schema can say it (``schema``, which ``json_schema()`` puts in the entry's
schema). Pure functions of the values the parser read; the parser (``config.parser``) applies
them with the YAML nodes' positions, so validation, ``check-config``, the JSON Schema and the
docs (``checks_text``) come from this one table. Checks across entries (unique names, the rules
listed once) are the parser's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.config.schema import BUILTIN_RULES, RULES_ENTRY_KEYS
from acp_proxy.rules.engine import is_glob

# The places a check reports at, relative to its entry: "" (the entry itself), a key
# (``"use"``), a key inside ``match`` (``"match.update"``) or an item (``"remove_meta[2]"``).
Found = Iterator[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Check:
    """One rule across the keys of an entry."""

    doc: str  # what the rule requires, for the documentation
    # (values read from the entry) -> (place, message) for each breach.
    find: Callable[[Mapping[str, Any]], Found]
    schema: JsonObject | None = None  # the same rule in JSON Schema, when it can say it
    # Only on an entry whose every key was valid: a rule that is about the entry as a whole
    # (another error would make it report a mere consequence of that error).
    whole: bool = False


# -- rules: the values are those of the keys that were valid: "set_meta" (a dict),
# "remove_meta" (a list of (index, key)), "match.method" (a str) and "match.update"
# ((kinds, upserts)).


def _update_needs_a_method_that_carries_it(values: Mapping[str, Any]) -> Found:
    method = values.get("match.method")
    update = values.get("match.update")
    if update is None or method is None or is_glob(method):
        return
    allowed = ["session/update"] + (["session/request_permission"] if update[1] else [])
    if method not in allowed:
        yield (
            "match.update",
            f'method "{method}" never carries a sessionUpdate: "update" needs '
            f"method {' or '.join(allowed)} (or no method)",
        )


def _set_and_remove_are_disjoint(values: Mapping[str, Any]) -> Found:
    set_meta = values.get("set_meta", {})
    for index, key in values.get("remove_meta", ()):
        if key in set_meta:
            yield f"remove_meta[{index}]", f'"{key}" is both in set_meta and remove_meta: keep one'


def _changes_something(values: Mapping[str, Any]) -> Found:
    if not values.get("set_meta") and not values.get("remove_meta"):
        yield "", "the rule changes nothing: give set_meta and/or remove_meta"


RULE_CHECKS: Final[tuple[Check, ...]] = (
    Check(
        "`match.update` goes with a `match.method` that carries a sessionUpdate: "
        "`session/update`, or `session/request_permission` with `upserts` (or a glob, or no "
        "method).",
        _update_needs_a_method_that_carries_it,
        {
            "if": {
                "required": ["match"],
                "properties": {
                    "match": {
                        "required": ["method", "update"],
                        "properties": {"method": {"type": "string", "pattern": r"^[^*?\[]*$"}},
                    }
                },
            },
            "then": {
                "properties": {
                    "match": {
                        "properties": {
                            "method": {"enum": ["session/update", "session/request_permission"]}
                        }
                    }
                }
            },
        },
    ),
    Check("A key is not both in `set_meta` and `remove_meta`.", _set_and_remove_are_disjoint),
    Check(
        "A rule changes something: it gives `set_meta`, `remove_meta` or both.",
        _changes_something,
        {"anyOf": [{"required": ["set_meta"]}, {"required": ["remove_meta"]}]},
        whole=True,
    ),
)

# -- middleware entries: "use" (a str) and "keys" (the keys the entry gives).


def _builtin_rules_take_only_their_keys(values: Mapping[str, Any]) -> Found:
    if values.get("use") != BUILTIN_RULES:
        return
    for key in values["keys"]:
        if key not in RULES_ENTRY_KEYS:
            yield (
                key,
                f'the built-in rules take no "{key}": configure them under "rules:" '
                f"(valid keys here: {', '.join(RULES_ENTRY_KEYS)})",
            )


MIDDLEWARE_CHECKS: Final[tuple[Check, ...]] = (
    Check(
        f"The built-in `use: {BUILTIN_RULES}` entry takes only "
        f"{' and '.join(f'`{k}`' for k in RULES_ENTRY_KEYS)}: the rules are configured under "
        "`rules:`.",
        _builtin_rules_take_only_their_keys,
        {
            "if": {"required": ["use"], "properties": {"use": {"const": BUILTIN_RULES}}},
            "then": {"propertyNames": {"enum": list(RULES_ENTRY_KEYS)}},
        },
    ),
)


def breaches(checks: tuple[Check, ...], values: Mapping[str, Any], *, whole: bool) -> Found:
    """Every breach of an entry's ``values`` of the ``checks`` that are (``whole``) or are not
    about the entry as a whole, in table order."""
    for check in checks:
        if check.whole is whole:
            yield from check.find(values)


def checks_text() -> str:
    """The documentation's list of the checks across keys (a test keeps the docs equal to it)."""
    lines = [f"- Rules: {c.doc}" for c in RULE_CHECKS]
    lines += [f"- Middleware: {c.doc}" for c in MIDDLEWARE_CHECKS]
    return "\n".join(lines)
