"""Configuration: the YAML rules file, parsed and validated once, up front.

Contract: owns the config file format and its validation. Every error names the file, the line,
the path inside the document (``rules[1].set_meta``) and what would be valid (style.md habit 5).
The hot path only sees the compiled result. Pure apart from reading the one file it is given and
importing the user middleware it names (both at load time, never per message).

The format (see README.md, "Configuration file", for the user-facing reference)::

    rules:                      # the built-in annotation rules, in file order (acp_proxy.rules)
      - name: STR               # optional, unique; shown in logs (default "rules[I]")
        match:                  # optional; every present condition must hold
          direction: agent_to_client | client_to_agent | both     # default both
          method: STR           # exact JSON-RPC method or fnmatch glob ("session/*")
          update: [KIND, ...] | upserts                           # sessionUpdate kinds
        target: entity | message                                  # default entity
        set_meta: {KEY: JSON}   # KEY namespaced ("example.dev/x") or traceparent/tracestate/baggage
        remove_meta: [KEY, ...]
        overwrite: BOOL         # default false: a key the message already sets keeps its value
    middleware:                 # optional; default: just the rules
      - use: rules              # the built-in rules, at this place in the chain
        fail_closed: BOOL
      - use: pkg.module:Class   # imported at load time, instantiated per connection
        with: {...}             # keyword arguments of its constructor
        name: STR               # optional, unique; shown in logs (default: the instance's name)
        fail_closed: BOOL       # default false (fail-open)
    v1: {mode: safe | stateful | off, max_entities: INT}
    max_frame_bytes: INT | "64MiB"
    max_buffer_bytes: INT | "256MiB"   # process-wide, >= max_frame_bytes + 1MiB (default: raised
                                       # to that when max_frame_bytes needs it)
    non_json: log | forward
    agent: {env: {NAME: STR}, stderr: passthrough | log, grace_period: SECONDS,
            drain_timeout: SECONDS}
    coalesce: {enabled: BOOL, max_queue_messages: INT, max_queue_bytes: INT | "16MiB",
               min_interval_ms: INT}
    listen: tcp://HOST:PORT | unix:///PATH
    connect: tcp://HOST:PORT | unix:///PATH
    connect_timeout: SECONDS
    max_connections: INT
    allow_remote: BOOL

String values may use ``${VAR}``, ``${VAR:-default}`` (default when VAR is unset or empty) and
``$$`` (a literal ``$``), expanded once at load time.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import enum
import importlib
import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import orjson
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from acp_proxy.annotate import V1Mode
from acp_proxy.chain import Chain, Link, MessageContext, Middleware, Verdict
from acp_proxy.jsontypes import JsonObject, JsonValue
from acp_proxy.rules import (
    KNOWN_UPDATE_KINDS,
    UPSERTS,
    W3C_TRACE_KEYS,
    Rule,
    RuleDirection,
    RulesMiddleware,
    RuleTarget,
    is_glob,
)

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
# The process-wide bound on bytes held in partial lines and outbound queues (issue 10.3).
DEFAULT_MAX_BUFFER_BYTES = 256 * 1024 * 1024
# The budget must leave room for one whole frame plus a few reads beyond it, so one connection's
# legal frame can always complete (the runtime keeps max_frame_bytes + one read in reserve).
BUFFER_SLACK_BYTES = 1024 * 1024


class NonJsonPolicy(enum.StrEnum):
    """What to do with agent stdout lines that are not JSON."""

    LOG = "log"  # divert to the log with a warning (once per kind, then counted)
    FORWARD = "forward"  # forward them to the client as they are


class StderrMode(enum.StrEnum):
    """Where the agent's stderr goes (it is always drained)."""

    PASSTHROUGH = "passthrough"  # copied to the proxy's stderr
    LOG = "log"  # each line becomes a structured log event


@dataclass(frozen=True, slots=True)
class CoalesceConfig:
    enabled: bool = True
    max_queue_messages: int = 4096
    max_queue_bytes: int = 16 * 1024 * 1024
    min_interval_ms: int = 0


