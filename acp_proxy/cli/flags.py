"""The options several commands share, each defined once: its spelling, type, metavar and help.

Contract: one function an option (or a family of options) that adds it to a given parser or
group, and the value types of the command line (``size``, ``positive_int``, ``positive_float``:
a bad value is argparse's usage error, exit 2). The main command (``cli.options``),
``component``, ``show``, ``replay`` and ``policy test`` take their common options from here, so
that an option never means or parses differently from one command to another; a command passes
its own help text only where the option says something narrower there. Imports argparse only
when a value is refused (start-up time: the main command's fast path builds no parser).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    # A parser or one of its groups: what ``add_argument`` is called on.
    Adder = argparse.ArgumentParser | argparse._ArgumentGroup

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("json", "console")


def _refused(message: str) -> Exception:
    import argparse

    return argparse.ArgumentTypeError(message)


def size(text: str) -> int:
    """A positive size: bytes, or with a unit (64MiB, 64mb, 64 MB, 64k)."""
    from acp_proxy.config import parse_size

    value = parse_size(text)
    if value is None:
        raise _refused(
            f"not a size: {text!r} (a byte count, or a size such as 64MiB, 64mb, 64 MB, 64k)"
        )
    if value <= 0:
        raise _refused(f"must be positive: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _refused(f"not an integer: {text!r}") from None
    if value <= 0:
        raise _refused(f"must be positive: {text!r}")
    return value


def positive_float(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise _refused(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise _refused(f"must be a positive number of seconds: {text!r}")
    return value


def add_config(parser: Adder, help: str, *, required: bool = False) -> None:
    """``--config FILE``: the rules file (YAML)."""
    parser.add_argument("--config", metavar="FILE", required=required, help=help)


def add_log_options(parser: Adder, *, level: str | None, level_help: str) -> None:
    """``--log-level``, ``--log-format``, ``--log-file``, ``--log-frames``; ``level``: the
    default of ``--log-level`` (``None``: the command decides when it is not given)."""
    parser.add_argument(
        "--log-level",
        type=str.lower,  # DEBUG, Debug and debug alike
        choices=LOG_LEVELS,
        default=level,
        help=level_help,
    )
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, default="console", help="(default: console)"
    )
    parser.add_argument("--log-file", metavar="FILE", help="append logs here instead of stderr")
    parser.add_argument(
        "--log-frames",
        action="store_true",
        help="debug lines carry each frame's contents, redacted like a record and cut at "
        "2000 characters (implies --log-level debug)",
    )


def add_max_frame_bytes(parser: Adder, help: str, **more: Any) -> None:
    """``--max-frame-bytes SIZE``: the longest line read (``size``)."""
    parser.add_argument("--max-frame-bytes", type=size, metavar="SIZE", help=help, **more)


def add_middleware_path(parser: Adder, help: str) -> None:
    """``--middleware-path DIR``, repeatable: searched first for the config's ``use:`` modules."""
    parser.add_argument("--middleware-path", action="append", metavar="DIR", help=help)


def add_record(parser: Adder, help: str) -> None:
    """``--record PATH``: record the session's frames."""
    parser.add_argument("--record", metavar="PATH", help=help)


def add_metrics(parser: Adder, help: str) -> None:
    """``--metrics URL``: serve ``/metrics``, ``/healthz`` and ``/readyz``."""
    parser.add_argument("--metrics", metavar="URL", help=help)


def add_ui(parser: Adder, help: str, **more: Any) -> None:
    """``--ui URL``: serve the live view."""
    parser.add_argument("--ui", metavar="URL", help=help, **more)


def add_session(parser: Adder, help: str) -> None:
    """``--session N``: one session of a record file (from 1)."""
    parser.add_argument("--session", metavar="N", type=int, help=help)


__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "add_config",
    "add_log_options",
    "add_max_frame_bytes",
    "add_metrics",
    "add_middleware_path",
    "add_record",
    "add_session",
    "add_ui",
    "positive_float",
    "positive_int",
    "size",
]
