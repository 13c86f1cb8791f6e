"""Configuration: the YAML rules file, parsed and validated once, up front.

Contract: owns the config file format and its validation. Every error names the file, the line,
the path inside the document (``rules[1].set_meta``) and what would be valid (style.md habit 5),
and every independent error of a file is reported at once. The hot path only sees the compiled
result. Pure apart from reading the one file it is given and importing the user middleware it
names (both at load time, never per message).

The settings are declared once, in ``SETTINGS`` (issue 14): the parser validates the scalar
settings and their sections from it, and ``json_schema()`` (``acp-proxy schema``) and
``settings_table()`` (the README's table) are generated from it. The fields of a rule and of a
middleware entry are declared in ``RULE_FIELDS`` and ``MIDDLEWARE_FIELDS`` (their key lists and
schema come from there), but their cross-key checks keep hand-written code (_Parser.rule).

A config file is data unless it says otherwise (issue 10): ``use:`` may name only a middleware
class, refused before anything is called (``os:system`` is not one); the YAML is bounded (size,
aliases, nesting) and only the core tags are accepted; the file must be a regular file.

The format (see README.md, "Configuration file", for the user-facing reference)::

    rules:                      # the built-in annotation rules, in file order (config.rules)
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
    max_parse_bytes: INT | "32MiB"
    max_pending_requests: INT
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
    handshake_timeout: SECONDS
    allow_remote: BOOL

String values may use ``${VAR}``, ``${VAR:-default}`` (default when VAR is unset or empty) and
``$$`` (a literal ``$``), expanded once at load time.
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
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import orjson

from acp_proxy.config.rules import (
    KNOWN_UPDATE_KINDS,
    UPSERTS,
    W3C_TRACE_KEYS,
    Rule,
    RuleDirection,
    RulesMiddleware,
    RuleTarget,
    is_glob,
)
from acp_proxy.jsontypes import JsonObject, JsonValue
from acp_proxy.meta.annotate import V1Mode
from acp_proxy.wire.chain import BaseMiddleware, Chain, Link, MessageContext, Middleware, Verdict

if TYPE_CHECKING:
    import yaml
    from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
# Issue 10, "bounded memory" (README "Bounds"): a frame is parsed only when its estimated parsed
# size is at most this; requests awaiting an answer are at most this many per direction.
DEFAULT_MAX_PARSE_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_PENDING_REQUESTS = 10_000
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
    max_parse_bytes: int = DEFAULT_MAX_PARSE_BYTES
    max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES
    non_json: NonJsonPolicy = NonJsonPolicy.LOG
    agent: AgentConfig = field(default_factory=AgentConfig)
    coalesce: CoalesceConfig = field(default_factory=CoalesceConfig)
    listen: str | None = None  # tcp://host:port or unix:///path (issue 5)
    connect: str | None = None
    connect_timeout_s: float = 10.0
    max_connections: int = 64
    # --listen: a connection whose first line has not arrived by then is closed (issue 10).
    handshake_timeout_s: float = 30.0
    allow_remote: bool = False
    rule_names: tuple[str, ...] = ()  # for the start-up log line
    rules: tuple[Rule, ...] = ()  # the validated rules, in file order
    # The line of each top-level key the file sets (for check-config's run checks).
    lines: Mapping[str, int] = field(default_factory=dict, compare=False)

    def build_chain(self) -> Chain:
        """A fresh chain (new middleware instances) for one connection."""
        return Chain([Link(spec.factory(), spec.fail_closed) for spec in self.middleware])


class ConfigError(Exception):
    """A bad config file: ``str()`` is ``FILE:LINE: PATH: REASON`` (LINE/PATH when known).

    A file with several mistakes raises one ``ConfigError`` for all of them: ``errors`` holds
    each (in file order), its fields are the first one's, and ``str()`` has one line per error.
    """

    def __init__(self, file: str | None, line: int | None, path: str | None, reason: str) -> None:
        self.file, self.line, self.path, self.reason = file, line, path, reason
        where = file or "<config>"
        if line is not None:
            where += f":{line}"
        self.message = f"{where}: {path}: {reason}" if path else f"{where}: {reason}"
        self.errors: tuple[ConfigError, ...] = (self,)
        super().__init__(self.message)

    @classmethod
    def all_of(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error standing for ``errors`` (sorted by line; at least one)."""
        ordered = sorted(errors, key=lambda e: (e.line is None, e.line or 0))
        if len(ordered) == 1:
            return ordered[0]
        first = ordered[0]
        combined = cls(first.file, first.line, first.path, first.reason)
        combined.errors = tuple(ordered)
        combined.args = ("\n".join(e.message for e in ordered),)
        return combined

    def messages(self) -> list[str]:
        """One ``FILE:LINE: PATH: REASON`` line per error."""
        return [e.message for e in self.errors]


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


