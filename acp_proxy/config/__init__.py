"""Configuration: the YAML rules file, parsed and validated once, up front (the public face).

Contract: owns the config file format and its validation. Every error names the file, the line,
the path inside the document (``rules[1].set_meta``) and what would be valid (style.md habit 5),
and every independent error of a file is reported at once. The hot path only sees the compiled
result. Pure apart from reading the one file it is given and importing the user middleware it
names (both at load time, never per message).

The format is declared once (``schema``: ``SETTINGS``, ``RULE_FIELDS``, ``MIDDLEWARE_FIELDS``;
``checks``: the rules across the keys of one rule or middleware entry): the parser validates from
these tables, and ``json_schema()`` (``acp-proxy schema``), ``settings_table()`` and
``checks_text()`` (the docs) are generated from them (``reference``). The parser's rooms:
``reading`` (the file, safely, into YAML nodes), ``nodes`` (a node into a value, with its
position), ``imports`` (``use:`` classes), ``parser`` (the document into a ``Config``).

A config file is data unless it says otherwise: ``use:`` may name only a middleware
class, refused before anything is called (``os:system`` is not one); the YAML is bounded (size,
aliases, nesting) and only the core tags are accepted; the file must be a regular file.

The format (docs/configuration.md is the user-facing reference)::

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
    listen: tcp://HOST:PORT | unix:///PATH | ws[s]://HOST:PORT/PATH
    connect: tcp://HOST:PORT | unix:///PATH | ws[s]://HOST:PORT/PATH
    connect_timeout: SECONDS
    max_connections: INT
    handshake_timeout: SECONDS
    ws_ping_interval: SECONDS          # ws:// and wss://: a ping after that long without a frame
    detach_grace: SECONDS              # with listen: keep an agent after its client left
    detach_buffer_bytes: INT | "4MiB"
    detach_buffer_frames: INT
    takeover: BOOL
    allow_remote: BOOL
    metrics_allow_remote: BOOL
    metrics: tcp://HOST:PORT | unix:///PATH | HOST:PORT | http://HOST:PORT
    tracing: {enabled: BOOL, inject: BOOL}
    tls: {cert: FILE, key: FILE, ca: FILE}          # wss:// (docs/remote.md)
    auth: {token_file: FILE, token_env: NAME}       # ws:// and wss:// bearer token

String values may use ``${VAR}``, ``${VAR:-default}`` (default when VAR is unset or empty) and
``$$`` (a literal ``$``), expanded once at load time.

The rooms of this package: ``model`` (the values: ``Config`` and its sections, ``ConfigError``),
``schema`` (the declarative ``SETTINGS`` table, written with ``kinds``: ``Kind``, ``Setting``,
the size grammar), ``reference`` (what is generated from it: the
JSON Schema, the docs' settings table), ``reading`` (the file and the YAML, safely), ``parser``
(validation, every error at once), ``explain`` (``check-config``'s text) and ``rules`` (the
built-in rules middleware). Import from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from acp_proxy.config.model import (
    BUFFER_SLACK_BYTES,
    DEFAULT_MAX_BUFFER_BYTES,
    AgentConfig,
    AuthConfig,
    Config,
    ConfigError,
    MiddlewareSpec,
    NamedMiddleware,
    StderrMode,
    TlsConfig,
    TracingConfig,
    UiConfig,
)
from acp_proxy.wire.core_settings import (
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_PARSE_BYTES,
    DEFAULT_MAX_PENDING_REQUESTS,
    CoalesceConfig,
    NonJsonPolicy,
)

if TYPE_CHECKING:
    from acp_proxy.config.checks import checks_text
    from acp_proxy.config.explain import explain_config
    from acp_proxy.config.kinds import Kind, Setting
    from acp_proxy.config.nodes import parse_size
    from acp_proxy.config.parser import parse_config
    from acp_proxy.config.reading import read_config_file, writable_by_others
    from acp_proxy.config.reference import json_schema, settings_table
    from acp_proxy.config.schema import (
        MATCH_KEYS,
        MIDDLEWARE_FIELDS,
        RULE_FIELDS,
        RULE_KEYS,
        SETTINGS,
        TOP_KEYS,
    )

# Start-up: the modules that need PyYAML (``parser``, ``reading``), ``explain`` and the
# settings table (``schema``) are imported on first use, so a proxy started without a config
# file loads none of them.
_LAZY = {
    **dict.fromkeys(
        (
            "MATCH_KEYS",
            "MIDDLEWARE_FIELDS",
            "RULE_FIELDS",
            "RULE_KEYS",
            "SETTINGS",
            "TOP_KEYS",
        ),
        "acp_proxy.config.schema",
    ),
    **dict.fromkeys(("Kind", "Setting"), "acp_proxy.config.kinds"),
    "json_schema": "acp_proxy.config.reference",
    "settings_table": "acp_proxy.config.reference",
    "checks_text": "acp_proxy.config.checks",
    "explain_config": "acp_proxy.config.explain",
    "parse_config": "acp_proxy.config.parser",
    "parse_size": "acp_proxy.config.nodes",
    "read_config_file": "acp_proxy.config.reading",
    "writable_by_others": "acp_proxy.config.reading",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'acp_proxy.config' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def load_config(
    path: str | None, environ: Mapping[str, str], *, instantiate: bool = True
) -> Config:
    """Read and validate ``path`` (``None``: pure pass-through, without loading PyYAML).
    Raises ``ConfigError``."""
    if path is None:
        return Config()
    from acp_proxy.config.parser import load_config as load

    return load(path, environ, instantiate=instantiate)


__all__ = [
    "BUFFER_SLACK_BYTES",
    "DEFAULT_MAX_BUFFER_BYTES",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_PARSE_BYTES",
    "DEFAULT_MAX_PENDING_REQUESTS",
    "MATCH_KEYS",
    "MIDDLEWARE_FIELDS",
    "RULE_FIELDS",
    "RULE_KEYS",
    "SETTINGS",
    "TOP_KEYS",
    "AgentConfig",
    "AuthConfig",
    "CoalesceConfig",
    "Config",
    "ConfigError",
    "Kind",
    "MiddlewareSpec",
    "NamedMiddleware",
    "NonJsonPolicy",
    "Setting",
    "StderrMode",
    "TlsConfig",
    "TracingConfig",
    "UiConfig",
    "checks_text",
    "explain_config",
    "json_schema",
    "load_config",
    "parse_config",
    "parse_size",
    "read_config_file",
    "settings_table",
    "writable_by_others",
]
