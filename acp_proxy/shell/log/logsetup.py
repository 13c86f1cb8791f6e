"""Logging set-up: structlog configured once, writing to stderr or a log file, never stdout.

Contract: owns where log events go and how they are rendered. stdout is the protocol channel, so
no logger configured here ever writes to it (style.md, "Traps already known": structlog's bytes
logger defaults to stdout). The rest of the shell gets loggers with ``get_logger()``.

Start-up: structlog costs tens of milliseconds to import, and a proxy started with
``--log-level warning`` usually emits nothing. So ``configure_logging`` only opens the log file
and remembers the set-up, and ``get_logger`` returns a small stand-in that drops events below
the level itself; structlog is imported and configured (exactly as it always was, so the output
is byte for byte the same) when the first event at an enabled level is emitted.
"""

from __future__ import annotations

import enum
import functools
import os
import sys
import time
from typing import Any, BinaryIO, TextIO

from acp_proxy.shell.log.logwriter import DROPPED_EVENT, LogWriter, needs_writer

# The numeric levels of the ``logging`` module (and of structlog's filtering loggers).
DEBUG, INFO, WARNING, ERROR, CRITICAL = 10, 20, 30, 40, 50


class LogFormat(enum.StrEnum):
    JSON = "json"
    CONSOLE = "console"


LEVELS: dict[str, int] = {
    "debug": DEBUG,
    "info": INFO,
    "warning": WARNING,
    "error": ERROR,
}

# level: what configure_logging set (debug_enabled); threshold: events below it are dropped
# before structlog is involved (0 until configured: structlog's own defaults then decide);
# setup: the structlog configuration still to apply, (format, stream, colors); file: the log
# file we opened (closed when replaced).
_state: dict[str, Any] = {
    "level": INFO,
    "threshold": 0,
    "setup": None,
    "file": None,
    "format": LogFormat.CONSOLE,
}