class Kind(enum.Enum):
    """What a setting holds; picks its validation, its JSON schema and its README default."""

    BOOL = "bool"
    INT = "int"
    SIZE = "size"  # bytes: an integer or "64MiB"
    SECONDS = "seconds"
    CHOICE = "choice"  # one value of an enum
    ADDRESS = "address"  # tcp://HOST:PORT or unix:///PATH
    ENV = "env"  # a mapping of environment variable names to strings
    SECTION = "section"  # a mapping of further settings
    RULES = "rules"  # the rules list (validated by _Parser.rules)
    MIDDLEWARE = "middleware"  # the middleware list (validated by _Parser.middleware)
    # Inside a rule or a middleware entry (validated by _Parser.rule / _Parser.middleware_entry):
    STRING = "string"  # a non-empty string
    UPDATE = "update"  # a sessionUpdate kind, "upserts", or a list of them
    META_MAP = "meta_map"  # metadata keys to JSON values (not null)
    META_LIST = "meta_list"  # a list of metadata keys
    OPTIONS = "options"  # keyword arguments (any JSON mapping)
    USE = "use"  # "rules" or "package.module:Class"


@dataclass(frozen=True, slots=True)
class Setting:
    """One key of the config file, declared once (issue 14): the parser validates it from this,
    ``json_schema()`` describes it, and ``settings_table()`` is the README's Settings table."""

    key: str
    kind: Kind
    doc: str  # the README's "meaning" column and the schema's description
    # The dataclass field it fills: on Config, or on the section's dataclass (a section with no
    # attr, like v1, fills Config's fields directly).
    attr: str | None = None
    minimum: int = 0  # INT
    positive: bool = False  # SECONDS: > 0 instead of >= 0
    choices: type[enum.StrEnum] | None = None  # CHOICE
    listen: bool = False  # ADDRESS: port 0 allowed
    children: tuple[Setting, ...] = ()  # SECTION
    default_doc: str | None = None  # README default where the value itself says little


