"""The configuration as values: the settings' types and defaults, the error type, the
middleware factories.

Contract: frozen dataclasses and enums that the rest of the proxy reads (the hot path only ever
sees these), ``ConfigError`` (``FILE:LINE: PATH: REASON``, several at once), and the per-connection
factories of the chain's middleware. No parsing, no I/O.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

import orjson

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.base.values import value
from acp_proxy.meta.registry import V1Mode
from acp_proxy.record.settings import RecordConfig
from acp_proxy.wire.chain import Chain, Link, MessageContext, Middleware, Verdict
from acp_proxy.wire.core_settings import (  # the core's; re-exported by acp_proxy.config
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_PARSE_BYTES,
    DEFAULT_MAX_PENDING_REQUESTS,
    CoalesceConfig,
    NonJsonPolicy,
)

if TYPE_CHECKING:
    from acp_proxy.budget.budget_model import Budgets
    from acp_proxy.policy.policy_model import Policy
    from acp_proxy.rules.engine import Rule

# The process-wide bound on bytes held in partial lines and outbound queues.
DEFAULT_MAX_BUFFER_BYTES = 256 * 1024 * 1024
# The budget must leave room for one whole frame plus a few reads beyond it, so one connection's
# legal frame can always complete (the runtime keeps max_frame_bytes + one read in reserve).
BUFFER_SLACK_BYTES = 1024 * 1024


class StderrMode(enum.StrEnum):
    """Where the agent's stderr goes (it is always drained)."""

    PASSTHROUGH = "passthrough"  # copied to the proxy's stderr
    LOG = "log"  # each line becomes a structured log event


@value
class AgentConfig:
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too
    env: Mapping[str, str] = field(default_factory=dict)  # overrides on top of the inherited env
    stderr: StderrMode = StderrMode.PASSTHROUGH
    grace_period_s: float = (
        5.0  # after closing the agent's stdin, before SIGTERM (and again before SIGKILL)
    )
    # Once the agent exited: how long what it wrote, and the errors owed to the client, may
    # take to reach a slow or paused client before the rest is discarded.
    drain_timeout_s: float = 60.0


@value
class TracingConfig:
    """OpenTelemetry traces; the exporter itself is set by the OTEL_* variables."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    enabled: bool = False
    # Give requests that carry no ``params._meta.traceparent`` the proxy span's one.
    inject: bool = False


@value
class UiConfig:
    """The live view (``--ui``): where it is served and its bounds (docs/live-view.md)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    address: str | None = None  # tcp://HOST:PORT; None: off (the command line's --ui wins)
    allow_remote: bool = False  # a non-loopback address (--ui-allow-remote)
    history_bytes: int = 64 * 1024 * 1024  # events held for replay; the oldest go first
    observer_bytes: int = 8 * 1024 * 1024  # one observer's queue; past it, cut off
    max_observers: int = 64  # subscriptions at once


@value
class TlsConfig:
    """TLS of a WebSocket address (docs/remote.md): ``wss://`` listeners serve ``cert`` /
    ``key``; ``--connect wss://`` trusts ``ca`` (default: the system's authorities)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    cert: str | None = None  # PEM certificate chain of a wss:// listener
    key: str | None = None  # its PEM private key
    ca: str | None = None  # PEM authorities that --connect wss:// trusts


@value
class AuthConfig:
    """The bearer token of a WebSocket address (docs/remote.md): what a listener requires in
    the ``Authorization`` header, and what ``--connect ws[s]://`` sends there. Never in a URL,
    a message, a log line or a record."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    token_file: str | None = None  # the token, in a file (surrounding whitespace stripped)
    token_env: str | None = None  # or the name of the environment variable that holds it
    # A listener may accept JWTs instead (or as well): signed by a key of this JWK set, with
    # this issuer and audience.
    jwks_file: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None


@value
class MiddlewareSpec:
    """One entry of the ``middleware:`` list, ready to instantiate per connection."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    name: str
    factory: Callable[[], Middleware]
    fail_closed: bool = False
    # What the file said, for ``explain_config``: "rules" or "pkg.module:Class", and ``with:``.
    use: str = ""
    options: Mapping[str, JsonValue] = field(default_factory=dict)
    line: int | None = None


@value
class Config:
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too
    source: str | None = None  # the file it came from; None for the built-in default
    middleware: tuple[MiddlewareSpec, ...] = ()
    # Directories searched first for the modules of `use:` entries (absolute; middleware_paths).
    middleware_paths: tuple[str, ...] = ()
    v1_mode: V1Mode = V1Mode.SAFE
    v1_max_entities: int = 10_000
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_parse_bytes: int = DEFAULT_MAX_PARSE_BYTES
    max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES
    non_json: NonJsonPolicy = NonJsonPolicy.LOG
    agent: AgentConfig = field(default_factory=AgentConfig)
    coalesce: CoalesceConfig = field(default_factory=CoalesceConfig)
    listen: str | None = None  # tcp://host:port or unix:///path
    connect: str | None = None
    connect_timeout_s: float = 10.0
    max_connections: int = 64
    # --listen: a connection whose first line has not arrived by then is closed.
    handshake_timeout_s: float = 30.0
    # ws:// and wss://: a ping after this many seconds without a frame sent (0: never).
    ws_ping_interval_s: float = 20.0
    # --listen: seconds an agent outlives its client's connection, waiting for a reattach
    # (0: it is stopped when the connection ends); what it sends meanwhile is kept within these.
    detach_grace_s: float = 0.0
    detach_buffer_bytes: int = 4 * 1024 * 1024
    detach_buffer_frames: int = 10_000
    takeover: bool = False  # a reattach may take a session attached to another connection
    allow_remote: bool = False  # listen on a non-loopback address
    metrics_allow_remote: bool = False  # serve metrics on a non-loopback address
    metrics: str | None = None  # tcp://host:port or unix:///path of /metrics
    tracing: TracingConfig = field(default_factory=TracingConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    ui: UiConfig = field(default_factory=UiConfig)  # the live view
    tls: TlsConfig = field(default_factory=TlsConfig)  # wss:// addresses
    auth: AuthConfig = field(default_factory=AuthConfig)  # ws:// and wss:// addresses
    rule_names: tuple[str, ...] = ()  # for the start-up log line
    rules: tuple[Rule, ...] = ()  # the validated rules, in file order
    # The permission policy (docs/policy.md); None: no ``policy:`` section, no policy link.
    policy: Policy | None = None
    # The budgets (docs/budgets.md); None: no ``budgets:`` section, no budgets link.
    budgets: Budgets | None = None
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


@value
class _RulesFactory:
    rules: tuple[Rule, ...]
    v1_mode: V1Mode
    v1_max_entities: int

    def __call__(self) -> Middleware:
        # Imported here: a proxy without rules never loads the rules engine (start-up time).
        from acp_proxy.rules.engine import RulesMiddleware

        # cast: chain.Middleware declares ``name`` as a settable attribute, BaseMiddleware (and so
        # RulesMiddleware) as a read-only property; both satisfy it at run time.
        return cast(
            Middleware,
            RulesMiddleware(self.rules, v1_mode=self.v1_mode, v1_max_entities=self.v1_max_entities),
        )


@value
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


def _quote(text: str) -> str:
    return orjson.dumps(text).decode()


def _size_text(n: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} bytes"


def _json_text(value: JsonValue) -> str:
    return orjson.dumps(value).decode()
