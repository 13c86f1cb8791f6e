"""Lossless JSON: exact parsing, and rewriting that replaces only the changed members' bytes.

Contract: this module owns every conversion between a frame's bytes and JSON values that the
proxy makes on a frame it may forward. It never does I/O. Its rules (issue 9, "Lossless
rewriting"; style.md habit 4, "byte-exact by default"):

1. Parsing. ``loads`` uses orjson, the fast path, unless the frame holds a run of 19 or more
   digits (an integer orjson would turn into a float; orjson keeps only [-2**63, 2**64)) or orjson
   refuses it; then the standard library parser, which keeps integers exact and accepts what JSON's
   grammar allows but orjson refuses: a lone surrogate escape (``"\\ud800"``) and numbers beyond
   a double (``1e400`` becomes ``inf``). What neither can parse (nesting deeper than the
   recursion limit, invalid UTF-8) raises ``Unparseable``: the caller forwards the frame as it
   came and logs the skip; it never drops it.
2. Rewriting. ``splice(raw, old, new)`` re-encodes the value ``new`` that a middleware made from
   ``old`` (the parse of ``raw``) by walking both: a member or element whose value is the same
   object (or JSON-equal) keeps its exact bytes, with its key's spelling and the whitespace
   around it; only a changed scalar, or a member that is new, is encoded. Removed members go
   with their separators; members a middleware added go last. A frame's untouched numbers, of any
   size or spelling, and its string escapes therefore survive any rewrite.
3. Encoding. ``encode_value`` encodes only new values: orjson, or the standard library for
   integers beyond 64 bits and lone surrogates; a non-finite float (which orjson would silently
   write as ``null``) raises ``Unencodable``.
4. Shapes. ``could_be_frame`` is the cheap check of whether an agent line can be a JSON-RPC frame
   at all (no parse): after ``{`` comes whitespace, ``"`` or ``}``; after ``[`` comes whitespace,
   ``]``, ``{`` or ``[``.

The scanner below skips values with regular expressions (C speed for strings, the bulk of any
frame), so a rewrite costs a scan of the members before and around the ones it changes, never an
encode of them.
"""

from __future__ import annotations

import json
import math
import re

import orjson

from acp_proxy.jsontypes import JsonObject, JsonValue


class Unparseable(ValueError):
    """Neither orjson nor the exact parser can read the frame (it is forwarded untouched)."""


class Unencodable(ValueError):
    """A value a middleware produced cannot be written as JSON (not serializable, NaN, inf)."""


# orjson keeps integers in [-2**63, 2**64): 19 digits or more may fall outside (2**64 has 20).
_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_WS = re.compile(rb"[ \t\n\r]*")
# A JSON string, possessive so a long string is matched in one C-level pass.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
# A number or a literal (true / false / null); validity was established by the parse.
_SCALAR = re.compile(rb"[-+.0-9a-zA-Z]+")
# What a container skip must look at: strings (skipped whole) and brackets.
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{}]', re.DOTALL)

_QUOTE, _LBRACE, _RBRACE, _LBRACKET, _RBRACKET, _COMMA, _COLON = b'"{}[],:'
# Bytes that may follow ``{`` / ``[`` in a JSON object / array.
_AFTER_BRACE = frozenset(b' \t\r\n"}')
_AFTER_BRACKET = frozenset(b" \t\r\n]{[")
_LEADING_WS = b" \t\r"


def _reject_constant(name: str) -> JsonValue:
    # The standard library accepts NaN / Infinity / -Infinity; JSON does not.
    raise ValueError(f"invalid JSON literal {name}")


_EXACT = json.JSONDecoder(parse_constant=_reject_constant)


def loads(raw: bytes) -> JsonValue:
    """Parse a frame; orjson when it is exact, else the standard library (see rule 1)."""
    if _LONG_DIGITS.search(raw) is None:
        try:
            return orjson.loads(raw)  # type: ignore[no-any-return]
        except orjson.JSONDecodeError:
            pass
    return exact_loads(raw)