SETTINGS: Final[tuple[Setting, ...]] = (
    Setting("rules", Kind.RULES, "The annotation rules (see Rules above)."),
    Setting("middleware", Kind.MIDDLEWARE, "The middleware chain (see Middleware interface)."),
    Setting(
        "v1",
        Kind.SECTION,
        "v1 annotation policy.",
        children=(
            Setting(
                "mode",
                Kind.CHOICE,
                "v1 annotation policy (above): `safe`, `stateful` or `off`.",
                attr="v1_mode",
                choices=V1Mode,
            ),
            Setting(
                "max_entities",
                Kind.INT,
                "With `stateful`: entities per connection whose metadata is kept (least "
                "recently used forgotten).",
                attr="v1_max_entities",
                minimum=1,
            ),
        ),
    ),
    Setting(
        "max_frame_bytes",
        Kind.SIZE,
        "Longest accepted line. A byte count or a size with a unit (see below).",
        attr="max_frame_bytes",
    ),
    Setting(
        "max_buffer_bytes",
        Kind.SIZE,
        "Bytes all connections of the process together may hold in partial lines and outbound "
        "queues (see [Bounds](#bounds)). At least `max_frame_bytes` + 1 MiB; when not given, "
        "raised to that if `max_frame_bytes` needs it.",
        attr="max_buffer_bytes",
    ),
    Setting(
        "max_parse_bytes",
        Kind.SIZE,
        "Parse budget: a frame whose parse would take more memory than this (estimated from "
        "its size and commas) is forwarded untouched, no rule applied, with a warning.",
        attr="max_parse_bytes",
    ),
    Setting(
        "max_pending_requests",
        Kind.INT,
        "Requests awaiting an answer, per direction; past it a request is answered with a "
        "JSON-RPC error instead of being forwarded.",
        attr="max_pending_requests",
        minimum=1,
    ),
    Setting(
        "non_json",
        Kind.CHOICE,
        "Agent stdout lines that are not JSON: `log` (diverted to the log) or `forward`.",
        attr="non_json",
        choices=NonJsonPolicy,
    ),
    Setting(
        "agent",
        Kind.SECTION,
        "The agent process.",
        attr="agent",
        children=(
            Setting(
                "env",
                Kind.ENV,
                "Variables added to the inherited environment of the agent.",
                attr="env",
            ),
            Setting(
                "stderr",
                Kind.CHOICE,
                "The agent's stderr: `passthrough` (to the proxy's stderr) or `log` "
                "(structured log).",
                attr="stderr",
                choices=StderrMode,
            ),
            Setting(
                "grace_period",
                Kind.SECONDS,
                "Seconds between closing the agent's stdin and SIGTERM, and between SIGTERM "
                "and SIGKILL.",
                attr="grace_period_s",
            ),
            Setting(
                "drain_timeout",
                Kind.SECONDS,
                "After the agent exited: seconds a slow or paused client has to read what the "
                "agent wrote and the errors owed to it, before the rest is discarded (logged).",
                attr="drain_timeout_s",
            ),
        ),
    ),
    Setting(
        "coalesce",
        Kind.SECTION,
        "Coalescing under backpressure.",
        attr="coalesce",
        children=(
            Setting(
                "enabled",
                Kind.BOOL,
                "Merge queued updates only under backpressure.",
                attr="enabled",
            ),
            Setting(
                "max_queue_messages",
                Kind.INT,
                "Bound of the outbound queue, in messages.",
                attr="max_queue_messages",
                minimum=1,
            ),
            Setting(
                "max_queue_bytes",
                Kind.SIZE,
                "Bound of the outbound queue, in bytes (a size, like `max_frame_bytes`).",
                attr="max_queue_bytes",
            ),
            Setting(
                "min_interval_ms",
                Kind.INT,
                "Minimum interval between updates of one entity (0: off).",
                attr="min_interval_ms",
            ),
        ),
    ),
    Setting(
        "listen",
        Kind.ADDRESS,
        "`tcp://HOST:PORT` or `unix:///PATH`: accept clients on a socket. The command line wins.",
        attr="listen",
        listen=True,
        default_doc="stdio",
    ),
    Setting(
        "connect",
        Kind.ADDRESS,
        "`tcp://HOST:PORT` or `unix:///PATH`: reach the agent over a socket. The command line "
        "wins.",
        attr="connect",
        default_doc="spawn",
    ),
    Setting(
        "connect_timeout",
        Kind.SECONDS,
        "Seconds to wait for the agent's address with `connect`.",
        attr="connect_timeout_s",
        positive=True,
    ),
    Setting(
        "max_connections",
        Kind.INT,
        "Concurrent clients with `listen`.",
        attr="max_connections",
        minimum=1,
    ),
    Setting(
        "handshake_timeout",
        Kind.SECONDS,
        "With `listen`: seconds a client has to send its first line before it is closed.",
        attr="handshake_timeout_s",
        positive=True,
    ),
    Setting(
        "allow_remote",
        Kind.BOOL,
        "Allow `listen` on a non-loopback address.",
        attr="allow_remote",
    ),
)
_BY_KEY: Final = {s.key: s for s in SETTINGS}