@dataclass(frozen=True, slots=True)
class AgentConfig:
    env: Mapping[str, str] = field(default_factory=dict)  # overrides on top of the inherited env
    stderr: StderrMode = StderrMode.PASSTHROUGH
    grace_period_s: float = (
        5.0  # after closing the agent's stdin, before SIGTERM (and again before SIGKILL)
    )
    # Once the agent exited: how long what it wrote, and the errors owed to the client, may
    # take to reach a slow or paused client before the rest is discarded (issue 9.4).
    drain_timeout_s: float = 60.0


@dataclass(frozen=True, slots=True)
class MiddlewareSpec:
    """One entry of the ``middleware:`` list, ready to instantiate per connection."""

    name: str
    factory: Callable[[], Middleware]
    fail_closed: bool = False
    # What the file said, for ``explain_config``: "rules" or "pkg.module:Class", and ``with:``.
    use: str = ""
    options: Mapping[str, JsonValue] = field(default_factory=dict)
    line: int | None = None


@dataclass(frozen=True, slots=True)
class Config:
    source: str | None = None  # the file it came from; None for the built-in default
    middleware: tuple[MiddlewareSpec, ...] = ()
    v1_mode: V1Mode = V1Mode.SAFE
    v1_max_entities: int = 10_000
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES
    non_json: NonJsonPolicy = NonJsonPolicy.LOG
    agent: AgentConfig = field(default_factory=AgentConfig)
    coalesce: CoalesceConfig = field(default_factory=CoalesceConfig)
    listen: str | None = None  # tcp://host:port or unix:///path (issue 5)
    connect: str | None = None
    connect_timeout_s: float = 10.0
    max_connections: int = 64
    allow_remote: bool = False
    rule_names: tuple[str, ...] = ()  # for the start-up log line
    rules: tuple[Rule, ...] = ()  # the validated rules, in file order

    def build_chain(self) -> Chain:
        """A fresh chain (new middleware instances) for one connection."""
        return Chain([Link(spec.factory(), spec.fail_closed) for spec in self.middleware])


class ConfigError(Exception):
    """A bad config file: ``str()`` is ``FILE:LINE: PATH: REASON`` (LINE/PATH when known)."""

    def __init__(self, file: str | None, line: int | None, path: str | None, reason: str) -> None:
        self.file, self.line, self.path, self.reason = file, line, path, reason
        where = file or "<config>"
        if line is not None:
            where += f":{line}"
        super().__init__(f"{where}: {path}: {reason}" if path else f"{where}: {reason}")


# --- middleware instances --------------------------------------------------------------------


class NamedMiddleware:
    """A user middleware shown under the ``name:`` its config entry gives it."""

    def __init__(self, inner: Middleware, name: str) -> None:
        self.inner = inner
        self.name = name
        self.needles: tuple[bytes, ...] | None = getattr(inner, "needles", None)

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        return self.inner(message, ctx)


@dataclass(frozen=True, slots=True)
class _RulesFactory:
    rules: tuple[Rule, ...]
    v1_mode: V1Mode
    v1_max_entities: int

    def __call__(self) -> Middleware:
        # cast: chain.Middleware declares ``name`` as a settable attribute, BaseMiddleware (and so
        # RulesMiddleware) as a read-only property; both satisfy it at run time.
        return cast(
            Middleware,
            RulesMiddleware(self.rules, v1_mode=self.v1_mode, v1_max_entities=self.v1_max_entities),
        )


@dataclass(frozen=True, slots=True)
class _ImportedFactory:
    target: Callable[..., object]
    kwargs: Mapping[str, JsonValue]
    rename: str | None

    def __call__(self) -> Middleware:
        # A deep copy per connection: a constructor that keeps (and mutates) its options must
        # not share them with other connections.
        instance = self.target(**copy.deepcopy(dict(self.kwargs)))
        assert isinstance(instance, Middleware)  # checked at load time
        if self.rename is not None:
            return NamedMiddleware(instance, self.rename)
        return instance


# --- the schema --------------------------------------------------------------------------------

