"""The options several commands share, each defined once: its spelling, type and metavar.

Contract: ``SHARED`` (how each shared option is spelled and parsed) and ``add``,
which adds one to a parser or group with the command's own help; ``add_log_options`` (the
``--log-*`` family); and the value types of the command line (``size``, ``positive_int``,
``positive_float``: a bad value is argparse's usage error, exit 2). The main command
(``cli.options``), ``component``, ``show``, ``replay`` and ``policy test`` take their common
options from here, so that an option never parses differently from one command to another; each
command says in its help what the option means there. Imports argparse only when a value is
refused (start-up time: the main command's fast path builds no parser).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    import argparse

    # A parser or one of its groups: what ``add_argument`` is called on.
    Adder = argparse.ArgumentParser | argparse._ArgumentGroup

T = TypeVar("T", int, float)
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("json", "console")


def _refused(message: str) -> Exception:
    import argparse

    return argparse.ArgumentTypeError(message)


def _parsed(parse: Callable[[str], T], text: str, what: str) -> T:
    try:
        return parse(text)
    except ValueError:
        raise _refused(f"not {what}: {text!r}") from None


def _positive(value: int, text: str) -> int:
    if value <= 0:
        raise _refused(f"must be positive: {text!r}")
    return value


def size(text: str) -> int:
    """A positive size: bytes, or with a unit (64MiB, 64mb, 64 MB, 64k)."""
    from acp_proxy.config import parse_size

    value = parse_size(text)
    if value is None:
        raise _refused(
            f"not a size: {text!r} (a byte count, or a size such as 64MiB, 64mb, 64 MB, 64k)"
        )
    return _positive(value, text)


def positive_int(text: str) -> int:
    return _positive(_parsed(int, text, "an integer"), text)


def positive_float(text: str) -> float:
    """A positive, finite number of seconds."""
    value = _parsed(float, text, "a number")
    if not 0 < value < float("inf"):
        raise _refused(f"must be a positive number of seconds: {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    value = _parsed(float, text, "a number")
    if not 0 <= value < float("inf"):
        raise _refused(f"must be a number of seconds, 0 or more: {text!r}")
    return value


# The options of more than one command: how each is spelled and parsed.
SHARED: Final[dict[str, dict[str, Any]]] = {
    "--log-level": {"type": str.lower, "choices": LOG_LEVELS},  # DEBUG, Debug, debug alike
    "--log-format": {"choices": LOG_FORMATS, "default": "console"},
    "--log-file": {"metavar": "FILE"},
    "--log-frames": {"action": "store_true"},
    "--config": {"metavar": "FILE"},
    "--max-frame-bytes": {"metavar": "SIZE", "type": size},
    "--middleware-path": {"metavar": "DIR", "action": "append"},
    "--record": {"metavar": "PATH"},
    "--metrics": {"metavar": "URL"},
    "--ui": {"metavar": "URL"},
    "--session": {"metavar": "N", "type": int},
}


def add(parser: Adder, option: str, help: str, **more: Any) -> None:
    """Add the shared ``option`` (a key of ``SHARED``) with this command's ``help``; ``more``:
    what only this command says (a default, ``required``)."""
    parser.add_argument(option, help=help, **SHARED[option], **more)


def add_log_options(parser: Adder, *, level: str | None, level_help: str) -> None:
    """``--log-level``, ``--log-format``, ``--log-file``, ``--log-frames``; ``level``: the
    default of ``--log-level`` (``None``: the command decides when it is not given)."""
    add(parser, "--log-level", level_help, default=level)
    add(parser, "--log-format", "(default: console)")
    add(parser, "--log-file", "append logs here instead of stderr")
    add(
        parser,
        "--log-frames",
        "debug lines carry each frame's contents, redacted like a record and cut at 2000 "
        "characters (implies --log-level debug)",
    )


__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "SHARED",
    "add",
    "add_log_options",
    "positive_float",
    "positive_int",
    "size",
]