# The fields of one rules: entry and one middleware: entry. Their defaults come from Rule and
# MiddlewareSpec (``attr``); the checks across keys are the parser's.
RULE_FIELDS: Final[tuple[Setting, ...]] = (
    Setting("name", Kind.STRING, "Shown in logs; unique. Default rules[I]."),
    Setting(
        "match",
        Kind.SECTION,
        "Every condition given must hold.",
        children=(
            Setting(
                "direction",
                Kind.CHOICE,
                "agent_to_client, client_to_agent or both.",
                attr="direction",
                choices=RuleDirection,
            ),
            Setting(
                "method", Kind.STRING, "The JSON-RPC method: an exact name or a glob (session/*)."
            ),
            Setting(
                "update",
                Kind.UPDATE,
                'sessionUpdate kinds of a session/update, or "upserts".',
            ),
        ),
    ),
    Setting(
        "target",
        Kind.CHOICE,
        "entity: the entity's own _meta (a metadata patch); message: params._meta.",
        attr="target",
        choices=RuleTarget,
    ),
    Setting(
        "set_meta",
        Kind.META_MAP,
        "Metadata keys to set (namespaced, or a W3C trace key), with any JSON value but null.",
    ),
    Setting("remove_meta", Kind.META_LIST, "Metadata keys to remove."),
    Setting(
        "overwrite",
        Kind.BOOL,
        "Replace a value the message already carries for a key of set_meta.",
        attr="overwrite",
    ),
)
MIDDLEWARE_FIELDS: Final[tuple[Setting, ...]] = (
    Setting(
        "use",
        Kind.USE,
        'The built-in "rules", or "package.module:Class": a middleware class, imported at '
        "start-up (a config file is as trusted as code).",
    ),
    Setting("with", Kind.OPTIONS, "Keyword arguments of the class's constructor."),
    Setting("name", Kind.STRING, "Shown in logs; unique. Default: the instance's name."),
    Setting(
        "fail_closed",
        Kind.BOOL,
        "If it raises: drop the message (a request gets an error) instead of forwarding it.",
        attr="fail_closed",
    ),
)

TOP_KEYS: Final = tuple(s.key for s in SETTINGS)
RULE_KEYS: Final = tuple(f.key for f in RULE_FIELDS)
MATCH_KEYS: Final = tuple(c.key for c in RULE_FIELDS[1].children)
MIDDLEWARE_KEYS: Final = tuple(f.key for f in MIDDLEWARE_FIELDS)
RULES_ENTRY_KEYS: Final = ("use", "fail_closed")
V1_KEYS: Final = tuple(c.key for c in _BY_KEY["v1"].children)
AGENT_KEYS: Final = tuple(c.key for c in _BY_KEY["agent"].children)
COALESCE_KEYS: Final = tuple(c.key for c in _BY_KEY["coalesce"].children)
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
# Sizes: a byte count with an optional unit, in any case and with or without a space ("64MiB",
# "64mb", "64 MB", "64k"). KB/MB/GB are powers of 1000, KiB/MiB/GiB powers of 1024, and the
# one-letter k/m/g mean KiB/MiB/GiB as in most command-line tools.
_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
_SIZE_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
}
SIZE_HELP: Final = (
    'a size in bytes: a positive integer or a string such as "64MiB" (units B, KB, KiB, MB, '
    "MiB, GB, GiB, or k, m, g for KiB, MiB, GiB; any case)"
)
# The same grammar for the JSON schema (ECMAScript regex, no flags).
SIZE_PATTERN: Final = r"^\s*[0-9]+\s*([bB]|[kKmMgG]|[kKmMgG][bB]|[kKmMgG][iI][bB])?\s*$"


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
            return self.address(node, path, listen=setting.listen)
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


# --- reading the file safely ----------------------------------------------------------------------

# A config file is small: these bounds stop hostile or mistaken input (a YAML "billion laughs", a
# device, a huge file) before it costs memory or time, each with a plain error instead of a
# traceback. Generous for any real config.
MAX_CONFIG_BYTES: Final = 1024 * 1024
MAX_ALIASES: Final = 1000  # alias uses (``*name``) in one file
MAX_ALIAS_NODES: Final = 100_000  # values the aliases add once expanded
MAX_DEPTH: Final = 100  # nesting of mappings and lists
# Explicit tags allowed: the YAML core schema (JSON's types). Anything else (``!!python/...``,
# ``!!binary``, ``!local``) is refused rather than ignored or constructed.
_CORE_TAGS: Final = frozenset(
    _TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map")
)


