"""Where JSON values sit in a frame's bytes, and what the bytes say without a parse.

Contract: scans of a frame that was parsed (or is about to be): where a value, an object's
members or an array's elements start and end (``value_end``, ``object_members``,
``array_elements``), the exact bytes of a top-level member (``member_bytes``, ``id_bytes``: an
error reply echoes the request id's bytes), and whether orjson writes a frame's numbers back
exactly (``reencodes_exactly``, the coalescer's check). It builds no value and never does I/O.
The scanner skips strings with ``bytes.find`` (C speed for the bulk of any frame) and jumps from
one structural byte to the next, so a scan costs the number of members, never an encode. With
the C accelerator (``_scan.c``), ``array_elements`` and ``reencodes_exactly`` are one C pass.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from acp_proxy.wire.raw import block_scan
from acp_proxy.wire.raw.rawjson import Unparseable

# A number or a literal (true / false / null); validity was established by the parse.
_SCALAR = re.compile(rb"[-+.0-9a-zA-Z]+")

_QUOTE, _LBRACE, _RBRACE, _LBRACKET, _RBRACKET, _COMMA, _COLON, _BACKSLASH = b'"{}[],:\\'
_STRUCTURAL = re.compile(rb'["{}\[\]]')
WS_BYTES = frozenset(b" \t\n\r")

# The C accelerator's functions (``acp_proxy/wire/raw/_scan.c``), ``None`` without it.
_numbers_risky_c: Callable[[bytes], bool] | None = getattr(
    block_scan.ACCELERATOR, "numbers_risky", None
)
_array_elements_c: Callable[[bytes, int], tuple[list[tuple[int, int]], int] | None] | None
_array_elements_c = getattr(block_scan.ACCELERATOR, "array_elements", None)


def ws(raw: bytes, i: int) -> int:
    # Most frames have no whitespace between tokens, or one space: a loop beats a regex call.
    n = len(raw)
    while i < n and raw[i] in WS_BYTES:
        i += 1
    return i


def string_end(raw: bytes, i: int) -> int:
    """The offset just past the string whose opening quote is ``raw[i]``.

    ``bytes.find`` jumps from quote to quote at memchr speed; a quote preceded by an odd run of
    backslashes is escaped. The cost follows the number of quotes, not the string's length.
    """
    find = raw.find
    j = i + 1
    while True:
        q = find(b'"', j)
        if q < 0:
            raise Unparseable(f"unterminated string at byte {i}")
        k = q - 1
        while raw[k] == _BACKSLASH:
            k -= 1
        if (q - 1 - k) % 2 == 0:
            return q + 1
        j = q + 1


def _container_end(raw: bytes, i: int) -> int:
    """The offset just past the object or array starting at ``raw[i]``.

    Jumps from one structural byte to the next (a regex search, short hops inside a container)
    and over each string whole (``_string_end``), so a long string costs one ``find``.
    """
    search = _STRUCTURAL.search
    depth = 0
    pos = i
    while True:
        m = search(raw, pos)
        if m is None:
            raise Unparseable(f"unterminated container at byte {i}")
        p = m.start()
        c = raw[p]
        if c == _QUOTE:
            pos = string_end(raw, p)
            continue
        pos = p + 1
        if c in (_LBRACE, _LBRACKET):
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return pos


def value_end(raw: bytes, i: int) -> int:
    """The offset just past the JSON value starting at ``raw[i]`` (which was parsed before)."""
    c = raw[i]
    if c == _QUOTE:
        return string_end(raw, i)
    if c in (_LBRACE, _LBRACKET):
        return _container_end(raw, i)
    m = _SCALAR.match(raw, i)
    if m is None:
        raise Unparseable(f"no value at byte {i}")
    return m.end()


def key_text(raw: bytes, start: int, end: int) -> str:
    body = raw[start + 1 : end - 1]
    if b"\\" in body:
        key = json.loads(raw[start:end])
        assert isinstance(key, str)
        return key
    return body.decode("utf-8", "surrogatepass")


# A member of a scanned object: its key, where the key starts, where its value starts and ends.
Member = tuple[str, int, int, int]


def object_members(raw: bytes, i: int) -> tuple[list[Member], int]:
    """The members of the object starting at ``raw[i]`` (``{``), and the offset of its ``}``."""
    members: list[Member] = []
    j = ws(raw, i + 1)
    if raw[j] == _RBRACE:
        return members, j
    while True:
        if raw[j] != _QUOTE:
            raise Unparseable(f"no key at byte {j}")
        kend = string_end(raw, j)
        c = ws(raw, kend)
        if raw[c] != _COLON:
            raise Unparseable(f"no colon at byte {c}")
        vstart = ws(raw, c + 1)
        vend = value_end(raw, vstart)
        members.append((key_text(raw, j, kend), j, vstart, vend))
        j = ws(raw, vend)
        if raw[j] == _COMMA:
            j = ws(raw, j + 1)
            continue
        if raw[j] == _RBRACE:
            return members, j
        raise Unparseable(f"unexpected byte at {j}")


def array_elements(raw: bytes, i: int) -> tuple[list[tuple[int, int]], int]:
    """The ``(start, end)`` of each element of the array at ``raw[i]``, and its ``]`` offset.

    In one C pass with the accelerator (``_scan.array_elements``, which answers ``None`` where
    this function raises); this Python walk is its reference."""
    if _array_elements_c is not None:
        got = _array_elements_c(raw, i)
        if got is not None:
            return got
    return array_elements_py(raw, i)


def array_elements_py(raw: bytes, i: int) -> tuple[list[tuple[int, int]], int]:
    """``array_elements`` in Python."""
    elements: list[tuple[int, int]] = []
    j = ws(raw, i + 1)
    if raw[j] == _RBRACKET:
        return elements, j
    while True:
        end = value_end(raw, j)
        elements.append((j, end))
        j = ws(raw, end)
        if raw[j] == _COMMA:
            j = ws(raw, j + 1)
            continue
        if raw[j] == _RBRACKET:
            return elements, j
        raise Unparseable(f"unexpected byte at {j}")


def value_start(raw: bytes) -> int:
    """Where the one JSON value of a frame starts (after any leading whitespace)."""
    return ws(raw, 0)


def member_bytes(raw: bytes, key: str) -> bytes | None:
    """The exact bytes of the top-level member ``key``'s value (the last one if repeated)."""
    start = ws(raw, 0)
    if start >= len(raw) or raw[start] != _LBRACE:
        return None
    found = None
    for name, _k, vs, ve in object_members(raw, start)[0]:
        if name == key:
            found = raw[vs:ve]
    return found


