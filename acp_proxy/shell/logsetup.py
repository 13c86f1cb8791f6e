"""Logging set-up: structlog configured once, writing to stderr or a log file, never stdout.

Contract: owns where log events go and how they are rendered. stdout is the protocol channel, so
no logger configured here ever writes to it (style.md, "Traps already known": structlog's bytes
logger defaults to stdout). The rest of the shell gets loggers with ``get_logger()``.
"""

from __future__ import annotations

import enum
import logging
import sys
from typing import Any, BinaryIO, TextIO

import orjson
import structlog


class LogFormat(enum.StrEnum):
    JSON = "json"
    CONSOLE = "console"


LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

_state: dict[str, Any] = {"level": logging.INFO, "file": None}


def configure_logging(
    level: str = "info",
    fmt: LogFormat | str = LogFormat.CONSOLE,
    log_file: str | None = None,
) -> None:
    """Configure structlog for the whole process (call once, before anything logs).

    Raises ``OSError`` when ``log_file`` cannot be opened for appending, ``KeyError`` for an
    unknown level.
    """
    numeric = LEVELS[level]
    fmt = LogFormat(fmt)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    old = _state["file"]
    if fmt is LogFormat.JSON:
        binary: BinaryIO = open(log_file, "ab") if log_file else sys.stderr.buffer  # noqa: SIM115
        _state["file"] = binary if log_file else None
        structlog.configure(
            processors=[
                *shared,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(serializer=orjson.dumps),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.BytesLoggerFactory(file=binary),
            cache_logger_on_first_use=False,
        )
    else:
        text: TextIO = (
            open(log_file, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
            if log_file
            else sys.stderr
        )
        _state["file"] = text if log_file else None
        structlog.configure(
            processors=[
                *shared,
                structlog.dev.ConsoleRenderer(
                    colors=not log_file and sys.stderr.isatty(), sort_keys=False
                ),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.PrintLoggerFactory(file=text),
            cache_logger_on_first_use=False,
        )
    _state["level"] = numeric
    if old is not None:
        old.close()


def debug_enabled() -> bool:
    """True when debug events are emitted (lets the hot path skip building per-frame events)."""
    return bool(_state["level"] <= logging.DEBUG)


def get_logger(**initial: Any) -> Any:
    """A structlog bound logger (``Any``: structlog's filtering loggers are generated classes)."""
    return structlog.get_logger("acp_proxy", **initial)