class _Refused(Exception):
    """A YAML construct the loader refuses; translated into a ConfigError with its line."""

    def __init__(self, mark: Any, reason: str) -> None:  # a yaml.Mark (two classes) or None
        super().__init__(reason)
        self.mark, self.reason = mark, reason


def _import_yaml() -> type[Any]:
    """Import PyYAML on first use and return the bounded loader class.

    Start-up (issue 13): a proxy started without a config file never loads PyYAML; the names
    ``yaml``, ``MappingNode``, ``Node``, ``ScalarNode`` and ``SequenceNode`` become this module's
    globals here, before anything that uses them at run time can run (every use follows a
    parse, and every parse starts here).
    """
    global yaml, MappingNode, Node, ScalarNode, SequenceNode, _loader_class  # noqa: PLW0603
    if _loader_class is not None:
        return _loader_class
    import yaml
    from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

    class _BoundedLoader(yaml.SafeLoader):
        """SafeLoader's composer with bounded aliases and nesting, and only the core tags.

        PyYAML composes an alias as a shared reference to the anchored node, so a few hundred bytes
        can describe billions of values once walked, and ``&a [*a]`` describes an infinite one. Here
        each anchored node's expanded size is measured as it is composed; every alias adds it to a
        budget, and an alias to a node still being composed (a cycle) is refused.
        """

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._aliases = 0
            self._values = 0  # values composed so far, counting each alias at its expanded size
            self._alias_values = 0  # the part the aliases added
            self._sizes: dict[str, int] = {}  # anchor -> expanded size of its node
            self._open: set[str] = set()  # anchors whose node is being composed
            self._depth = 0

        def compose_node(self, parent: Node | None, index: int) -> Node | None:
            event = self.peek_event()  # type: ignore[no-untyped-call]
            if isinstance(event, yaml.AliasEvent):
                anchor = event.anchor
                if anchor in self._open:
                    raise _Refused(
                        event.start_mark,
                        f'recursive alias "*{anchor}": it is inside the value its anchor '
                        f'"&{anchor}" names, so the value would be infinite',
                    )
                if anchor in self._sizes:
                    self._aliases += 1
                    if self._aliases > MAX_ALIASES:
                        raise _Refused(
                            event.start_mark,
                            f"too many aliases: more than {MAX_ALIASES} uses of *name in one file",
                        )
                    size = self._sizes[anchor]
                    self._values += size
                    self._alias_values += size
                    if self._alias_values > MAX_ALIAS_NODES:
                        raise _Refused(
                            event.start_mark,
                            f"the aliases expand to more than {MAX_ALIAS_NODES} values (a YAML "
                            '"billion laughs"?): write the values out, or use fewer nested aliases',
                        )
                return super().compose_node(parent, index)
            tag = getattr(event, "tag", None)
            if tag is not None and tag != "!" and tag not in _CORE_TAGS:
                shown = "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag
                raise _Refused(
                    event.start_mark,
                    f"unknown tag {shown}: only the standard YAML tags (!!str, !!int, !!float, "
                    "!!bool, !!null, !!seq, !!map) are allowed; remove the tag",
                )
            anchor = getattr(event, "anchor", None)
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise _Refused(
                    event.start_mark,
                    f"nested too deeply: more than {MAX_DEPTH} levels of lists and mappings",
                )
            start = self._values
            self._values += 1
            if anchor is not None:
                self._open.add(anchor)
            try:
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
                if anchor is not None:
                    self._open.discard(anchor)
            if anchor is not None:
                self._sizes[anchor] = self._values - start
            return node

    _loader_class = _BoundedLoader
    return _BoundedLoader


_loader_class: type[Any] | None = None


