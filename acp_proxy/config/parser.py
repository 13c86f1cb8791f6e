"""Validation of a loaded config document into a ``Config``, every error at once.

Contract: walks the YAML nodes with the declarative ``SETTINGS`` (``config.schema``) and the rule
and middleware fields; every error names the file, the line, the path (``rules[1].set_meta``) and
what would be valid, with a did-you-mean suggestion; independent errors are all reported. A
``use:`` entry must name a middleware class, checked before anything is called.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import enum
import importlib
import inspect
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from acp_proxy.config.model import (
    BUFFER_SLACK_BYTES,
    Config,
    ConfigError,
    MiddlewareSpec,
    _ImportedFactory,
    _quote,
    _RulesFactory,
)
from acp_proxy.config.reading import _BoundedLoader, _Refused, _yaml_error, read_config_file
from acp_proxy.config.rules import (
    KNOWN_UPDATE_KINDS,
    UPSERTS,
    W3C_TRACE_KEYS,
    Rule,
    RuleDirection,
    RuleTarget,
    is_glob,
)
from acp_proxy.config.schema import (
    _BOOL,
    _ENV_NAME,
    _FLOAT,
    _IDENT,
    _INT,
    _NULL,
    _SIZE,
    _SIZE_UNITS,
    _STR,
    _TAG,
    _TAG_NAMES,
    _TIMESTAMP,
    _USE,
    BUILTIN_RULES,
    MATCH_KEYS,
    MIDDLEWARE_KEYS,
    RULE_KEYS,
    RULES_ENTRY_KEYS,
    SETTINGS,
    SIZE_HELP,
    TOP_KEYS,
    Kind,
    Setting,
)
from acp_proxy.jsontypes import JsonValue
from acp_proxy.record.patterns import backtracking_risk
from acp_proxy.wire.chain import BaseMiddleware, Middleware


def parse_size(text: str) -> int | None:
    """The byte count ``text`` names ("64MiB", "64 mb", "64k", "1024"), or None if it names
    none (a positive value is not checked here)."""
    m = _SIZE.fullmatch(text)
    if m is None:
        return None
    factor = _SIZE_UNITS.get(m.group(2).lower())
    return None if factor is None else int(m.group(1)) * factor


_ADDRESS_HELP = 'an address such as "tcp://127.0.0.1:7777" or "unix:///run/acp.sock"'

_E = TypeVar("_E", bound=enum.StrEnum)


def _join(path: str, key: str) -> str:
    """``rules[0].set_meta`` + ``example.dev/x`` -> ``rules[0].set_meta["example.dev/x"]``."""
    if _IDENT.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{_quote(key)}]"


def _choices(values: Sequence[str]) -> str:
    return ", ".join(_quote(v) for v in values)


def _suggest(word: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, valid, n=1, cutoff=0.6)
    return f'; did you mean "{close[0]}"?' if close else ""


def _unknown(what: str, word: str, valid: Sequence[str], listing: str) -> str:
    """``unknown key "x"; did you mean "y"? Valid keys: ...`` (the question only when close)."""
    suggestion = _suggest(word, valid)
    return f"unknown {what} {_quote(word)}{suggestion or '.'} {listing}"


def _describe(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == _NULL:
        return "null"
    name = _TAG_NAMES.get(node.tag)
    if name is None:
        tag = "!!" + node.tag.removeprefix(_TAG) if node.tag.startswith(_TAG) else node.tag
        return f"a value tagged {tag}"
    return f"{name} ({_quote(node.value) if node.tag == _STR else node.value})"


def _static_name(cls: type) -> str | None:
    """The ``name`` every instance of ``cls`` has, when it can be told without building one:
    BaseMiddleware's (the class name) or a str class attribute; None when __init__ may set it."""
    attr = inspect.getattr_static(cls, "name", None)
    if attr is inspect.getattr_static(BaseMiddleware, "name"):
        return cls.__name__
    return attr if isinstance(attr, str) else None


def _not_a_middleware_class(target: object) -> str | None:
    """Why ``target`` cannot be a middleware class, or None when it can (checked without
    calling anything it defines: no instance is built, no metaclass hook runs)."""
    if not isinstance(target, type):
        if inspect.ismodule(target):
            return "a module"
        if inspect.isroutine(target):
            return "a function" if inspect.isfunction(target) else "a built-in function"
        if callable(target):
            return f"a callable object ({type(target).__name__}), not a class"
        return f"not a class (it is {type(target).__name__})"
    if issubclass(target, BaseMiddleware):
        return None
    mro = [k for k in target.__mro__ if k is not object]
    if not any("__call__" in vars(k) for k in mro):
        return "a class without a `__call__(message, ctx)` method"
    declared = any("name" in vars(k) or "name" in vars(k).get("__annotations__", {}) for k in mro)
    if not declared:
        return "a class without a `name` (declare `name: str` in the class body)"
    return None