def configure_logging(
    level: str = "info",
    fmt: LogFormat | str = LogFormat.CONSOLE,
    log_file: str | None = None,
) -> None:
    """Configure structlog for the whole process (call once, before anything logs).

    Raises ``OSError`` when ``log_file`` cannot be opened for appending or its rules refuse it
    (``recordfile.RecordRefused``: a link, not a regular file or FIFO, someone else's, readable
    by others), ``KeyError`` for an unknown level. A new log file is created ``0600``.
    """
    numeric = LEVELS[level]
    fmt = LogFormat(fmt)
    old = _state["file"]
    stream: BinaryIO | TextIO | LogWriter
    # The log can hold what a record holds (frame contents with --log-frames, the agent's
    # stderr): it is opened by the record file's rules, created 0600 (``recordfile``).
    fd = _open_log_file(log_file) if log_file else None
    if fmt is LogFormat.JSON:
        stream = open(fd, "ab") if fd is not None else sys.stderr.buffer  # noqa: SIM115
        colors = False
    else:
        stream = (
            open(fd, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
            if fd is not None
            else sys.stderr
        )
        # Decided now, as structlog's configuration always was: the terminal, not a later one.
        # NO_COLOR (https://no-color.org): present and not empty turns colours off.
        colors = not log_file and sys.stderr.isatty() and not os.environ.get("NO_COLOR")
    _state["file"] = stream if log_file else None
    _state["format"] = fmt
    fd = _fileno(stream)
    if fd is not None and needs_writer(fd):
        # A pipe, a terminal or a FIFO can stop draining: the session must not wait for it.
        stream = LogWriter(fd, functools.partial(_dropped_line, fmt))
    _state["setup"] = (fmt, stream, colors)
    _state["level"] = numeric
    _state["threshold"] = numeric
    if "structlog" in sys.modules:
        # Already loaded (an earlier configuration was used): reconfigure at once, so loggers
        # that structlog already built never write to the file closed below.
        _structlog()
    if old is not None:
        old.close()


def _open_log_file(path: str) -> int:
    from acp_proxy.shell.record.recordfile import open_log_file

    return open_log_file(path)


def _fileno(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last
        return None


def _dropped_line(fmt: LogFormat, count: int) -> bytes:
    """The line that reports ``count`` dropped log lines, in the log's format (written by the
    writer's thread, so rendered here without structlog)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
    if fmt is LogFormat.JSON:
        import orjson

        event = {"count": count, "event": DROPPED_EVENT, "level": "warning", "timestamp": stamp}
        return orjson.dumps(event) + b"\n"
    return f"{stamp} [warning  ] {DROPPED_EVENT} count={count}\n".encode()


def _structlog() -> Any:
    """The structlog module, with the pending configuration applied (imported on first use)."""
    import structlog

    setup = _state["setup"]
    if setup is None:
        return structlog
    _state["setup"] = None
    fmt, stream, colors = setup
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    wrapper_class = structlog.make_filtering_bound_logger(_state["level"])
    if fmt is LogFormat.JSON:
        import orjson

        structlog.configure(
            processors=[
                *shared,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(serializer=orjson.dumps),
            ],
            wrapper_class=wrapper_class,
            logger_factory=structlog.BytesLoggerFactory(file=stream),
            cache_logger_on_first_use=False,
        )
    else:
        structlog.configure(
            processors=[
                *shared,
                structlog.dev.ConsoleRenderer(colors=colors, sort_keys=False),
            ],
            wrapper_class=wrapper_class,
            # One write per line (``print`` makes two, the line and its newline, when stderr is
            # unbuffered): the agent may share this stderr, and only a single write under
            # PIPE_BUF keeps a line whole between its writes.
            logger_factory=structlog.WriteLoggerFactory(file=stream),
            cache_logger_on_first_use=False,
        )
    return structlog


def debug_enabled() -> bool:
    """True when debug events are emitted (lets the hot path skip building per-frame events)."""
    return bool(_state["level"] <= DEBUG)


class _Logger:
    """What ``get_logger`` returns: structlog's bound logger, built on the first event that
    passes the level. Events below the level return ``None`` at once, as structlog's filtering
    loggers do; every other method and attribute is structlog's own."""

    __slots__ = ("_context", "_real")

    def __init__(self, context: dict[str, Any]) -> None:
        self._context = context
        self._real: Any = None

    def _logger(self) -> Any:
        if self._real is None or _state["setup"] is not None:
            # structlog's lazy proxy reads the current configuration at every event, as the
            # loggers handed out before this stand-in existed did.
            self._real = _structlog().get_logger("acp_proxy", **self._context)
        return self._real

    def bind(self, **values: Any) -> _Logger:
        return _Logger({**self._context, **values})

    def new(self, **values: Any) -> _Logger:
        return _Logger(dict(values))

    def debug(self, *args: Any, **kw: Any) -> Any:
        if _state["threshold"] > DEBUG:
            return None
        return self._logger().debug(*args, **kw)

    def info(self, *args: Any, **kw: Any) -> Any:
        if _state["threshold"] > INFO:
            return None
        return self._logger().info(*args, **kw)

    def warning(self, *args: Any, **kw: Any) -> Any:
        if _state["threshold"] > WARNING:
            return None
        return self._logger().warning(*args, **kw)

    warn = warning

    def error(self, *args: Any, **kw: Any) -> Any:
        if _state["threshold"] > ERROR:
            return None
        return self._logger().error(*args, **kw)

    def exception(self, *args: Any, **kw: Any) -> Any:
        if _state["threshold"] > ERROR:
            return None
        return self._logger().exception(*args, **kw)

    def critical(self, *args: Any, **kw: Any) -> Any:
        if _state["threshold"] > CRITICAL:
            return None
        return self._logger().critical(*args, **kw)

    fatal = critical

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._logger(), name)


def get_logger(**initial: Any) -> Any:
    """A structlog bound logger (``Any``: structlog's filtering loggers are generated classes),
    imported and configured on its first event at an enabled level."""
    return _Logger(dict(initial))


def say_fatal(log: Any, event: str, message: str, **fields: Any) -> None:
    """Say an error that ends the run where the user reads it, once per reader.

    Always on stderr as ``acp-proxy: MESSAGE`` (what an editor shows). Also as a log event when
    the log is for a machine or somewhere else (``--log-format json``, ``--log-file``); not when
    the log is the console on stderr, where the event would print the message a second time.
    """
    log_fatal(log, event, message, **fields)
    print(f"acp-proxy: {message}", file=sys.stderr)


def log_fatal(log: Any, event: str, message: str, **fields: Any) -> None:
    """The log's half of ``say_fatal``, for an error already printed on stderr: an event when
    the log is for a machine or somewhere else (``--log-format json``, ``--log-file``)."""
    if _state["file"] is not None or _state["format"] is LogFormat.JSON:
        log.error(event, error=message, **fields)