def _mark_char(mark: Any) -> str:
    """The character at a YAML mark (a string buffer), or "" when unknown."""
    buffer, pointer = getattr(mark, "buffer", None), getattr(mark, "pointer", None)
    if isinstance(buffer, str) and isinstance(pointer, int) and 0 <= pointer < len(buffer):
        return buffer[pointer]
    return ""


def _plain_yaml_error(exc: yaml.MarkedYAMLError) -> tuple[Any, str] | None:
    """PyYAML's message in plain words with a hint, and the mark to report it at; None when
    the message is not one we know (then it is shown as PyYAML words it)."""
    problem, context = exc.problem or "", exc.context or ""
    mark, start = exc.problem_mark, exc.context_mark
    column = f" (column {mark.column + 1})" if mark is not None else ""
    since = f" on line {start.line + 1}" if start is not None else ""
    if problem.startswith("found character '\\t' that cannot start any token"):
        return mark, (
            f"a tab character{column}: YAML indents with spaces only; replace the tab with spaces"
        )
    m = re.fullmatch(r"found character '(.)' that cannot start any token", problem)
    if m:
        return mark, (
            f"a value cannot start with {_quote(m.group(1))}{column}: quote the value "
            f'("{m.group(1)}...")'
        )
    if problem.startswith("expected <block end>, but found"):
        kind = "list" if "sequence" in context or "collection" in context else "mapping"
        found = problem.removeprefix("expected <block end>, but found ")
        what = "a list item" if "sequence" in found else "a key"
        return mark, (
            f"bad indentation{column}: {what} that does not line up with the {kind} that "
            f'starts{since}; the keys of one mapping, and the "-" of one list, must start in '
            "the same column"
        )
    if "end of stream" in problem and "quoted scalar" in context:
        quote = _mark_char(start) or '"'
        return start, f"unclosed quote: the string that starts with {quote}{since} never ends"
    m = re.fullmatch(r"expected ',' or '([\]}])', but got '(.*)'", problem)
    if m:
        closing = m.group(1)
        opening = "{" if closing == "}" else "["
        if m.group(2) == "<stream end>":
            return start, f'unclosed "{opening}": it has no matching "{closing}"'
        return mark, (
            f'expected "," or "{closing}"{column} in the "{opening}...{closing}" that starts'
            f'{since}: a missing comma, or a missing "{closing}"?'
        )
    if problem == "mapping values are not allowed here":
        return mark, (
            f'unexpected ":"{column}: quote a value that contains ": " ("a: b"), or check '
            "the indentation of this line"
        )
    if problem == "could not find expected ':'":
        return start, (
            'a line without ":" inside a mapping: write KEY: VALUE (or "- " before a list item)'
        )
    if context == "expected a single document in the stream":
        return mark, 'a second YAML document ("---"): a config file holds one document'
    m = re.fullmatch(r"found undefined alias '(.*)'", problem)
    if m:
        name = m.group(1)
        return mark, f"alias *{name} has no anchor: mark an earlier value with &{name}"
    m = re.fullmatch(r"found duplicate anchor '(.*)'; first occurrence", context)
    if m:
        first = f" (first on line {start.line + 1})" if start is not None else ""
        return mark, f"anchor &{m.group(1)} is defined twice{first}: rename one"
    m = re.fullmatch(r"found unknown escape character '(.*)'", problem)
    if m:
        return mark, (
            f"unknown escape \\{m.group(1)}{column} in a double-quoted string: write \\\\ "
            "for a backslash, or use single quotes"
        )
    return None


def _yaml_error(source: str, exc: yaml.MarkedYAMLError) -> ConfigError:
    plain = _plain_yaml_error(exc)
    if plain is not None:
        at, reason = plain
        at = at or exc.problem_mark or exc.context_mark
        return ConfigError(source, at.line + 1 if at is not None else None, None, reason)
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
    return ConfigError(source, line, None, reason)