TOP_KEYS: Final = (
    "rules",
    "middleware",
    "v1",
    "max_frame_bytes",
    "max_buffer_bytes",
    "non_json",
    "agent",
    "coalesce",
    "listen",
    "connect",
    "connect_timeout",
    "max_connections",
    "allow_remote",
)
RULE_KEYS: Final = ("name", "match", "target", "set_meta", "remove_meta", "overwrite")
MATCH_KEYS: Final = ("direction", "method", "update")
MIDDLEWARE_KEYS: Final = ("use", "with", "name", "fail_closed")
RULES_ENTRY_KEYS: Final = ("use", "fail_closed")
V1_KEYS: Final = ("mode", "max_entities")
AGENT_KEYS: Final = ("env", "stderr", "grace_period", "drain_timeout")
COALESCE_KEYS: Final = ("enabled", "max_queue_messages", "max_queue_bytes", "min_interval_ms")
BUILTIN_RULES: Final = "rules"

_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL = (_TAG + t for t in ("str", "int", "float", "bool", "null"))
_TIMESTAMP, _MERGE = _TAG + "timestamp", _TAG + "merge"
_TAG_NAMES: Final = {
    _STR: "a string",
    _INT: "an integer",
    _FLOAT: "a number",
    _BOOL: "a boolean",
    _TIMESTAMP: "a date",
}

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_SIZE = re.compile(r"\s*(\d+)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*")
_SIZE_UNITS: Final = {
    None: 1,
    "B": 1,
    "KB": 1000,
    "KiB": 1024,
    "MB": 1000**2,
    "MiB": 1024**2,
    "GB": 1000**3,
    "GiB": 1024**3,
}
_ADDRESS_HELP = 'an address such as "tcp://127.0.0.1:7777" or "unix:///run/acp.sock"'

_E = TypeVar("_E", bound=enum.StrEnum)


def _join(path: str, key: str) -> str:
    """``rules[0].set_meta`` + ``example.dev/x`` -> ``rules[0].set_meta["example.dev/x"]``."""
    if _IDENT.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{_quote(key)}]"


def _quote(text: str) -> str:
    return orjson.dumps(text).decode()


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


def _size_text(n: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} bytes"