class _Parser:
    """Walks the composed YAML node tree, validating as it converts (one per file)."""

    def __init__(
        self,
        source: str,
        loader: yaml.SafeLoader,
        environ: Mapping[str, str],
        *,
        instantiate: bool = True,
    ) -> None:
        self.source = source
        self.loader = loader
        self.environ = environ
        self.instantiate = instantiate  # False for check-config: import, never call
        # Every independent mistake is recorded here and parsing goes on, so that one run
        # reports all of a file's errors (issue 14), not just the first.
        self.errors: list[ConfigError] = []
        self.guessed_names: set[str] = set()  # check-config: middleware names not yet known

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """Record a ``ConfigError`` raised in the block and carry on after it."""
        try:
            yield
        except ConfigError as exc:
            self.errors.extend(exc.errors)

    # -- errors

    def error(self, node: Node, path: str | None, reason: str) -> ConfigError:
        return ConfigError(self.source, node.start_mark.line + 1, path or None, reason)

    def wrong_type(self, node: Node, path: str, expected: str) -> ConfigError:
        return self.error(node, path, f"expected {expected}, got {_describe(node)}")

    # -- containers

    def mapping(
        self, node: Node, path: str, valid: Sequence[str], *, allow_null: bool = True
    ) -> dict[str, tuple[ScalarNode, Node]]:
        """The entries of a mapping with known keys (unknown keys are errors)."""
        if allow_null and isinstance(node, ScalarNode) and node.tag == _NULL:
            return {}
        if not isinstance(node, MappingNode):
            raise self.wrong_type(node, path, f"a mapping with keys {', '.join(valid)}")
        out: dict[str, tuple[ScalarNode, Node]] = {}
        for key_node, value_node in self.pairs(node, path):
            key = key_node.value
            if key not in valid:
                self.errors.append(
                    self.error(
                        key_node,
                        _join(path, key),
                        _unknown("key", key, valid, f"Valid keys: {', '.join(valid)}"),
                    )
                )
                continue
            out[key] = (key_node, value_node)
        return out

    def pairs(self, node: MappingNode, path: str) -> list[tuple[ScalarNode, Node]]:
        """A mapping's (key, value) nodes with string keys, merges (``<<``) applied, no dupes."""
        self.loader.flatten_mapping(node)
        seen: dict[str, int] = {}
        out: list[tuple[ScalarNode, Node]] = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag != _STR:
                self.errors.append(
                    self.error(key_node, path, f"keys must be strings, got {_describe(key_node)}")
                )
                continue
            key = key_node.value
            if key in seen:
                self.errors.append(
                    self.error(
                        key_node,
                        _join(path, key),
                        f'duplicate key "{key}" (first on line {seen[key]})',
                    )
                )
                continue
            seen[key] = key_node.start_mark.line + 1
            out.append((key_node, value_node))
        return out

    def sequence(self, node: Node, path: str, expected: str) -> list[Node]:
        if isinstance(node, ScalarNode) and node.tag == _NULL:
            return []
        if not isinstance(node, SequenceNode):
            raise self.wrong_type(node, path, expected)
        return list(node.value)

    # -- scalars

    def string(self, node: Node, path: str, *, expected: str = "a string") -> str:
        if not isinstance(node, ScalarNode) or node.tag != _STR:
            hint = "; quote it" if isinstance(node, ScalarNode) and node.tag in _TAG_NAMES else ""
            raise self.error(node, path, f"expected {expected}, got {_describe(node)}{hint}")
        return self.expand(node, path)

    def strings(self, node: Node, path: str, *, regex: bool) -> tuple[str, ...]:
        expected = "a list of regular expressions" if regex else "a list of strings"
        out: list[str] = []
        for i, item in enumerate(self.sequence(node, path, expected)):
            value = self.string(item, f"{path}[{i}]")
            if regex:
                try:
                    re.compile(value)
                except re.error as exc:
                    raise self.error(
                        item, f"{path}[{i}]", f"not a regular expression: {exc}"
                    ) from None
                risk = backtracking_risk(value)
                if risk is not None:
                    # It would run on every string of every frame: refused now, not found
                    # when one frame stalls the session.
                    raise self.error(
                        item,
                        f"{path}[{i}]",
                        f"a pattern whose matching time can explode on some text: {risk}; "
                        "rewrite it (a literal prefix, then one character class, as the "
                        "defaults do)",
                    )
            out.append(value)
        return tuple(out)

    def optional_string(self, node: Node, path: str, *, expected: str) -> str | None:
        if isinstance(node, ScalarNode) and node.tag == _NULL:
            return None
        return self.string(node, path, expected=expected)

    def boolean(self, node: Node, path: str) -> bool:
        if not isinstance(node, ScalarNode) or node.tag != _BOOL:
            raise self.wrong_type(node, path, "true or false")
        return bool(self.loader.construct_yaml_bool(node))

    def integer(self, node: Node, path: str, *, minimum: int) -> int:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if not isinstance(node, ScalarNode) or node.tag != _INT:
            raise self.wrong_type(node, path, expected)
        value = int(self.loader.construct_yaml_int(node))
        if value < minimum:
            raise self.error(node, path, f"expected {expected}, got {value}")
        return value

    def seconds(self, node: Node, path: str, *, positive: bool) -> float:
        expected = "a number of seconds " + ("> 0" if positive else ">= 0")
        if not isinstance(node, ScalarNode) or node.tag not in (_INT, _FLOAT):
            raise self.wrong_type(node, path, expected)
        value = float(
            self.loader.construct_yaml_int(node)
            if node.tag == _INT
            else self.loader.construct_yaml_float(node)
        )
        if not math.isfinite(value) or not (value > 0 if positive else value >= 0):
            raise self.error(node, path, f"expected {expected}, got {node.value}")
        return value

    def size(self, node: Node, path: str) -> int:
        expected = SIZE_HELP
        if isinstance(node, ScalarNode) and node.tag == _INT:
            value = int(self.loader.construct_yaml_int(node))
        elif isinstance(node, ScalarNode) and node.tag == _STR:
            parsed = parse_size(self.expand(node, path))
            if parsed is None:
                raise self.wrong_type(node, path, expected)
            value = parsed
        else:
            raise self.wrong_type(node, path, expected)
        if value < 1:
            raise self.error(node, path, f"expected {expected}, got {node.value}")
        return value

    def choice(self, node: Node, path: str, enum_type: type[_E]) -> _E:
        valid = [e.value for e in enum_type]
        if not isinstance(node, ScalarNode) or node.tag != _STR:
            raise self.wrong_type(node, path, f"one of {_choices(valid)}")
        value = self.expand(node, path)
        if value not in valid:
            raise self.error(
                node,
                path,
                f"expected one of {_choices(valid)}, got {_quote(value)}{_suggest(value, valid)}",
            )
        return enum_type(value)

    def json(self, node: Node, path: str) -> JsonValue:
        """Any JSON value (strings expanded); YAML-only values (sets, binary, .inf) are errors."""
        if isinstance(node, MappingNode):
            return {k.value: self.json(v, _join(path, k.value)) for k, v in self.pairs(node, path)}
        if isinstance(node, SequenceNode):
            return [self.json(v, f"{path}[{i}]") for i, v in enumerate(node.value)]
        assert isinstance(node, ScalarNode)
        tag = node.tag
        if tag in (_STR, _TIMESTAMP):  # a date is kept as the text written: JSON has no dates
            return self.expand(node, path)
        if tag == _NULL:
            return None
        if tag == _BOOL:
            return bool(self.loader.construct_yaml_bool(node))
        if tag == _INT:
            return int(self.loader.construct_yaml_int(node))
        if tag == _FLOAT:
            value = float(self.loader.construct_yaml_float(node))
            if not math.isfinite(value):
                raise self.error(node, path, f"{node.value} is not a JSON number")
            return value
        raise self.error(node, path, f"expected a JSON value, got {_describe(node)}")

    # -- environment expansion

    def expand(self, node: ScalarNode, path: str) -> str:
        """Expand ``${VAR}``, ``${VAR:-default}`` and ``$$`` in a string scalar."""
        text: str = node.value
        if "$" not in text:
            return text
        out: list[str] = []
        i = 0
        while True:
            j = text.find("$", i)
            if j < 0:
                out.append(text[i:])
                return "".join(out)
            out.append(text[i:j])
            nxt = text[j + 1 : j + 2]
            if nxt == "$":
                out.append("$")
                i = j + 2
                continue
            if nxt != "{":
                out.append("$")
                i = j + 1
                continue
            end = text.find("}", j + 2)
            if end < 0:
                raise self.error(
                    node, path, f'unterminated "${{" in {_quote(text)} (write "$$" for a "$")'
                )
            body = text[j + 2 : end]
            name, sep, default = body.partition(":-")
            if not _ENV_NAME.fullmatch(name):
                raise self.error(
                    node,
                    path,
                    f'invalid environment reference "${{{body}}}": expected ${{NAME}} or '
                    '${NAME:-default} with NAME made of letters, digits and "_" '
                    '(write "$$" for a "$")',
                )
            value = self.environ.get(name)
            if sep and not value:
                value = default
            if value is None:
                raise self.error(
                    node,
                    path,
                    f"environment variable {name} is not set "
                    f"(set it, or give a default: ${{{name}:-default}})",
                )
            out.append(value)
            i = end + 1

    # -- sections

    def rules(self, node: Node, path: str) -> tuple[Rule, ...]:
        out: list[Rule] = []
        names: dict[str, int] = {}
        for i, item in enumerate(self.sequence(node, path, "a list of rules")):
            rule: Rule | None = None
            with self.collecting():
                rule = self.rule(item, f"{path}[{i}]", i)
            if rule is None:
                continue
            if rule.name in names:
                self.errors.append(
                    self.error(
                        item,
                        f"{path}[{i}].name",
                        f'duplicate rule name "{rule.name}" (also rules[{names[rule.name]}])',
                    )
                )
                continue
            names[rule.name] = i
            out.append(rule)
        return tuple(out)

    def rule(self, node: Node, path: str, index: int) -> Rule | None:
        """The rule at ``path``, or None when it has errors (recorded; each key is checked)."""
        before = len(self.errors)
        entries = self.mapping(node, path, RULE_KEYS, allow_null=False)
        name = f"rules[{index}]"
        if "name" in entries:
            with self.collecting():
                name = self.string(entries["name"][1], _join(path, "name"))
                if not name:
                    raise self.error(entries["name"][1], _join(path, "name"), "must not be empty")
        direction = RuleDirection.BOTH
        method: str | None = None
        kinds: tuple[str, ...] | None = None
        upserts = False
        if "match" in entries:
            mpath = _join(path, "match")
            match: dict[str, tuple[ScalarNode, Node]] = {}
            with self.collecting():
                match = self.mapping(entries["match"][1], mpath, MATCH_KEYS)
            if "direction" in match:
                with self.collecting():
                    direction = self.choice(
                        match["direction"][1], _join(mpath, "direction"), RuleDirection
                    )
            if "method" in match:
                mnode = match["method"][1]
                with self.collecting():
                    method = self.string(
                        mnode, _join(mpath, "method"), expected="a method name or glob"
                    )
                    if not method:
                        raise self.error(mnode, _join(mpath, "method"), "must not be empty")
            if "update" in match:
                with self.collecting():
                    kinds, upserts = self.update_kinds(match["update"][1], _join(mpath, "update"))
                    self.rule_update(match["update"][1], _join(mpath, "update"), method, upserts)
        target = RuleTarget.ENTITY
        if "target" in entries:
            with self.collecting():
                target = self.choice(entries["target"][1], _join(path, "target"), RuleTarget)
        overwrite = False
        if "overwrite" in entries:
            with self.collecting():
                overwrite = self.boolean(entries["overwrite"][1], _join(path, "overwrite"))
        set_meta: dict[str, JsonValue] = {}
        if "set_meta" in entries:
            with self.collecting():
                set_meta = self.set_meta(entries["set_meta"][1], _join(path, "set_meta"))
        remove: list[str] = []
        if "remove_meta" in entries:
            rpath = _join(path, "remove_meta")
            rnode = entries["remove_meta"][1]
            items: list[Node] = []
            with self.collecting():
                items = self.sequence(rnode, rpath, "a list of metadata keys")
            for i, item in enumerate(items):
                ipath = f"{rpath}[{i}]"
                with self.collecting():
                    key = self.string(item, ipath, expected="a metadata key")
                    self.meta_key(item, ipath, key)
                    if key in set_meta:
                        raise self.error(
                            item, ipath, f'"{key}" is both in set_meta and remove_meta: keep one'
                        )
                    if key not in remove:
                        remove.append(key)
        if len(self.errors) > before:
            return None
        if not set_meta and not remove:
            raise self.error(
                node, path, "the rule changes nothing: give set_meta and/or remove_meta"
            )
        return Rule(
            name=name,
            set_meta=set_meta,
            remove_meta=tuple(remove),
            target=target,
            overwrite=overwrite,
            direction=direction,
            method=method,
            update_kinds=kinds,
            update_upserts=upserts,
            line=node.start_mark.line + 1,
        )

    def rule_update(self, node: Node, path: str, method: str | None, upserts: bool) -> None:
        """``match.update`` only goes with a method that can carry a sessionUpdate."""
        if method is None or is_glob(method):
            return
        allowed = ["session/update"] + (["session/request_permission"] if upserts else [])
        if method not in allowed:
            raise self.error(
                node,
                path,
                f'method "{method}" never carries a sessionUpdate: "update" needs '
                f"method {' or '.join(allowed)} (or no method)",
            )

    def set_meta(self, node: Node, path: str) -> dict[str, JsonValue]:
        if not isinstance(node, MappingNode):
            raise self.wrong_type(node, path, "a mapping of metadata keys to values")
        out: dict[str, JsonValue] = {}
        for key_node, value_node in self.pairs(node, path):
            kpath = _join(path, key_node.value)
            with self.collecting():
                self.meta_key(key_node, kpath)
                value = self.json(value_node, kpath)
                if value is None:
                    raise self.error(
                        value_node,
                        kpath,
                        "null would remove the key: list it under remove_meta instead",
                    )
                out[key_node.value] = value
        return out

    def update_kinds(self, node: Node, path: str) -> tuple[tuple[str, ...] | None, bool]:
        valid = sorted(KNOWN_UPDATE_KINDS)
        items: list[tuple[Node, str]]
        if isinstance(node, SequenceNode):
            if not node.value:
                raise self.error(node, path, "must not be empty (omit it to match any message)")
            items = [(n, f"{path}[{i}]") for i, n in enumerate(node.value)]
        else:
            items = [(node, path)]
        kinds: dict[str, None] = {}  # ordered set: as written
        upserts = False
        for item, ipath in items:
            kind = self.string(
                item, ipath, expected=f'"{UPSERTS}" or a list of sessionUpdate kinds'
            )
            if kind == UPSERTS:
                upserts = True
            elif kind in KNOWN_UPDATE_KINDS or kind.startswith("_"):
                kinds[kind] = None
            else:
                raise self.error(
                    item,
                    ipath,
                    _unknown(
                        "sessionUpdate kind",
                        kind,
                        [*valid, UPSERTS],
                        f'Valid: "{UPSERTS}", an extension kind starting with "_", '
                        f"or one of {', '.join(valid)}",
                    ),
                )
        return (tuple(kinds) if kinds else None), upserts

    def meta_key(self, node: ScalarNode | Node, path: str, key: str | None = None) -> None:
        if key is None:
            assert isinstance(node, ScalarNode)
            key = str(node.value)
        if key in W3C_TRACE_KEYS:
            return
        namespace, slash, rest = key.partition("/")
        if not slash or not namespace or not rest:
            bare = key.strip("/") or "name"
            raise self.error(
                node,
                path,
                f"key {_quote(key)} is not namespaced: metadata keys need a namespace, such as "
                f'"example.dev/{bare}" (only the W3C trace keys traceparent, tracestate, '
                "baggage may be bare)",
            )

    def middleware(self, node: Node, path: str) -> list[tuple[MiddlewareSpec | None, bool, Node]]:
        """Entries as (spec, fail_closed, node); spec None marks the built-in rules' place."""
        out: list[tuple[MiddlewareSpec | None, bool, Node]] = []
        names: dict[str, int] = {}
        seen_rules: int | None = None
        for i, item in enumerate(self.sequence(node, path, "a list of middleware entries")):
            with self.collecting():
                seen_rules = self.middleware_entry(
                    item, path, i, names=names, seen_rules=seen_rules, out=out
                )
        return out

    def middleware_entry(
        self,
        item: Node,
        path: str,
        i: int,
        *,
        names: dict[str, int],
        seen_rules: int | None,
        out: list[tuple[MiddlewareSpec | None, bool, Node]],
    ) -> int | None:
        """Check ``middleware[i]`` and append it to ``out``; returns where the rules are listed."""
        ipath = f"{path}[{i}]"
        before = len(self.errors)
        entries = self.mapping(item, ipath, MIDDLEWARE_KEYS, allow_null=False)
        if len(self.errors) > before:  # unknown keys: the entry would be misread
            return seen_rules
        if "use" not in entries:
            raise self.error(
                item,
                ipath,
                f'missing "use": "{BUILTIN_RULES}" or an import path such as "mypkg.module:Class"',
            )
        unode = entries["use"][1]
        upath = _join(ipath, "use")
        use = self.string(unode, upath, expected='"rules" or "package.module:Class"')
        fail_closed = False
        if "fail_closed" in entries:
            fail_closed = self.boolean(entries["fail_closed"][1], _join(ipath, "fail_closed"))
        if use == BUILTIN_RULES:
            for key in entries:
                if key not in RULES_ENTRY_KEYS:
                    raise self.error(
                        entries[key][0],
                        _join(ipath, key),
                        f'the built-in rules take no "{key}": configure them under "rules:" '
                        f"(valid keys here: {', '.join(RULES_ENTRY_KEYS)})",
                    )
            if seen_rules is not None:
                raise self.error(
                    unode, upath, f"the rules are already listed at {path}[{seen_rules}]"
                )
            seen_rules = i
            name = BUILTIN_RULES
            spec = None
        else:
            spec = self.imported(entries, ipath, use, fail_closed)
            name = spec.name
        if name in names and name not in self.guessed_names:
            where = entries["name"][1] if "name" in entries else unode
            raise self.error(
                where,
                _join(ipath, "name"),
                f'duplicate middleware name "{name}" (also {path}[{names[name]}]); '
                'give one a distinct "name:"',
            )
        names[name] = i
        out.append((spec, fail_closed, item))
        return seen_rules

    def imported(
        self, entries: dict[str, tuple[ScalarNode, Node]], path: str, use: str, fail_closed: bool
    ) -> MiddlewareSpec:
        unode = entries["use"][1]
        upath = _join(path, "use")
        if not _USE.fullmatch(use):
            raise self.error(
                unode,
                upath,
                f'expected "{BUILTIN_RULES}" or an import path "package.module:Class", '
                f"got {_quote(use)}{_suggest(use, [BUILTIN_RULES])}",
            )
        module_name, _, attr_path = use.partition(":")
        try:
            target: object = importlib.import_module(module_name)
        except ImportError as exc:
            raise self.error(unode, upath, f'cannot import module "{module_name}": {exc}') from exc
        except Exception as exc:
            raise self.error(
                unode,
                upath,
                f'importing module "{module_name}" raised {type(exc).__name__}: {exc}',
            ) from exc
        owner = module_name
        for part in attr_path.split("."):
            if not hasattr(target, part):
                public = [n for n in dir(target) if not n.startswith("_")]
                raise self.error(
                    unode, upath, f'"{owner}" has no attribute "{part}"{_suggest(part, public)}'
                )
            target = getattr(target, part)
            owner = f"{owner}.{part}" if owner != module_name else f"{module_name}:{part}"
        # Refuse anything that is not a middleware class BEFORE calling it: a config file must
        # not be able to run arbitrary callables (``os:system`` with ``with: {command: ...}``).
        problem = _not_a_middleware_class(target)
        if problem is not None:
            raise self.error(
                unode,
                upath,
                f'"{use}" is {problem}: expected a middleware class '
                "(subclass acp_proxy.middleware.BaseMiddleware)",
            )
        assert isinstance(target, type)
        kwargs: dict[str, JsonValue] = {}
        wnode: Node = unode
        wpath = _join(path, "with")
        if "with" in entries:
            wnode = entries["with"][1]
            if not (isinstance(wnode, ScalarNode) and wnode.tag == _NULL):
                if not isinstance(wnode, MappingNode):
                    raise self.wrong_type(wnode, wpath, "a mapping of constructor arguments")
                value = self.json(wnode, wpath)
                assert isinstance(value, dict)
                kwargs = value
        try:
            signature: inspect.Signature | None = inspect.signature(target)
        except (TypeError, ValueError):
            signature = None
        if signature is not None:
            try:
                signature.bind(**kwargs)
            except TypeError as exc:
                params = ", ".join(
                    p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                    for p in signature.parameters.values()
                )
                raise self.error(
                    wnode,
                    wpath,
                    f"{use} does not accept these options: {exc} (its parameters: {params})",
                ) from exc
        rename: str | None = None
        if "name" in entries:
            rename = self.string(entries["name"][1], _join(path, "name"))
            if not rename:
                raise self.error(entries["name"][1], _join(path, "name"), "must not be empty")
        if not self.instantiate:
            # check-config: the class is imported and its options checked against its
            # signature, but it is never called. A name only __init__ sets is unknown then:
            # the class name stands in for it, and it is not checked for duplicates (the run
            # checks it), so that check-config never refuses what the run accepts.
            name = rename or _static_name(target) or target.__name__
            if not rename and _static_name(target) is None:
                self.guessed_names.add(name)
            return MiddlewareSpec(
                name=name,
                factory=_ImportedFactory(target, kwargs, rename),
                fail_closed=fail_closed,
                use=use,
                options=kwargs,
                line=unode.start_mark.line + 1,
            )
        # Build one instance now so that a constructor that rejects its options fails at
        # start-up, not on the first connection.
        try:
            instance = target(**copy.deepcopy(kwargs))
        except Exception as exc:
            raise self.error(
                wnode, wpath, f"{use}(...) raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(instance, Middleware):
            raise self.error(
                unode,
                upath,
                f"{use} did not build a middleware: it needs a str `name` and "
                "`__call__(message, ctx)` (subclass acp_proxy.middleware.BaseMiddleware)",
            )
        own_name = getattr(instance, "name", None)
        if not isinstance(own_name, str):
            raise self.error(unode, upath, f"{use}: `name` must be a str, got {own_name!r}")
        needles = getattr(instance, "needles", None)
        if needles is not None and (
            not isinstance(needles, tuple | list) or not all(isinstance(n, bytes) for n in needles)
        ):
            raise self.error(
                unode, upath, f"{use}: `needles` must be None or a tuple of bytes, got {needles!r}"
            )
        name = rename or own_name
        return MiddlewareSpec(
            name=name,
            factory=_ImportedFactory(target, kwargs, rename if rename != own_name else None),
            fail_closed=fail_closed,
            use=use,
            options=kwargs,
            line=unode.start_mark.line + 1,
        )

    def address(self, node: Node, path: str, *, listen: bool, metrics: bool = False) -> str | None:
        value = self.optional_string(node, path, expected=_ADDRESS_HELP)
        if value is None:
            return None
        if metrics:  # also HOST:PORT and http://HOST:PORT (telemetry.endpoint)
            from acp_proxy.telemetry.endpoint import metrics_url

            value = metrics_url(value)
        scheme, sep, rest = value.partition("://")
        ok = False
        if sep and scheme == "unix":
            ok = bool(rest)
        elif sep and scheme == "tcp":
            host, colon, port = rest.rpartition(":")
            if host.startswith("[") and host.endswith("]"):
                host = host[1:-1]
            ok = (
                bool(colon and host and port.isdigit())
                and (0 if listen else 1) <= int(port) <= 65535
            )
        if not ok:
            raise self.error(node, path, f"expected {_ADDRESS_HELP}, got {_quote(value)}")
        return value

    def setting(self, node: Node, path: str, setting: Setting) -> object:
        """The value of a scalar-kind ``setting`` (BOOL ... ENV) at ``path``."""
        kind = setting.kind
        if kind is Kind.BOOL:
            return self.boolean(node, path)
        if kind is Kind.INT:
            return self.integer(node, path, minimum=setting.minimum)
        if kind is Kind.SIZE:
            return self.size(node, path)
        if kind is Kind.SECONDS:
            return self.seconds(node, path, positive=setting.positive)
        if kind is Kind.CHOICE:
            assert setting.choices is not None
            return self.choice(node, path, setting.choices)
        if kind is Kind.ADDRESS:
            value = self.address(
                node, path, listen=setting.listen, metrics=setting.key == "metrics"
            )
            return value
        if kind is Kind.STRING:
            return self.string(node, path)
        if kind in (Kind.STRINGS, Kind.REGEXES):
            return self.strings(node, path, regex=kind is Kind.REGEXES)
        assert kind is Kind.ENV, kind
        return self.env(node, path)

    def section(self, node: Node, path: str, setting: Setting) -> dict[str, object]:
        """A SECTION's given settings, as {dataclass field: value}; each error recorded."""
        entries = self.mapping(node, path, [c.key for c in setting.children])
        out: dict[str, object] = {}
        for child in setting.children:
            if child.key in entries:
                assert child.attr is not None
                with self.collecting():
                    out[child.attr] = self.setting(
                        entries[child.key][1], _join(path, child.key), child
                    )
        return out

    def document(self, root: Node | None) -> Config:
        if root is None:  # an empty file (or only comments): the defaults, no rules
            return Config(source=self.source)
        top = self.mapping(root, "", TOP_KEYS)
        d = Config()
        rules: tuple[Rule, ...] = ()
        chain: list[tuple[MiddlewareSpec | None, bool, Node]] | None = None
        middleware_node: Node | None = None
        middleware_ok = True
        changes: dict[str, Any] = {}  # Config fields the file sets
        for setting in SETTINGS:
            if setting.key not in top:
                continue
            key, node = setting.key, top[setting.key][1]
            before = len(self.errors)
            with self.collecting():
                if setting.kind is Kind.RULES:
                    rules = self.rules(node, key)
                elif setting.kind is Kind.MIDDLEWARE:
                    if not (isinstance(node, ScalarNode) and node.tag == _NULL):
                        middleware_node = node
                        chain = self.middleware(node, key)
                elif setting.kind is Kind.SECTION:
                    given = self.section(node, key, setting)
                    if setting.attr is None:  # v1: its settings are Config's own fields
                        changes.update(given)
                    else:
                        changes[setting.attr] = dataclasses.replace(
                            getattr(d, setting.attr), **given
                        )
                else:
                    assert setting.attr is not None
                    changes[setting.attr] = self.setting(node, key, setting)
            if setting.kind is Kind.MIDDLEWARE and len(self.errors) > before:
                middleware_ok = False
        self._buffer_bound(top, changes, d)
        rules_factory = _RulesFactory(
            rules,
            changes.get("v1_mode", d.v1_mode),
            changes.get("v1_max_entities", d.v1_max_entities),
        )
        specs: list[MiddlewareSpec] = []
        if chain is None:
            if rules:
                specs.append(MiddlewareSpec(BUILTIN_RULES, rules_factory, use=BUILTIN_RULES))
        else:
            listed = False
            for spec, fail_closed, item in chain:
                if spec is None:
                    listed = True
                    specs.append(
                        MiddlewareSpec(
                            BUILTIN_RULES,
                            rules_factory,
                            fail_closed,
                            use=BUILTIN_RULES,
                            line=item.start_mark.line + 1,
                        )
                    )
                else:
                    specs.append(spec)
            # Only when every entry was read: a broken "- use: rules" entry is not a missing one.
            if rules and not listed and middleware_ok:
                assert middleware_node is not None
                self.errors.append(
                    self.error(
                        middleware_node,
                        "middleware",
                        f'the rules are defined but not listed here: add "- use: {BUILTIN_RULES}" '
                        "where they should run in the chain",
                    )
                )
        return Config(
            source=self.source,
            middleware=tuple(specs),
            rule_names=tuple(r.name for r in rules),
            rules=rules,
            lines={k: key_node.start_mark.line + 1 for k, (key_node, _) in top.items()},
            **changes,
        )

    def _buffer_bound(self, top: Any, changes: dict[str, Any], d: Config) -> None:
        """``max_buffer_bytes`` leaves room for one whole frame and a few reads (issue 10): the
        runtime keeps ``max_frame_bytes`` + one read in reserve, so a legal frame always
        completes. Not given: raised to that minimum; given below it: an error."""
        frame = changes.get("max_frame_bytes", d.max_frame_bytes)
        if "max_buffer_bytes" not in changes:
            changes["max_buffer_bytes"] = max(d.max_buffer_bytes, frame + BUFFER_SLACK_BYTES)
        elif changes["max_buffer_bytes"] < frame + BUFFER_SLACK_BYTES:
            self.errors.append(
                self.error(
                    top["max_buffer_bytes"][1],
                    "max_buffer_bytes",
                    f"must be at least max_frame_bytes + 1 MiB "
                    f"({frame + BUFFER_SLACK_BYTES} bytes), got {changes['max_buffer_bytes']}",
                )
            )

    def env(self, node: Node, path: str) -> dict[str, str]:
        env: dict[str, str] = {}
        if isinstance(node, ScalarNode) and node.tag == _NULL:
            return env
        if not isinstance(node, MappingNode):
            raise self.wrong_type(node, path, "a mapping of variable names to strings")
        for key_node, value_node in self.pairs(node, path):
            name = key_node.value
            vpath = _join(path, name)
            with self.collecting():
                if not name or "=" in name or "\0" in name:
                    raise self.error(key_node, vpath, f"invalid variable name {_quote(name)}")
                if isinstance(value_node, ScalarNode) and value_node.tag in (_INT, _FLOAT):
                    value = value_node.value
                else:
                    value = self.string(value_node, vpath)
                if "\0" in value:
                    raise self.error(
                        value_node, vpath, "a NUL character cannot be in the environment"
                    )
                env[name] = value
        return env


def parse_config(
    text: str, source: str, environ: Mapping[str, str], *, instantiate: bool = True
) -> Config:
    """Validate the YAML ``text`` of a config file named ``source``. Raises ``ConfigError``.

    ``instantiate=False`` (``check-config``): user middleware classes are imported and checked
    but never called.
    """
    loader = _BoundedLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except _Refused as exc:
            line = exc.mark.line + 1 if exc.mark is not None else None
            raise ConfigError(source, line, None, exc.reason) from None
        except yaml.MarkedYAMLError as exc:
            raise _yaml_error(source, exc) from exc
        except yaml.YAMLError as exc:
            raise ConfigError(source, None, None, f"invalid YAML: {exc}") from exc
        parser = _Parser(source, loader, environ, instantiate=instantiate)
        try:
            config = parser.document(root)
        except ConfigError as exc:  # a mistake that stops the walk: reported with the others
            parser.errors.extend(exc.errors)
        if parser.errors:
            raise ConfigError.all_of(parser.errors)
        return config
    finally:
        loader.dispose()


def load_config(
    path: str | None, environ: Mapping[str, str], *, instantiate: bool = True
) -> Config:
    """Read and validate ``path`` (``None``: pure pass-through). Raises ``ConfigError``."""
    if path is None:
        return Config()
    data = read_config_file(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(path, line, None, "the file is not valid UTF-8") from exc
    return parse_config(text, path, environ, instantiate=instantiate)