def parse_config(
    text: str, source: str, environ: Mapping[str, str], *, instantiate: bool = True
) -> Config:
    """Validate the YAML ``text`` of a config file named ``source``. Raises ``ConfigError``.

    ``instantiate=False`` (``check-config``): user middleware classes are imported and checked
    but never called.
    """
    loader = _import_yaml()(text)
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


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_config_file(path: str) -> bytes:
    """The bytes of the config file at ``path``: a regular file of at most MAX_CONFIG_BYTES.

    A FIFO, device or directory is refused from its ``stat`` without being opened, and the file
    is opened non-blocking (and checked again) so that a path swapped for a FIFO in between
    cannot hang the proxy. Raises ``ConfigError``.
    """

    def refuse(reason: str) -> ConfigError:
        return ConfigError(path, None, None, reason)

    limit = _size_text(MAX_CONFIG_BYTES)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise refuse(f"cannot read the config file: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise refuse(f"the config file is {_kind(st.st_mode)}, not a regular file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise refuse(f"the config file is too large ({st.st_size} bytes; at most {limit})")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise refuse(f"cannot read the config file: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise refuse(f"the config file is {_kind(mode)}, not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise refuse(f"cannot read the config file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > MAX_CONFIG_BYTES:  # it grew after the stat
        raise refuse(f"the config file is too large (more than {limit})")
    return b"".join(chunks)


def writable_by_others(path: str) -> tuple[str, ...]:
    """Warnings when ``path`` or its directory can be changed by other users.

    A config file can name code to import (``use:``), so whoever can write it can run code as
    the proxy's user. A directory with the sticky bit (like /tmp) does not let others replace a
    file they do not own, so only the file's own mode counts there.
    """
    out: list[str] = []
    try:
        mode = os.stat(path).st_mode
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            out.append(f"{path} has mode {stat.filemode(mode)}")
        directory = os.path.dirname(os.path.abspath(path))
        dmode = os.stat(directory).st_mode
        if dmode & (stat.S_IWGRP | stat.S_IWOTH) and not dmode & stat.S_ISVTX:
            out.append(f"its directory {directory} has mode {stat.filemode(dmode)}")
    except OSError:
        pass
    return tuple(out)


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


# --- the JSON schema and the README table, from SETTINGS ---------------------------------------

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
        out["anyOf"] = [
            {"type": "null"},
            {"type": "string", "pattern": "^(tcp://.+:[0-9]+|unix:///.+)$"},
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


def json_schema() -> JsonObject:
    """The JSON schema of the config file (``acp-proxy schema``), generated from SETTINGS,
    RULE_FIELDS and MIDDLEWARE_FIELDS.

    It checks the shape of the file for editors; ``check-config`` checks more (imports, rule
    cross-checks, environment variables, the socket addresses).
    """
    rule = _mapping_schema(RULE_FIELDS, _defaults(Rule(name="")))
    # _Parser.rule: "the rule changes nothing: give set_meta and/or remove_meta".
    rule["anyOf"] = [{"required": ["set_meta"]}, {"required": ["remove_meta"]}]
    middleware = _mapping_schema(
        MIDDLEWARE_FIELDS, _defaults(MiddlewareSpec("", factory=_RulesFactory((), V1Mode.OFF, 1)))
    )
    middleware["required"] = ["use"]
    top = _mapping_schema(SETTINGS, _defaults(Config()))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "acp-proxy configuration file",
        **top,
        "type": ["object", "null"],
        "$defs": {"rule": rule, "middleware": middleware},
    }


def _readme_default(setting: Setting, section: Setting | None) -> str:
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
    return f"`{value}`"


def settings_table() -> str:
    """The README's Settings table (a test keeps the README equal to it)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for setting in SETTINGS:
        if setting.kind in (Kind.RULES, Kind.MIDDLEWARE):
            continue
        if setting.kind is Kind.SECTION:
            for child in setting.children:
                rows.append(
                    f"| `{setting.key}.{child.key}` | {_readme_default(child, setting)} "
                    f"| {child.doc} |"
                )
        else:
            rows.append(f"| `{setting.key}` | {_readme_default(setting, None)} | {setting.doc} |")
    return "\n".join(rows)


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
        f"handshake_timeout {config.handshake_timeout_s:g} s, "
        f"allow_remote: {'yes' if config.allow_remote else 'no'}",
    ]
    return "\n".join(lines)