def exact_loads(raw: bytes) -> JsonValue:
    """Parse with the standard library (exact integers); ``Unparseable`` when it cannot."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unparseable(f"not valid UTF-8 at byte {exc.start}") from None
    try:
        return _EXACT.decode(text)  # type: ignore[no-any-return]
    except RecursionError:
        raise Unparseable("nested too deeply to parse") from None
    except ValueError as exc:
        raise Unparseable(str(exc)) from None


def could_be_frame(raw: bytes) -> bool:
    """Whether an agent line can be a JSON-RPC frame, from its first two significant bytes.

    A frame is an object or a batch: ``{`` then whitespace, ``"`` or ``}``; ``[`` then
    whitespace, ``]``, ``{`` or ``[``. Log lines such as ``[INFO] ...``, ``[2026-12-03 ...]`` or
    ``{not json}`` fail here and are diverted without a parse. Leading spaces, tabs and a
    carriage return are allowed before the opener.
    """
    i = 0
    n = len(raw)
    while i < n and raw[i] in _LEADING_WS:
        i += 1
    if i + 1 >= n:
        return False  # empty, blank, or a lone opener: no frame
    first, second = raw[i], raw[i + 1]
    if first == _LBRACE:
        return second in _AFTER_BRACE
    if first == _LBRACKET:
        return second in _AFTER_BRACKET
    return False


# --- Encoding ------------------------------------------------------------------------------------


def _nonfinite(value: object) -> bool:
    if type(value) is float:
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_nonfinite(v) for v in value.values())
    if isinstance(value, list):
        return any(_nonfinite(v) for v in value)
    return False


def encode_value(value: object) -> bytes:
    """Encode a value a middleware created (compact); ``Unencodable`` if it is not JSON."""
    try:
        data = orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: big integer, lone surrogate, not JSON
        pass
    else:
        # orjson writes NaN and infinities as null: never let that change a value silently.
        if b"null" in data and _nonfinite(value):
            raise Unencodable("a float is NaN or infinite")
        return data
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        try:
            return text.encode()
        except UnicodeEncodeError:  # a lone surrogate: write it as an escape
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise Unencodable(f"{type(exc).__name__}: {exc}") from None


def json_equal(a: object, b: object) -> bool:
    """JSON equality: unlike ``==``, ``true`` is not ``1`` and ``1`` is not ``1.0``."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


# --- Scanning --------------------------------------------------------------------------------


def _ws(raw: bytes, i: int) -> int:
    return _WS.match(raw, i).end()  # type: ignore[union-attr]  # matches the empty string


def value_end(raw: bytes, i: int) -> int:
    """The offset just past the JSON value starting at ``raw[i]`` (which was parsed before)."""
    c = raw[i]
    if c == _QUOTE:
        m = _STRING.match(raw, i)
        if m is None:
            raise Unparseable(f"unterminated string at byte {i}")
        return m.end()
    if c in (_LBRACE, _LBRACKET):
        depth = 0
        for m in _TOKEN.finditer(raw, i):
            t = raw[m.start()]
            if t == _QUOTE:
                continue
            if t in (_LBRACE, _LBRACKET):
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    return m.end()
        raise Unparseable(f"unterminated container at byte {i}")
    m = _SCALAR.match(raw, i)
    if m is None:
        raise Unparseable(f"no value at byte {i}")
    return m.end()


def _key(raw: bytes, start: int, end: int) -> str:
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
    j = _ws(raw, i + 1)
    if raw[j] == _RBRACE:
        return members, j
    while True:
        m = _STRING.match(raw, j)
        if m is None:
            raise Unparseable(f"no key at byte {j}")
        kend = m.end()
        c = _ws(raw, kend)
        if raw[c] != _COLON:
            raise Unparseable(f"no colon at byte {c}")
        vstart = _ws(raw, c + 1)
        vend = value_end(raw, vstart)
        members.append((_key(raw, j, kend), j, vstart, vend))
        j = _ws(raw, vend)
        if raw[j] == _COMMA:
            j = _ws(raw, j + 1)
            continue
        if raw[j] == _RBRACE:
            return members, j
        raise Unparseable(f"unexpected byte at {j}")


def array_elements(raw: bytes, i: int) -> tuple[list[tuple[int, int]], int]:
    """The ``(start, end)`` of each element of the array at ``raw[i]``, and its ``]`` offset."""
    elements: list[tuple[int, int]] = []
    j = _ws(raw, i + 1)
    if raw[j] == _RBRACKET:
        return elements, j
    while True:
        end = value_end(raw, j)
        elements.append((j, end))
        j = _ws(raw, end)
        if raw[j] == _COMMA:
            j = _ws(raw, j + 1)
            continue
        if raw[j] == _RBRACKET:
            return elements, j
        raise Unparseable(f"unexpected byte at {j}")


def value_span(raw: bytes) -> tuple[int, int]:
    """Where the one JSON value of a frame starts and ends (surrounding whitespace excluded)."""
    start = _ws(raw, 0)
    return start, value_end(raw, start)


def member_bytes(raw: bytes, key: str) -> bytes | None:
    """The exact bytes of the top-level member ``key``'s value (the last one if repeated)."""
    start = _ws(raw, 0)
    if start >= len(raw) or raw[start] != _LBRACE:
        return None
    found = None
    for name, _k, vs, ve in object_members(raw, start)[0]:
        if name == key:
            found = raw[vs:ve]
    return found


# --- Splicing --------------------------------------------------------------------------------


def splice(raw: bytes, old: JsonValue, new: JsonValue) -> bytes:
    """``new`` encoded with every part it shares with ``old`` (the parse of ``raw``) kept as
    ``raw``'s exact bytes (rule 2). Raises ``Unencodable`` for a changed value that is not JSON."""
    start, end = value_span(raw)
    splicer = _Splicer(raw)
    splicer.value(start, end, old, new)
    body = b"".join(splicer.out)
    if start == 0 and end == len(raw):
        return body
    return raw[:start] + body + raw[end:]


def splice_span(raw: bytes, start: int, end: int, old: JsonValue, new: JsonValue) -> bytes:
    """Like ``splice`` for the value at ``raw[start:end]`` (e.g. one entry of a batch)."""
    splicer = _Splicer(raw)
    splicer.value(start, end, old, new)
    return b"".join(splicer.out)


class _Splicer:
    """Writes ``new`` into ``out``, copying from ``raw`` every part ``new`` shares with ``old``."""

    __slots__ = ("out", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.out: list[bytes] = []

    def value(self, s: int, e: int, old: object, new: object) -> None:
        if new is old:
            self.out.append(self.raw[s:e])
            return
        tn = type(new)
        if tn is dict and type(old) is dict:
            self.object(s, e, old, new)  # type: ignore[arg-type]
        elif tn is list and type(old) is list and len(new) == len(old):  # type: ignore[arg-type]
            self.array(s, old, new)  # type: ignore[arg-type]
        elif json_equal(old, new):
            self.out.append(self.raw[s:e])
        else:
            self.out.append(encode_value(new))

    def object(self, s: int, e: int, old: JsonObject, new: JsonObject) -> None:
        raw, out = self.raw, self.out
        members = object_members(raw, s)[0]
        last = {m[0]: n for n, m in enumerate(members)}  # a repeated key: the parser kept the last
        out.append(b"{")
        prev = -2  # index of the last original member written; -1: an added one
        prev_end = s + 1
        for n, (key, ks, vs, ve) in enumerate(members):
            if key not in new:
                continue  # removed, with its separator
            if prev == -2:
                out.append(raw[s + 1 : members[0][1]])  # the whitespace after ``{``
            elif prev == n - 1:
                out.append(raw[prev_end:ks])  # the original separator
            else:
                out.append(b",")
            value = new[key]
            if last[key] != n or value is old[key]:
                out.append(raw[ks:ve])
            else:
                out.append(raw[ks:vs])
                self.value(vs, ve, old[key], value)
            prev, prev_end = n, ve
        for key in new:
            if key in last:
                continue
            if prev != -2:
                out.append(b",")
            out.append(encode_value(key))
            out.append(b":")
            out.append(encode_value(new[key]))
            prev = -1
        # The whitespace before ``}`` and the brace itself.
        out.append(raw[members[-1][3] if members else s + 1 : e])

    def array(self, s: int, old: list[JsonValue], new: list[JsonValue]) -> None:
        raw, out = self.raw, self.out
        elements, close = array_elements(raw, s)
        if not elements:
            out.append(raw[s : close + 1])
            return
        out.append(raw[s : elements[0][0]])
        for n, (es, ee) in enumerate(elements):
            if n:
                out.append(raw[elements[n - 1][1] : es])
            self.value(es, ee, old[n], new[n])
        out.append(raw[elements[-1][1] : close + 1])


# --- Merges (the coalescer) ------------------------------------------------------------------

# Numbers whose double is not written back as the same spelling by orjson: an exponent, or 17+
# digits and dots (more significant digits than a double keeps).
_RISKY_NUMBER = re.compile(rb"[0-9.][eE]|[0-9][0-9.]{16}")
_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]")


def reencodes_exactly(raw: bytes) -> bool:
    """Whether encoding the parse of ``raw`` with orjson keeps every value exactly.

    True when no number outside strings could change (no exponent, at most 16 digits) and no
    surrogate escape occurs. Conservative: a False only stops the coalescer from merging the frame
    (it is then written as it came).
    """
    if _SURROGATE_ESCAPE.search(raw):
        return False
    if not _RISKY_NUMBER.search(raw):
        return True
    return _RISKY_NUMBER.search(_STRING.sub(b'""', raw)) is None