class _Parser:
    """Walks the composed YAML node tree, validating as it converts (one per file)."""

    def __init__(self, source: str, loader: yaml.SafeLoader, environ: Mapping[str, str]) -> None:
        self.source = source
        self.loader = loader
        self.environ = environ

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
                raise self.error(
                    key_node,
                    _join(path, key),
                    _unknown("key", key, valid, f"Valid keys: {', '.join(valid)}"),
                )
            out[key] = (key_node, value_node)
        return out

    def pairs(self, node: MappingNode, path: str) -> list[tuple[ScalarNode, Node]]:
        """A mapping's (key, value) nodes with string keys, merges (``<<``) applied, no dupes."""
        self.loader.flatten_mapping(node)
        seen: dict[str, int] = {}
        out: list[tuple[ScalarNode, Node]] = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag != _STR:
                raise self.error(key_node, path, f"keys must be strings, got {_describe(key_node)}")
            key = key_node.value
            if key in seen:
                raise self.error(
                    key_node,
                    _join(path, key),
                    f'duplicate key "{key}" (first on line {seen[key]})',
                )
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
        expected = (
            'a size in bytes: a positive integer or a string such as "64MiB" '
            "(units B, KB, KiB, MB, MiB, GB, GiB)"
        )
        if isinstance(node, ScalarNode) and node.tag == _INT:
            value = int(self.loader.construct_yaml_int(node))
        elif isinstance(node, ScalarNode) and node.tag == _STR:
            m = _SIZE.fullmatch(self.expand(node, path))
            if m is None:
                raise self.wrong_type(node, path, expected)
            value = int(m.group(1)) * _SIZE_UNITS[m.group(2)]
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
            rule = self.rule(item, f"{path}[{i}]", i)
            if rule.name in names:
                raise self.error(
                    item,
                    f"{path}[{i}].name",
                    f'duplicate rule name "{rule.name}" (also rules[{names[rule.name]}])',
                )
            names[rule.name] = i
            out.append(rule)
        return tuple(out)

    def rule(self, node: Node, path: str, index: int) -> Rule:
        entries = self.mapping(node, path, RULE_KEYS, allow_null=False)
        name = f"rules[{index}]"
        if "name" in entries:
            name = self.string(entries["name"][1], _join(path, "name"))
            if not name:
                raise self.error(entries["name"][1], _join(path, "name"), "must not be empty")
        direction = RuleDirection.BOTH
        method: str | None = None
        kinds: tuple[str, ...] | None = None
        upserts = False
        if "match" in entries:
            mpath = _join(path, "match")
            match = self.mapping(entries["match"][1], mpath, MATCH_KEYS)
            if "direction" in match:
                direction = self.choice(
                    match["direction"][1], _join(mpath, "direction"), RuleDirection
                )
            if "method" in match:
                mnode = match["method"][1]
                method = self.string(
                    mnode, _join(mpath, "method"), expected="a method name or glob"
                )
                if not method:
                    raise self.error(mnode, _join(mpath, "method"), "must not be empty")
            if "update" in match:
                kinds, upserts = self.update_kinds(match["update"][1], _join(mpath, "update"))
                if method is not None and not is_glob(method):
                    allowed = ["session/update"] + (
                        ["session/request_permission"] if upserts else []
                    )
                    if method not in allowed:
                        raise self.error(
                            match["update"][1],
                            _join(mpath, "update"),
                            f'method "{method}" never carries a sessionUpdate: "update" needs '
                            f"method {' or '.join(allowed)} (or no method)",
                        )
        target = RuleTarget.ENTITY
        if "target" in entries:
            target = self.choice(entries["target"][1], _join(path, "target"), RuleTarget)
        overwrite = False
        if "overwrite" in entries:
            overwrite = self.boolean(entries["overwrite"][1], _join(path, "overwrite"))
        set_meta: dict[str, JsonValue] = {}
        if "set_meta" in entries:
            spath = _join(path, "set_meta")
            snode = entries["set_meta"][1]
            if not isinstance(snode, MappingNode):
                raise self.wrong_type(snode, spath, "a mapping of metadata keys to values")
            for key_node, value_node in self.pairs(snode, spath):
                kpath = _join(spath, key_node.value)
                self.meta_key(key_node, kpath)
                value = self.json(value_node, kpath)
                if value is None:
                    raise self.error(
                        value_node,
                        kpath,
                        "null would remove the key: list it under remove_meta instead",
                    )
                set_meta[key_node.value] = value
        remove: list[str] = []
        if "remove_meta" in entries:
            rpath = _join(path, "remove_meta")
            rnode = entries["remove_meta"][1]
            for i, item in enumerate(self.sequence(rnode, rpath, "a list of metadata keys")):
                ipath = f"{rpath}[{i}]"
                key = self.string(item, ipath, expected="a metadata key")
                self.meta_key(item, ipath, key)
                if key in set_meta:
                    raise self.error(
                        item, ipath, f'"{key}" is both in set_meta and remove_meta: keep one'
                    )
                if key not in remove:
                    remove.append(key)
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
            ipath = f"{path}[{i}]"
            entries = self.mapping(item, ipath, MIDDLEWARE_KEYS, allow_null=False)
            if "use" not in entries:
                raise self.error(
                    item,
                    ipath,
                    f'missing "use": "{BUILTIN_RULES}" or an import path such as '
                    '"mypkg.module:Class"',
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
            if name in names:
                where = entries["name"][1] if "name" in entries else unode
                raise self.error(
                    where,
                    _join(ipath, "name"),
                    f'duplicate middleware name "{name}" (also {path}[{names[name]}]); '
                    'give one a distinct "name:"',
                )
            names[name] = i
            out.append((spec, fail_closed, item))
        return out

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
        if not callable(target):
            raise self.error(
                unode,
                upath,
                f'"{use}" is not callable (it is {type(target).__name__}): '
                "expected a middleware class",
            )
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
                "`__call__(message, ctx)` (subclass acp_proxy.chain.BaseMiddleware)",
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
        rename: str | None = None
        if "name" in entries:
            rename = self.string(entries["name"][1], _join(path, "name"))
            if not rename:
                raise self.error(entries["name"][1], _join(path, "name"), "must not be empty")
        name = rename or own_name
        return MiddlewareSpec(
            name=name,
            factory=_ImportedFactory(target, kwargs, rename if rename != own_name else None),
            fail_closed=fail_closed,
            use=use,
            options=kwargs,
            line=unode.start_mark.line + 1,
        )

    def address(self, node: Node, path: str, *, listen: bool) -> str | None:
        value = self.optional_string(node, path, expected=_ADDRESS_HELP)
        if value is None:
            return None
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

    def document(self, root: Node | None) -> Config:
        if root is None:  # an empty file (or only comments): the defaults, no rules
            return Config(source=self.source)
        top = self.mapping(root, "", TOP_KEYS)
        d = Config()
        rules: tuple[Rule, ...] = ()
        chain: list[tuple[MiddlewareSpec | None, bool, Node]] | None = None
        middleware_node: Node | None = None
        v1_mode, v1_max = d.v1_mode, d.v1_max_entities
        agent, coalesce = d.agent, d.coalesce
        max_frame_bytes, non_json = d.max_frame_bytes, d.non_json
        max_buffer_bytes = d.max_buffer_bytes
        max_buffer_node: Node | None = None
        listen, connect, connect_timeout = d.listen, d.connect, d.connect_timeout_s
        max_connections, allow_remote = d.max_connections, d.allow_remote
        for key, (_, node) in top.items():
            if key == "rules":
                rules = self.rules(node, key)
            elif key == "middleware":
                if not (isinstance(node, ScalarNode) and node.tag == _NULL):
                    chain = self.middleware(node, key)
                    middleware_node = node
            elif key == "v1":
                v1 = self.mapping(node, key, V1_KEYS)
                if "mode" in v1:
                    v1_mode = self.choice(v1["mode"][1], "v1.mode", V1Mode)
                if "max_entities" in v1:
                    v1_max = self.integer(v1["max_entities"][1], "v1.max_entities", minimum=1)
            elif key == "agent":
                agent = self.agent(node)
            elif key == "coalesce":
                coalesce = self.coalesce(node)
            elif key == "max_frame_bytes":
                max_frame_bytes = self.size(node, key)
            elif key == "max_buffer_bytes":
                max_buffer_bytes, max_buffer_node = self.size(node, key), node
            elif key == "non_json":
                non_json = self.choice(node, key, NonJsonPolicy)
            elif key == "listen":
                listen = self.address(node, key, listen=True)
            elif key == "connect":
                connect = self.address(node, key, listen=False)
            elif key == "connect_timeout":
                connect_timeout = self.seconds(node, key, positive=True)
            elif key == "max_connections":
                max_connections = self.integer(node, key, minimum=1)
            else:
                assert key == "allow_remote"
                allow_remote = self.boolean(node, key)
        if max_buffer_node is None:
            # Not given: never below what one maximal frame needs.
            max_buffer_bytes = max(max_buffer_bytes, max_frame_bytes + BUFFER_SLACK_BYTES)
        elif max_buffer_bytes < max_frame_bytes + BUFFER_SLACK_BYTES:
            # Otherwise one legal frame could wait forever for budget that never frees up.
            raise self.error(
                max_buffer_node,
                "max_buffer_bytes",
                f"must be at least max_frame_bytes + 1 MiB "
                f"({max_frame_bytes + BUFFER_SLACK_BYTES} bytes), got {max_buffer_bytes}",
            )
        rules_factory = _RulesFactory(rules, v1_mode, v1_max)
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
            if rules and not listed:
                assert middleware_node is not None
                raise self.error(
                    middleware_node,
                    "middleware",
                    f'the rules are defined but not listed here: add "- use: {BUILTIN_RULES}" '
                    "where they should run in the chain",
                )
        return Config(
            source=self.source,
            middleware=tuple(specs),
            v1_mode=v1_mode,
            v1_max_entities=v1_max,
            max_frame_bytes=max_frame_bytes,
            max_buffer_bytes=max_buffer_bytes,
            non_json=non_json,
            agent=agent,
            coalesce=coalesce,
            listen=listen,
            connect=connect,
            connect_timeout_s=connect_timeout,
            max_connections=max_connections,
            allow_remote=allow_remote,
            rule_names=tuple(r.name for r in rules),
            rules=rules,
        )

    def agent(self, node: Node) -> AgentConfig:
        entries = self.mapping(node, "agent", AGENT_KEYS)
        env: dict[str, str] = {}
        stderr = AgentConfig().stderr
        grace = AgentConfig().grace_period_s
        drain = AgentConfig().drain_timeout_s
        if "env" in entries:
            enode = entries["env"][1]
            if not (isinstance(enode, ScalarNode) and enode.tag == _NULL):
                if not isinstance(enode, MappingNode):
                    raise self.wrong_type(
                        enode, "agent.env", "a mapping of variable names to strings"
                    )
                for key_node, value_node in self.pairs(enode, "agent.env"):
                    name = key_node.value
                    vpath = _join("agent.env", name)
                    if not name or "=" in name or "\0" in name:
                        raise self.error(key_node, vpath, f"invalid variable name {_quote(name)}")
                    if isinstance(value_node, ScalarNode) and value_node.tag in (_INT, _FLOAT):
                        env[name] = value_node.value
                    else:
                        env[name] = self.string(value_node, vpath)
                    if "\0" in env[name]:
                        raise self.error(
                            value_node, vpath, "a NUL character cannot be in the environment"
                        )
        if "stderr" in entries:
            stderr = self.choice(entries["stderr"][1], "agent.stderr", StderrMode)
        if "grace_period" in entries:
            grace = self.seconds(entries["grace_period"][1], "agent.grace_period", positive=False)
        if "drain_timeout" in entries:
            drain = self.seconds(entries["drain_timeout"][1], "agent.drain_timeout", positive=False)
        return AgentConfig(env=env, stderr=stderr, grace_period_s=grace, drain_timeout_s=drain)

    def coalesce(self, node: Node) -> CoalesceConfig:
        entries = self.mapping(node, "coalesce", COALESCE_KEYS)
        given: dict[str, Any] = {}  # only the keys present; the rest keep CoalesceConfig defaults
        if "enabled" in entries:
            given["enabled"] = self.boolean(entries["enabled"][1], "coalesce.enabled")
        for key in ("max_queue_messages", "min_interval_ms"):
            if key in entries:
                minimum = 1 if key == "max_queue_messages" else 0
                given[key] = self.integer(entries[key][1], f"coalesce.{key}", minimum=minimum)
        if "max_queue_bytes" in entries:
            given["max_queue_bytes"] = self.size(
                entries["max_queue_bytes"][1], "coalesce.max_queue_bytes"
            )
        return dataclasses.replace(CoalesceConfig(), **given)


def parse_config(text: str, source: str, environ: Mapping[str, str]) -> Config:
    """Validate the YAML ``text`` of a config file named ``source``. Raises ``ConfigError``."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else None
            reason = "invalid YAML"
            if mark is not None:
                reason += f" at column {mark.column + 1}"
            if exc.context and exc.problem and exc.problem.startswith("but "):
                reason += f": {exc.context}, {exc.problem}"  # "expected ..., but found ..."
            else:
                reason += f": {exc.problem or exc.context}"
            if exc.context and exc.problem and not exc.problem.startswith("but "):
                reason += f" ({exc.context}"
                if exc.context_mark is not None and exc.context_mark is not mark:
                    reason += f" that starts on line {exc.context_mark.line + 1}"
                reason += ")"
            raise ConfigError(source, line, None, reason) from exc
        except yaml.YAMLError as exc:
            raise ConfigError(source, None, None, f"invalid YAML: {exc}") from exc
        return _Parser(source, loader, environ).document(root)
    finally:
        loader.dispose()


def load_config(path: str | None, environ: Mapping[str, str]) -> Config:
    """Read and validate ``path`` (``None``: pure pass-through). Raises ``ConfigError``."""
    if path is None:
        return Config()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(
            path, None, None, f"cannot read the config file: {exc.strerror or exc}"
        ) from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(path, line, None, "the file is not valid UTF-8") from exc
    return parse_config(text, path, environ)


# --- explain -------------------------------------------------------------------------------------


def _json_text(value: JsonValue) -> str:
    return orjson.dumps(value).decode()


def _explain_match(rule: Rule) -> str:
    parts = [f"direction {rule.direction.value}"]
    if rule.method is not None:
        parts.append(f"method {rule.method}" + (" (glob)" if is_glob(rule.method) else ""))
    else:
        parts.append("any method")
    if rule.has_update_filter:
        kinds = list(rule.update_kinds or ())
        if rule.update_upserts:
            kinds.insert(0, UPSERTS)
        parts.append("update " + ", ".join(kinds))
    return ", ".join(parts)


def explain_config(config: Config) -> str:
    """A human-readable summary of ``config`` for ``acp-proxy check-config`` (no final newline)."""
    lines = [f"config: {config.source or '(none: pure pass-through)'}"]
    if config.rules:
        lines.append(f"rules ({len(config.rules)}, applied in this order; every match applies):")
        for i, rule in enumerate(config.rules, 1):
            where = f" (line {rule.line})" if rule.line is not None else ""
            lines.append(f"  {i}. {rule.name}{where}")
            lines.append(f"     match: {_explain_match(rule)}")
            target = (
                "entity _meta (metadata patch; v1 per the v1 mode)"
                if rule.target is RuleTarget.ENTITY
                else "message params._meta (plain object)"
            )
            lines.append(f"     target: {target}; overwrite: {'yes' if rule.overwrite else 'no'}")
            for key, value in rule.set_meta.items():
                lines.append(f"     set    {key} = {_json_text(value)}")
            for key in rule.remove_meta:
                lines.append(f"     remove {key}")
    else:
        lines.append("rules: none")
    if config.middleware:
        lines.append("middleware chain (in order):")
        for i, spec in enumerate(config.middleware, 1):
            policy = "fail-closed" if spec.fail_closed else "fail-open"
            if spec.use == BUILTIN_RULES:
                desc = f"rules (built-in, {len(config.rules)} rules)"
            else:
                desc = f"{spec.name} = {spec.use}"
                if spec.options:
                    desc += f" with {_json_text(dict(spec.options))}"
            lines.append(f"  {i}. {desc}; {policy}")
    else:
        lines.append("middleware chain: empty (pure pass-through)")
    agent = config.agent
    env = ", ".join(sorted(agent.env)) if agent.env else "none"
    co = config.coalesce
    lines += [
        "settings:",
        f"  v1: mode {config.v1_mode.value}, max_entities {config.v1_max_entities}",
        f"  max_frame_bytes: {config.max_frame_bytes} ({_size_text(config.max_frame_bytes)})",
        f"  max_buffer_bytes: {config.max_buffer_bytes} ({_size_text(config.max_buffer_bytes)}), "
        "process-wide",
        f"  non_json: {config.non_json.value}",
        f"  agent: stderr {agent.stderr.value}, grace_period {agent.grace_period_s:g} s, "
        f"drain_timeout {agent.drain_timeout_s:g} s, "
        f"env overrides: {env}",
        f"  coalesce: {'enabled' if co.enabled else 'disabled'}, "
        f"max_queue_messages {co.max_queue_messages}, "
        f"max_queue_bytes {co.max_queue_bytes} ({_size_text(co.max_queue_bytes)}), "
        f"min_interval_ms {co.min_interval_ms}",
        f"  listen: {config.listen or '(stdio)'}",
        f"  connect: {config.connect or '(spawn the agent command)'}, "
        f"connect_timeout {config.connect_timeout_s:g} s",
        f"  max_connections: {config.max_connections}, "
        f"allow_remote: {'yes' if config.allow_remote else 'no'}",
    ]
    return "\n".join(lines)
