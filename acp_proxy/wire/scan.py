"""One scan of a block of lines: which lines need the per-line path, and how many lines there are.

Contract: a pure function, ``scan(raw, needles) -> (lines, specials)``, with two implementations
of the same contract: ``scan_py`` here, and the optional C accelerator ``acp_proxy.wire._scan``
(built from ``_scan.c`` by setup.py when a C compiler is present). ``scan`` is the C one when it
imports and ``ACP_PROXY_PURE_PYTHON`` is not set to ``1`` (read once, at import); ``SCANNER``
says which one is active and why (``acp-proxy --version`` prints it). No I/O beyond reading that
environment variable at import.

``raw`` is a ``Block``'s bytes (complete lines joined with ``\\n``, no final ``\\n``); its lines
are ``raw.split(b"\\n")`` and ``lines`` is their number (``raw.count(b"\\n") + 1``). ``specials``
lists, in order, ``(index, start, stop)`` of each line ``raw[start:stop]`` (the ``index``-th) that
does not start with ``{"`` (a batch, a blank or whitespace line, non-JSON output, a frame with
something before its opener) or that contains one of ``needles`` (an empty needle occurs in every
line; a needle holding ``\\n`` in none). Every other line starts like a JSON object and holds no
needle: the block path (``acp_proxy.wire.blocks``) forwards runs of them whole (pass-through
speed).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

# The newline before a line that does not start like ``{"``.
_ODD_LINE = re.compile(rb'\n(?!\{")')

ScanResult = tuple[int, list[tuple[int, int, int]]]


def scan_py(raw: bytes, needles: tuple[bytes, ...]) -> ScanResult:
    """The pure-Python scan: one ``bytes.find`` pass per needle and about two ``count`` passes.

    ``bytes.find`` / ``count`` run in C, so a few passes over the block beat any per-line
    Python loop; the line of each hit is found from the hit (the newlines around it).
    """
    find = raw.find
    hits: list[int] = []  # offsets of a byte in each special line (several per line possible)
    for needle in needles:
        if not needle:
            hits.extend(_line_starts(raw))
            break
        if b"\n" in needle:
            continue  # cannot occur inside a line
        i = find(needle)
        while i >= 0:
            hits.append(i)
            eol = find(b"\n", i)
            if eol < 0:
                break
            i = find(needle, eol + 1)
    if raw[:2] != b'{"':
        hits.append(0)
    lines, specials = _lines_of(raw, hits)
    if raw.count(b'\n{"') != lines - 1:
        # Some line after the first does not start like ``{"`` (rare: a batch, a blank line,
        # a log line): add those lines and do it again, rather than pay a pass on every block.
        hits.extend(m.end() for m in _ODD_LINE.finditer(raw))
        lines, specials = _lines_of(raw, hits)
    return lines, specials


def _lines_of(raw: bytes, hits: list[int]) -> ScanResult:
    """The line count, and the lines holding the offsets ``hits`` (once each, in order)."""
    if not hits:
        return raw.count(b"\n") + 1, []
    hits.sort()
    find, rfind, count = raw.find, raw.rfind, raw.count
    specials: list[tuple[int, int, int]] = []
    index = 0  # the line index of ``pos``
    pos = 0  # the first byte of the first line not listed yet
    end = len(raw)
    for hit in hits:
        if hit < pos:
            continue  # another hit on a line already listed
        nl = rfind(b"\n", pos, hit)
        start = pos if nl < 0 else nl + 1
        if start > pos:
            index += count(b"\n", pos, start)
        stop = find(b"\n", hit)
        if stop < 0:
            stop = end
        specials.append((index, start, stop))
        index += 1
        pos = stop + 1
    if pos <= end:
        index += count(b"\n", pos) + 1
    return index, specials


def _line_starts(raw: bytes) -> list[int]:
    starts = [0]
    find = raw.find
    i = find(b"\n")
    while i >= 0:
        starts.append(i + 1)
        i = find(b"\n", i + 1)
    return starts


def _choose() -> tuple[Any, str]:
    """The C accelerator module (``None``: not in use) and what ``SCANNER`` says."""
    if os.environ.get("ACP_PROXY_PURE_PYTHON") == "1":
        return None, "pure Python (ACP_PROXY_PURE_PYTHON=1)"
    try:
        # Not ``from acp_proxy.wire import _scan``: that raises a plain ImportError when the
        # module is missing, this a ModuleNotFoundError naming it (told apart from a bad build).
        import acp_proxy.wire._scan as _scan  # noqa: PLR0402
    except ModuleNotFoundError as exc:
        if exc.name != "acp_proxy.wire._scan":
            raise
        return None, "pure Python (the C accelerator is not built)"
    except ImportError as exc:  # built for another interpreter, a missing symbol, ...
        return None, f"pure Python (the C accelerator does not load: {exc})"
    return _scan, "C"


# ``ACCELERATOR``: the C module, also used by ``rawsplice.splice_member`` (``member_span``).
ACCELERATOR, SCANNER = _choose()
scan: Callable[[bytes, tuple[bytes, ...]], ScanResult] = (
    scan_py if ACCELERATOR is None else ACCELERATOR.scan
)


def contains_py(raw: bytes, needle: bytes) -> bool:
    """Whether ``needle`` occurs in ``raw`` (``bytes.find``, whose speed on JSON, where the
    ``"`` that starts most needles occurs everywhere, is in docs/performance.md, "Figures behind
    the code"; the C one uses the scan's SIMD search)."""
    return raw.find(needle) >= 0


contains: Callable[[bytes, bytes], bool] = (
    contains_py if ACCELERATOR is None else ACCELERATOR.contains
)
