"""Configuration: the YAML rules file, parsed and validated once, up front.

Contract: owns the config file format and its validation. Every error names the file, the line,
the path inside the document (``rules[1].set_meta``) and what would be valid (style.md habit 5).
The hot path only sees the compiled result. Pure apart from reading the one file it is given.

STUB: the dataclasses below are the contract shared with the shell (runtime/cli) and rules.py.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from acp_proxy.annotate import V1Mode
from acp_proxy.chain import Chain, Middleware

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024


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


@dataclass(frozen=True, slots=True)
class MiddlewareSpec:
    """One entry of the ``middleware:`` list, ready to instantiate per connection."""

    name: str
    factory: Callable[[], Middleware]
    fail_closed: bool = False


@dataclass(frozen=True, slots=True)
class Config:
    source: str | None = None  # the file it came from; None for the built-in default
    middleware: tuple[MiddlewareSpec, ...] = ()
    v1_mode: V1Mode = V1Mode.SAFE
    v1_max_entities: int = 10_000
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    non_json: NonJsonPolicy = NonJsonPolicy.LOG
    agent: AgentConfig = field(default_factory=AgentConfig)
    coalesce: CoalesceConfig = field(default_factory=CoalesceConfig)
    listen: str | None = None  # tcp://host:port or unix:///path (issue 5)
    connect: str | None = None
    connect_timeout_s: float = 10.0
    max_connections: int = 64
    allow_remote: bool = False
    rule_names: tuple[str, ...] = ()  # for the start-up log line

    def build_chain(self) -> Chain:
        """A fresh chain (new middleware instances) for one connection."""
        raise NotImplementedError


class ConfigError(Exception):
    """A bad config file: ``str()`` is ``FILE:LINE: PATH: REASON`` (LINE/PATH when known)."""

    def __init__(self, file: str | None, line: int | None, path: str | None, reason: str) -> None:
        self.file, self.line, self.path, self.reason = file, line, path, reason
        where = file or "<config>"
        if line is not None:
            where += f":{line}"
        super().__init__(f"{where}: {path}: {reason}" if path else f"{where}: {reason}")


def load_config(path: str | None, environ: Mapping[str, str]) -> Config:
    """Read and validate ``path`` (``None``: pure pass-through). Raises ``ConfigError``."""
    raise NotImplementedError