# A top-level ``"id"`` member's value after its key: a number, a string without escapes, null.
_ID_VALUE = re.compile(rb'[ \t\r\n]*:[ \t\r\n]*(-?[0-9][0-9.eE+-]*|"[^"]*"|null)')


def id_bytes(raw: bytes) -> bytes | None:
    """``member_bytes(raw, "id")``, fast for the common frame (the full scan of the
    object's members was a large part of the proxy's CPU per request on interactive traffic:
    docs/performance.md, "Figures behind the code").

    When ``raw`` has no backslash, every key in it is written literally, so the top-level
    ``"id"`` key of a message that has one is an occurrence of the bytes ``"id"`` (which cannot
    occur inside a string: its quotes would be escaped); when those bytes occur exactly once, it
    is that key, and its value is read with one regex match. Anything else (escapes, a repeated
    or nested ``id``, an id that is an object or array) takes ``member_bytes``. The caller knows
    the message has a top-level ``id``.
    """
    i = raw.find(b'"id"')
    if i >= 0 and raw.find(b'"id"', i + 4) < 0 and raw.find(b"\\") < 0:
        m = _ID_VALUE.match(raw, i + 4)
        if m is not None:
            return m.group(1)
    return member_bytes(raw, "id")


# --- Merges (the coalescer) ------------------------------------------------------------------

# Bytes that may change when orjson writes back what it parsed: digits and dots (17 of them in a
# row are more significant digits than a double keeps) and exponents.
_NUMBER_SHAPES = bytes.maketrans(b"0123456789.eE", b"00000000000ee")
# ``\ud800``-``\udfff`` in any case (a ``\U`` is not JSON, but it costs nothing to count it).
_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]")


def _risky_numbers(data: bytes) -> bool:
    mapped = data.translate(_NUMBER_SHAPES)
    return mapped.find(b"0e") >= 0 or mapped.find(b"0" * 17) >= 0


def _outside_strings(raw: bytes) -> bytes:
    parts = []
    i = 0
    find = raw.find
    while True:
        q = find(b'"', i)
        if q < 0:
            parts.append(raw[i:])
            return b" ".join(parts)
        parts.append(raw[i:q])
        i = string_end(raw, q)


def surrogate_escape(raw: bytes) -> bool:
    """Whether ``raw`` holds what ``reencodes_exactly`` takes for a surrogate escape."""
    return _SURROGATE_ESCAPE.search(raw) is not None


def risky_numbers_py(raw: bytes) -> bool:
    """The C accelerator's ``numbers_risky`` in Python: a number outside the strings of ``raw``
    with an exponent or 17 digits and dots in a row (an unterminated string is risky)."""
    if not _risky_numbers(raw):
        return False
    try:
        return _risky_numbers(_outside_strings(raw))
    except Unparseable:
        return True


def reencodes_exactly(raw: bytes) -> bool:
    """Whether encoding the parse of ``raw`` with orjson keeps every value exactly.

    True when no number outside strings could change (no exponent, at most 16 digits) and no
    surrogate escape occurs. Conservative: a False only stops the coalescer from merging the frame
    (it is then written as it came).
    """
    if _SURROGATE_ESCAPE.search(raw) is not None:
        return False
    if _numbers_risky_c is not None:  # the exact answer in one C pass (``_scan.c``)
        return not _numbers_risky_c(raw)
    if not _risky_numbers(raw):  # the cheap check: no number could change
        return True
    try:
        return not _risky_numbers(_outside_strings(raw))
    except Unparseable:
        return False
