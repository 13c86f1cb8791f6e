"""The one declarative description of the config file: every key, what it holds, its default.

Contract: ``SETTINGS`` (every top-level setting and section, with its kind, default, bounds and
help), ``RULE_FIELDS`` and ``MIDDLEWARE_FIELDS`` (the keys of one rule and one middleware entry,
and which must be given); the rules across keys are declared next to them, in ``config.checks``.
The parser (``config.parser``) validates from these tables, and ``config.reference`` generates
from them the JSON Schema (``acp-proxy schema``, ``config/acp-proxy.schema.json``) and the docs'
tables. Declarations only: no behaviour. The vocabulary they are written in (``Kind``,
``Setting``, the size grammar) is ``config.kinds``.
"""

from __future__ import annotations

from typing import Final

from acp_proxy.config.kinds import Kind, Setting
from acp_proxy.config.model import StderrMode
from acp_proxy.meta.annotate import V1Mode
from acp_proxy.rules.engine import (
    RuleDirection,
    RuleTarget,
)
from acp_proxy.wire.core_settings import NonJsonPolicy

# --- the schema --------------------------------------------------------------------------------


SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        "rules",
        Kind.RULES,
        "The annotation rules: which messages to annotate, and the `_meta` keys to set or remove.",
    ),
    # Before "middleware": the parser reads the settings in this order, and the directories must
    # be searched before the middleware classes are imported.
    Setting(
        "middleware_paths",
        Kind.DIRECTORIES,
        "Directories searched first for the modules of `use:` entries, relative to the config "
        "file's directory (`--middleware-path` adds more). For code that is not installed: "
        "PYTHONPATH does not reach a proxy installed with pipx, which starts it with `python -E`.",
        attr="middleware_paths",
    ),
    Setting(
        "middleware",
        Kind.MIDDLEWARE,
        "The middleware chain, in order: the built-in `rules` and your own classes "
        "(`use: package.module:Class`).",
    ),
    Setting(
        "v1",
        Kind.SECTION,
        "v1 annotation policy.",
        children=(
            Setting(
                "mode",
                Kind.CHOICE,
                "v1 annotation policy: `safe` (annotate only where no agent metadata can be "
                "lost), `stateful` or `off`.",
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
        "Longest accepted line. A byte count or a size with a unit (`64MiB`, `64mb`, `64k`).",
        attr="max_frame_bytes",
    ),
    Setting(
        "max_buffer_bytes",
        Kind.SIZE,
        "Bytes all connections of the process together may hold in partial lines and outbound "
        "queues. At least `max_frame_bytes` + 1 MiB; when not given, "
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
                "The agent's stderr: `passthrough` (copied to the proxy's stderr unchanged) or "
                "`log` (structured log, redacted). Either way its last lines go with the errors "
                "that answer its requests when it dies.",
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
        "`tcp://HOST:PORT`, `unix:///PATH` or `ws[s]://HOST:PORT/PATH`: accept clients on a "
        "socket or over WebSocket (docs/remote.md). The command line wins.",
        attr="listen",
        listen=True,
        default_doc="stdio",
    ),
    Setting(
        "connect",
        Kind.ADDRESS,
        "`tcp://HOST:PORT`, `unix:///PATH` or `ws[s]://HOST:PORT/PATH`: reach the agent over a "
        "socket or a WebSocket (docs/remote.md). The command line wins.",
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
        "ws_ping_interval",
        Kind.SECONDS,
        "With a `ws://` or `wss://` address (`listen` or `connect`): seconds without a frame "
        "sent after which a WebSocket ping is sent, so that proxies and load balancers on the "
        "way do not close a quiet session (0: never). No pong is awaited.",
        attr="ws_ping_interval_s",
    ),
    Setting(
        "detach_grace",
        Kind.SECONDS,
        "With `listen`: seconds an agent, its running turn and its sessions outlive the client's "
        "connection, waiting for a new connection to reattach with `session/load` (0: the agent "
        "is stopped when the connection ends).",
        attr="detach_grace_s",
    ),
    Setting(
        "detach_buffer_bytes",
        Kind.SIZE,
        "With `detach_grace`: bytes of frames the agent sends while detached that are kept for "
        "the reattach (counted in `max_buffer_bytes`); past it the reattach is refused.",
        attr="detach_buffer_bytes",
        minimum=1,
    ),
    Setting(
        "detach_buffer_frames",
        Kind.INT,
        "With `detach_grace`: frames the agent sends while detached that are kept for the "
        "reattach; past it the reattach is refused.",
        attr="detach_buffer_frames",
        minimum=1,
    ),
    Setting(
        "takeover",
        Kind.BOOL,
        "With `detach_grace`: a reattach may take a session from the connection it is attached "
        "to (that connection is closed); otherwise it is refused with an error.",
        attr="takeover",
    ),
    Setting(
        "allow_remote",
        Kind.BOOL,
        "Allow `listen` on a non-loopback address (anyone who can reach it can drive the agent).",
        attr="allow_remote",
    ),
    Setting(
        "metrics_allow_remote",
        Kind.BOOL,
        "Allow `metrics` on a non-loopback address (anyone who can reach it can read the "
        "metrics and the health of the proxy).",
        attr="metrics_allow_remote",
    ),
    Setting(
        "metrics",
        Kind.ADDRESS,
        "`tcp://HOST:PORT` (or `HOST:PORT`, `http://HOST:PORT`) or `unix:///PATH`: serve "
        "`/metrics`, `/healthz` and `/readyz` there (Prometheus metrics and health probes). "
        "The command line wins.",
        attr="metrics",
        listen=True,
        http=True,
        default_doc="off",
    ),
    Setting(
        "tracing",
        Kind.SECTION,
        "OpenTelemetry traces (needs the `otel` extra, e.g. `pip install '.[otel]'` from a "
        "checkout); the exporter is configured by the standard `OTEL_*` environment variables.",
        attr="tracing",
        children=(
            Setting(
                "enabled",
                Kind.BOOL,
                "A span per JSON-RPC request crossing the proxy, exported over OTLP.",
                attr="enabled",
            ),
            Setting(
                "inject",
                Kind.BOOL,
                "Add the proxy span's `traceparent` to forwarded requests that carry none.",
                attr="inject",
            ),
        ),
    ),
    Setting(
        "record",
        Kind.SECTION,
        "Session records: every frame of a session, both directions, redacted, in a JSON "
        "Lines file.",
        attr="record",
        children=(
            Setting(
                "path",
                Kind.STRING,
                "Record every frame to this JSON Lines file (with `listen`: a directory, or a "
                "name with `{conn}`). `--record` wins.",
                attr="path",
                default_doc="off",
            ),
            Setting(
                "max_bytes",
                Kind.SIZE,
                "Size limit of one record: then recording stops (logged, and a last "
                '`"stopped"` line).',
                attr="max_bytes",
            ),
            Setting(
                "redact",
                Kind.STRINGS,
                "Key names whose values are never recorded or logged, added to the defaults "
                "(`env`, `headers`, `authorization`, `apiKey`, `token`, `password`, `secret`, "
                "`cookie`, `credential(s)`, `privateKey`; any depth, any case, also as a "
                "suffix; also a `{name, value}` pair whose name is one, and a command-line "
                "flag in a list of arguments: `--token X`, `--token=X`, `TOKEN=X`). The shape "
                "is kept: each string and number under the key is replaced.",
                attr="redact",
            ),
            Setting(
                "redact_patterns",
                Kind.REGEXES,
                "Regular expressions for secret-looking strings, added to the defaults "
                "(API keys `sk-...`, GitHub `ghp_...`, Slack, AWS, Google keys, bearer "
                "tokens, JWTs). A pattern whose matching time can explode (a quantifier "
                "inside a quantifier, overlapping alternatives under one, two unbounded "
                "quantifiers in a row over the same characters) is refused.",
                attr="redact_patterns",
            ),
        ),
    ),
    Setting(
        "ui",
        Kind.SECTION,
        "The live view: a web page of the session (timeline, entities, frame detail) and its "
        "read-only event stream for other tools.",
        attr="ui",
        children=(
            Setting(
                "address",
                Kind.ADDRESS,
                "`tcp://HOST:PORT` (or `HOST:PORT`, `http://HOST:PORT`, as for `metrics`): serve "
                "the live view there (loopback only unless `ui.allow_remote`); the URL with its "
                "access token is printed to stderr. `--ui` wins.",
                attr="address",
                listen=True,
                http=True,
                default_doc="off",
            ),
            Setting(
                "allow_remote",
                Kind.BOOL,
                "Allow `ui.address` on a non-loopback address (the token still guards every "
                "request; anyone who has the URL can read the session).",
                attr="allow_remote",
            ),
            Setting(
                "history_bytes",
                Kind.SIZE,
                "Events held for the page and for replays, and the frames not described yet "
                "(at most 16 MiB of them); the oldest go first.",
                attr="history_bytes",
            ),
            Setting(
                "observer_bytes",
                Kind.SIZE,
                "One observer's queue: an observer that falls this far behind is cut off.",
                attr="observer_bytes",
            ),
            Setting(
                "max_observers",
                Kind.INT,
                "Observers (pages and taps) at once; more are refused.",
                attr="max_observers",
                minimum=1,
            ),
        ),
    ),
    Setting(
        "tls",
        Kind.SECTION,
        "TLS of a `wss://` address (docs/remote.md).",
        attr="tls",
        children=(
            Setting(
                "cert",
                Kind.STRING,
                "With `listen: wss://...`: the PEM certificate chain the listener serves.",
                attr="cert",
                default_doc="none",
            ),
            Setting(
                "key",
                Kind.STRING,
                "With `listen: wss://...`: the certificate's PEM private key.",
                attr="key",
                default_doc="none",
            ),
            Setting(
                "ca",
                Kind.STRING,
                "With `connect: wss://...`: PEM authorities to trust for the agent's "
                "certificate (a self-signed one, a private authority).",
                attr="ca",
                default_doc="the system's",
            ),
        ),
    ),
    Setting(
        "auth",
        Kind.SECTION,
        "The bearer token of a `ws://` / `wss://` address: a listener requires it in the "
        "`Authorization` header before the upgrade (required on a non-loopback address); "
        "`connect` sends it there. Never in a URL, a message, a log line or a record "
        "(docs/remote.md).",
        attr="auth",
        children=(
            Setting(
                "token_file",
                Kind.STRING,
                "A file holding the token (surrounding whitespace stripped); keep it private "
                "(mode 0600).",
                attr="token_file",
                default_doc="none",
            ),
            Setting(
                "token_env",
                Kind.STRING,
                "Or the name of the environment variable holding the token.",
                attr="token_env",
                default_doc="none",
            ),
            Setting(
                "jwks_file",
                Kind.STRING,
                "With `listen`: accept bearer JWTs signed by a key of this JWK set (RSA, EC or "
                "OKP public keys; needs the `jwt` extra), with `jwt_issuer` and `jwt_audience`.",
                attr="jwks_file",
                default_doc="none",
            ),
            Setting(
                "jwt_issuer",
                Kind.STRING,
                "With `jwks_file`: the `iss` a JWT must carry.",
                attr="jwt_issuer",
                default_doc="none",
            ),
            Setting(
                "jwt_audience",
                Kind.STRING,
                "With `jwks_file`: the `aud` a JWT must carry.",
                attr="jwt_audience",
                default_doc="none",
            ),
        ),
    ),
    Setting(
        "policy",
        Kind.POLICY,
        "The permission policy: which agent permission requests, file reads and writes, "
        "terminals and mode switches are allowed, refused or left to the editor, and the "
        "audit file of the decisions (docs/policy.md).",
        attr="policy",
    ),
    Setting(
        "budgets",
        Kind.BUDGETS,
        "Limits on what sessions spend (cost, tokens, turns, tool calls, turn seconds, identical "
        "tool calls in a row): warnings, then the next prompt refused or the running turn "
        "cancelled; never a session killed (docs/budgets.md).",
        attr="budgets",
    ),
)
_BY_KEY: Final = {s.key: s for s in SETTINGS}

# The fields of one rules: entry and one middleware: entry. Their defaults come from Rule and
# MiddlewareSpec (``attr``); the checks across keys are ``config.checks``.
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
        required='missing "use": "rules" or an import path such as "mypkg.module:Class"',
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
