"""Lossless JSON: exact parsing, and rewriting that replaces only the changed members' bytes.

Contract: this module owns every conversion between a frame's bytes and JSON values that the
proxy makes on a frame it may forward. It never does I/O. Its rules (issue 9, "Lossless
rewriting"; style.md habit 4, "byte-exact by default"):

1. Parsing. ``loads`` uses orjson, the fast path; when orjson refuses a frame, the standard
   library parser, which keeps integers exact and accepts what JSON's grammar allows but orjson
   refuses: a lone surrogate escape (``"\\ud800"``) and numbers beyond a double (``1e400``
   becomes ``inf``). What neither can parse (nesting deeper than the recursion limit, invalid
   UTF-8) raises ``Unparseable``: the caller forwards the frame as it came and logs the skip; it
   never drops it. A middleware therefore sees an integer outside [-2**63, 2**64) as orjson's
   float; what it did not change still leaves with the original digits (rule 2), which is what a
   check for long digit runs on every frame would buy, at a cost of 10 ns a byte.
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
from collections.abc import Callable
from typing import Any

import orjson

from acp_proxy.jsontypes import JsonObject, JsonValue


class Unparseable(ValueError):
    """Neither orjson nor the exact parser can read the frame (it is forwarded untouched)."""


class Unencodable(ValueError):
    """A value a middleware produced cannot be written as JSON (not serializable, NaN, inf)."""


# A JSON string, possessive so a long string is matched in one C-level pass.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
# A number or a literal (true / false / null); validity was established by the parse.
_SCALAR = re.compile(rb"[-+.0-9a-zA-Z]+")

_QUOTE, _LBRACE, _RBRACE, _LBRACKET, _RBRACKET, _COMMA, _COLON, _BACKSLASH = b'"{}[],:\\'
_STRUCTURAL = re.compile(rb'["{}\[\]]')
_WS_BYTES = frozenset(b" \t\n\r")
# Bytes that may follow ``{`` / ``[`` in a JSON object / array.
_AFTER_BRACE = frozenset(b' \t\r\n"}')
_AFTER_BRACKET = frozenset(b" \t\r\n]{[")
_LEADING_WS = b" \t\r"


def _reject_constant(name: str) -> JsonValue:
    # The standard library accepts NaN / Infinity / -Infinity; JSON does not.
    raise ValueError(f"invalid JSON literal {name}")


_EXACT = json.JSONDecoder(parse_constant=_reject_constant)


def loads(raw: bytes) -> JsonValue:
    """Parse a frame: orjson, else the standard library (see rule 1)."""
    try:
        return orjson.loads(raw)  # type: ignore[no-any-return]
    except orjson.JSONDecodeError:
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
    """JSON equality: unlike ``==``, ``true`` is not ``1`` and ``1`` is not ``1.0``.

    Iterative: a peer's value may be nested as deep as the parser allows (orjson: 1024 levels),
    deeper than Python's recursion limit.
    """
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y:
            continue
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            assert isinstance(y, dict)
            if x.keys() != y.keys():
                return False
            stack.extend((v, y[k]) for k, v in x.items())
        elif isinstance(x, list):
            assert isinstance(y, list)
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


# --- Scanning --------------------------------------------------------------------------------


def _ws(raw: bytes, i: int) -> int:
    # Most frames have no whitespace between tokens, or one space: a loop beats a regex call.
    n = len(raw)
    while i < n and raw[i] in _WS_BYTES:
        i += 1
    return i


def _string_end(raw: bytes, i: int) -> int:
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
            pos = _string_end(raw, p)
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
        return _string_end(raw, i)
    if c in (_LBRACE, _LBRACKET):
        return _container_end(raw, i)
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
        if raw[j] != _QUOTE:
            raise Unparseable(f"no key at byte {j}")
        kend = _string_end(raw, j)
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


def value_start(raw: bytes) -> int:
    """Where the one JSON value of a frame starts (after any leading whitespace)."""
    return _ws(raw, 0)


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


# A top-level ``"id"`` member's value after its key: a number, a string without escapes, null.
_ID_VALUE = re.compile(rb'[ \t\r\n]*:[ \t\r\n]*(-?[0-9][0-9.eE+-]*|"[^"]*"|null)')


def id_bytes(raw: bytes) -> bytes | None:
    """``member_bytes(raw, "id")``, fast for the common frame (issue 13: the full scan of the
    object's members was a quarter of the proxy's CPU per request on interactive traffic).

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


# --- Splicing --------------------------------------------------------------------------------


def splice(raw: bytes, old: JsonValue, new: JsonValue) -> bytes:
    """``new`` encoded with every part it shares with ``old`` (the parse of ``raw``) kept as
    ``raw``'s exact bytes (rule 2). Raises ``Unencodable`` for a changed value that is not JSON.

    One pass: each byte of ``raw`` is looked at once at most, and the members after the last
    one that changed are copied without a look.
    """
    start = _ws(raw, 0)
    splicer = _Splicer(raw)
    end = splicer.value(start, old, new)
    view = memoryview(raw)
    return b"".join((view[:start], *splicer.out, view[end:]))


def member_span_py(
    raw: bytes, path: tuple[bytes, ...], key: bytes
) -> tuple[int, int, int, int, int] | None:
    """Where member ``key`` of the object at ``path`` sits in the parsed frame ``raw``: the
    reference of the C accelerator's ``member_span`` (``acp_proxy/wire/_scan.c``), which must
    answer exactly this (tests/test_rawjson.py compares them).

    ``(start, close, vs, ve, last_end)``: the object's ``{`` and ``}``, the span of ``key``'s
    value (``-1, -1`` when absent) and the end of the object's last member value (``-1`` when
    it is empty). Keys and path steps are compared as raw bytes. ``None`` when an object on the
    way (the top level included) is not there, a key in one of them has an escape, or a step
    or ``key`` occurs twice in its object: ``splice_member`` then takes its full path.
    """
    i = _ws(raw, 0)
    want = (*path, key)
    start = close = vs = ve = last = -1
    for depth, name in enumerate(want):
        if i >= len(raw) or raw[i] != _LBRACE:
            return None
        try:
            members, close = object_members(raw, i)
        except Unparseable:
            return None
        start, vs, ve, last = i, -1, -1, -1
        for _key_text, ks, mvs, mve in members:
            kend = _string_end(raw, ks)
            body = raw[ks + 1 : kend - 1]
            if b"\\" in body:
                return None
            if body == name:
                if vs >= 0:
                    return None
                vs, ve = mvs, mve
            last = mve
        if depth < len(path):
            if vs < 0:
                return None
            i = vs
    return start, close, vs, ve, last


def _accelerated(name: str) -> Any:
    """A function of the C accelerator (``acp_proxy/wire/_scan.c``), ``None`` without it."""
    from acp_proxy.wire import scan

    return getattr(scan.ACCELERATOR, name, None)


_member_span_c: Callable[[bytes, tuple[bytes, ...], bytes], tuple[int, ...] | None] | None
_member_span_c = _accelerated("member_span")
_numbers_risky_c: Callable[[bytes], bool] | None = _accelerated("numbers_risky")
_splice_member_c: Callable[..., bytes | None] | None = _accelerated("splice_member")
_array_elements_c: Callable[[bytes, int], tuple[list[tuple[int, int]], int] | None] | None
_array_elements_c = _accelerated("array_elements")


def member_span(
    raw: bytes, path: tuple[bytes, ...], key: bytes
) -> tuple[int, int, int, int, int] | None:
    """``member_span_py``, in C when the accelerator is there (the proxy-chain envelopes take
    their members apart with it: ``wire.envelope``)."""
    if _member_span_c is not None:
        return _member_span_c(raw, path, key)  # type: ignore[return-value]
    return member_span_py(raw, path, key)


def splice_member(
    raw: bytes, path: tuple[str, ...], key: str, old: object, new: JsonValue, *, present: bool
) -> bytes:
    """``raw`` with member ``key`` of the object at ``path`` (keys from the top-level object) set
    to ``new``: the bytes ``splice`` gives when that member is the only change (issue 13).

    ``old`` is the member's parsed value when ``present``; it is spliced like ``splice`` does
    (an object keeps its unchanged members' bytes). An absent member is added last, as
    ``splice`` adds it. Only the objects on ``path`` are scanned, and nothing is built but the
    member's new bytes. Raises ``Unparseable`` when a key on the way, or ``key`` itself, occurs
    more than once (the caller takes the general path) and ``Unencodable`` for a ``new`` that is
    not JSON. With the C accelerator, the objects are located in C (``member_span``) and only
    unusual frames (escaped keys, repeated keys) take the Python scan.
    """
    if _member_span_c is not None and _splice_member_c is not None:
        # (The caches' ``get`` first: a C call instead of a Python one per frame.)
        key_bytes, member_key = _KEYS.get(key) or _key_forms(key)
        path_bytes = _PATHS.get(path) or _path_bytes(path)
        # The common cases in one C call: an absent member added, or a present one whose bytes
        # are exactly orjson's for ``old`` and that ``new`` extends (``splice_value``'s
        # shortcut). The C function checks the frame against that and answers None otherwise.
        expect: bytes | None = None
        if present and type(old) is dict and type(new) is dict and _appends_only(old, new):
            try:
                expect = orjson.dumps(old)
            except TypeError:  # an integer beyond 64 bits or a lone surrogate
                expect = None
        if not present or expect is not None:
            try:
                value = encode_value(new)
            except Unencodable:  # raised below if it matters (an unchanged NaN member does not)
                value = None
            if value is not None:
                out = _splice_member_c(raw, path_bytes, key_bytes, member_key, value, expect)
                if out is not None:
                    return out
        span = _member_span_c(raw, path_bytes, key_bytes)
        # (A span that disagrees with ``present`` is left to the Python path, which decodes
        # the keys: it raises if the frame really is not the parsed one.)
        if span is not None and (span[2] >= 0) == present:
            start, _close, vs, ve, last_end = span
            if vs >= 0:
                return splice_value(raw, vs, old, new, ve)
            member = member_key + encode_value(new)
            if last_end < 0:
                return joined(raw, start + 1, member, start + 1)
            return joined(raw, last_end, b"," + member, last_end)
    return _splice_member_py(raw, path, key, old, new, present=present)


def splice_value(raw: bytes, vs: int, old: object, new: JsonValue, ve: int = -1) -> bytes:
    """``raw`` with the value at ``raw[vs]`` (parsed: ``old``; ends at ``ve`` when known)
    written as ``new`` by ``_Splicer``, which copies what ``new`` shares with ``old``.

    Shortcut (issue 13): when ``old`` is an object whose bytes are exactly what orjson writes
    for it and ``new`` keeps its members in their order, adds members only at the end and
    changes no member from one container to another of the same kind (where the splicer would
    recurse and keep the old member order), the splice is ``new`` encoded whole: one C call
    instead of a Python scan of the old object.
    """
    if ve >= 0 and type(old) is dict and type(new) is dict and _appends_only(old, new):
        try:
            canonical = orjson.dumps(old) == raw[vs:ve]
        except TypeError:  # an integer beyond 64 bits or a lone surrogate
            canonical = False
        if canonical:
            return joined(raw, vs, encode_value(new), ve)
    splicer = _Splicer(raw)
    end = splicer.value(vs, old, new)
    view = memoryview(raw)
    return b"".join((view[:vs], *splicer.out, view[end:]))


def _appends_only(old: JsonObject, new: JsonObject) -> bool:
    """``new`` has ``old``'s keys first, in their order, and no member that went from a
    container to another of its kind (see ``splice_value``)."""
    if len(new) < len(old):
        return False
    for (k_old, v_old), (k_new, v_new) in zip(old.items(), new.items(), strict=False):
        if k_old != k_new:
            return False
        if v_new is not v_old and type(v_new) in _CONTAINERS and type(v_new) is type(v_old):
            return False
    return True


_CONTAINERS = (dict, list)
_PATHS: dict[tuple[str, ...], tuple[bytes, ...]] = {}


def _path_bytes(path: tuple[str, ...]) -> tuple[bytes, ...]:
    got = _PATHS.get(path)
    if got is None:
        got = tuple(step.encode() for step in path)
        if len(_PATHS) < 64:  # the fused path uses two; any other caller stays bounded
            _PATHS[path] = got
    return got


_KEYS: dict[str, tuple[bytes, bytes]] = {}


def _key_forms(key: str) -> tuple[bytes, bytes]:
    """``key`` as raw UTF-8 (what ``member_span`` compares) and as a member's ``"key":``."""
    got = _KEYS.get(key)
    if got is None:
        got = (key.encode("utf-8", "surrogatepass"), encode_value(key) + b":")
        if len(_KEYS) < 64:  # the fused path uses one; any other caller stays bounded
            _KEYS[key] = got
    return got


def _splice_member_py(
    raw: bytes, path: tuple[str, ...], key: str, old: object, new: JsonValue, *, present: bool
) -> bytes:
    """``splice_member`` without the accelerator (and for what ``member_span`` leaves)."""
    s = _ws(raw, 0)
    for step in path:  # down to the object holding ``key``, never scanning the way twice
        s = _member_start(raw, s, step)
    if raw[s] != _LBRACE:
        raise Unparseable(f"no object at byte {s}")
    members, close = object_members(raw, s)
    hits = [m for m in members if m[0] == key]
    if len(hits) > 1 or bool(hits) != present:
        raise Unparseable(f"{len(hits)} members {key!r}")
    # A key on the way given twice: the parse kept the last one, which may not be this one.
    end = close + 1
    for step in reversed(path):
        end = _no_more(raw, end, step)
    if hits:
        return splice_value(raw, hits[0][2], old, new)
    member = encode_value(key) + b":" + encode_value(new)
    if not members:
        return joined(raw, s + 1, member, s + 1)
    last_end = members[-1][3]
    return joined(raw, last_end, b"," + member, last_end)


def joined(raw: bytes, cut: int, middle: bytes, resume: int) -> bytes:
    """``raw[:cut] + middle + raw[resume:]`` in one copy: ``a + b + c`` on a 10 MiB frame holds
    two 10 MiB intermediates at once, which showed in the peak RSS of a big annotated frame."""
    view = memoryview(raw)
    return b"".join((view[:cut], middle, view[resume:]))


def _member_start(raw: bytes, s: int, key: str) -> int:
    """Where the value of the first member ``key`` of the object at ``raw[s]`` starts."""
    if raw[s] != _LBRACE:
        raise Unparseable(f"no object at byte {s}")
    j = _ws(raw, s + 1)
    while raw[j] == _QUOTE:
        kend = _string_end(raw, j)
        c = _ws(raw, kend)
        if raw[c] != _COLON:
            raise Unparseable(f"no colon at byte {c}")
        vs = _ws(raw, c + 1)
        if _key(raw, j, kend) == key:
            return vs
        j = _ws(raw, value_end(raw, vs))
        if raw[j] == _COMMA:
            j = _ws(raw, j + 1)
    raise Unparseable(f"no member {key!r} in the object at byte {s}")


def _no_more(raw: bytes, i: int, key: str) -> int:
    """Past the rest of an object whose member value ended at ``i``: the offset after its
    ``}``. Raises ``Unparseable`` when a later member is ``key`` again."""
    j = _ws(raw, i)
    while raw[j] == _COMMA:
        j = _ws(raw, j + 1)
        kend = _string_end(raw, j)
        if _key(raw, j, kend) == key:
            raise Unparseable(f"member {key!r} repeated at byte {j}")
        c = _ws(raw, kend)
        if raw[c] != _COLON:
            raise Unparseable(f"no colon at byte {c}")
        j = _ws(raw, value_end(raw, _ws(raw, c + 1)))
    if raw[j] != _RBRACE:
        raise Unparseable(f"unexpected byte at {j}")
    return j + 1


# How deep the splice walks into changed containers; below that, a container is compared whole
# (``json_equal``, iterative) and copied or encoded. A peer's value may be nested 1024 levels
# deep (orjson's limit), past Python's recursion limit.
_MAX_SPLICE_DEPTH = 64


class _Splicer:
    """Writes ``new`` into ``out``, copying from ``raw`` every part ``new`` shares with ``old``."""

    __slots__ = ("depth", "out", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.out: list[bytes] = []
        self.depth = 0

    def value(self, s: int, old: object, new: object) -> int:
        """Write the value at ``raw[s]`` as ``new``; return the offset just past it in ``raw``."""
        raw = self.raw
        if new is not old:
            tn = type(new)
            if self.depth < _MAX_SPLICE_DEPTH:
                self.depth += 1
                try:
                    if tn is dict and type(old) is dict:
                        return self.object(s, old, new)  # type: ignore[arg-type]
                    if tn is list and type(old) is list and len(new) == len(old):  # type: ignore[arg-type]
                        return self.array(s, old, new)  # type: ignore[arg-type]
                finally:
                    self.depth -= 1
            if not json_equal(old, new):
                self.out.append(encode_value(new))
                return value_end(raw, s)
        e = value_end(raw, s)
        self.out.append(raw[s:e])
        return e

    def object(self, s: int, old: JsonObject, new: JsonObject) -> int:
        raw, out = self.raw, self.out
        # Only the members in ``todo`` (changed or removed) are more than copied.
        todo = {k for k, v in new.items() if k in old and old[k] is not v}
        todo.update(k for k in old if k not in new)
        added = [k for k in new if k not in old]
        out.append(b"{")
        j = _ws(raw, s + 1)
        if raw[j] == _RBRACE:  # ``{}`` or ``{ }``
            self._add(added, new, first=True)
            out.append(raw[s + 1 : j + 1])
            return j + 1
        lead = raw[s + 1 : j]  # the whitespace after ``{``
        first = True  # no member written yet
        last_written = False  # the member scanned before this one was written
        ve = j
        while True:
            ks = j
            if raw[ks] != _QUOTE:
                raise Unparseable(f"no key at byte {ks}")
            kend = _string_end(raw, ks)
            c = kend if raw[kend] == _COLON else _ws(raw, kend)
            if raw[c] != _COLON:
                raise Unparseable(f"no colon at byte {c}")
            vs = c + 1
            if raw[vs] in _WS_BYTES:
                vs = _ws(raw, vs)
            key = _key(raw, ks, kend) if todo else ""
            if key in todo and key not in new:  # removed, with its separator
                ve = value_end(raw, vs)
                last_written = False
            else:
                if first:
                    out.append(lead)
                elif last_written:
                    out.append(raw[ve:ks])  # the original separator and whitespace
                else:
                    out.append(b",")
                if key in todo:
                    out.append(raw[ks:vs])
                    ve = self.value(vs, old[key], new[key])
                else:
                    ve = _string_end(raw, vs) if raw[vs] == _QUOTE else value_end(raw, vs)
                    out.append(raw[ks:ve])
                first = False
                last_written = True
            j = ve if raw[ve] not in _WS_BYTES else _ws(raw, ve)
            if raw[j] == _COMMA:
                j += 1
                if raw[j] in _WS_BYTES:
                    j = _ws(raw, j)
                continue
            if raw[j] != _RBRACE:
                raise Unparseable(f"unexpected byte at {j}")
            self._add(added, new, first=first)
            out.append(raw[ve : j + 1])  # the whitespace before ``}``, and the brace
            return j + 1

    def _add(self, added: list[str], new: JsonObject, *, first: bool) -> None:
        out = self.out
        for key in added:
            if not first:
                out.append(b",")
            out.append(encode_value(key))
            out.append(b":")
            out.append(encode_value(new[key]))
            first = False

    def array(self, s: int, old: list[JsonValue], new: list[JsonValue]) -> int:
        raw, out = self.raw, self.out
        j = _ws(raw, s + 1)
        if raw[j] == _RBRACKET:
            out.append(raw[s : j + 1])
            return j + 1
        out.append(raw[s:j])
        n = 0
        while True:
            if n >= len(old):  # only with a repeated key whose copies differ
                raise Unparseable(f"array at byte {s} is not the parsed one")
            e = self.value(j, old[n], new[n])
            n += 1
            k = _ws(raw, e)
            if raw[k] == _COMMA:
                j = _ws(raw, k + 1)
                out.append(raw[e:j])
                continue
            if raw[k] != _RBRACKET:
                raise Unparseable(f"unexpected byte at {k}")
            out.append(raw[e : k + 1])
            return k + 1


# --- Merges (the coalescer) ------------------------------------------------------------------

# Bytes that may change when orjson writes back what it parsed: digits and dots (17 of them in a
# row are more significant digits than a double keeps) and exponents.
_NUMBER_SHAPES = bytes.maketrans(b"0123456789.eE", b"00000000000ee")
_SURROGATE_ESCAPES = (
    b"\\ud8",
    b"\\ud9",
    b"\\uda",
    b"\\udb",
    b"\\udc",
    b"\\udd",
    b"\\ude",
    b"\\udf",
)


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
        i = _string_end(raw, q)


def reencodes_exactly(raw: bytes) -> bool:
    """Whether encoding the parse of ``raw`` with orjson keeps every value exactly.

    True when no number outside strings could change (no exponent, at most 16 digits) and no
    surrogate escape occurs. Conservative: a False only stops the coalescer from merging the frame
    (it is then written as it came).
    """
    if raw.find(b"\\") >= 0:
        lowered = raw.lower()
        if any(lowered.find(e) >= 0 for e in _SURROGATE_ESCAPES):
            return False
    if not _risky_numbers(raw):
        return True
    if _numbers_risky_c is not None:  # the same answer in one C pass (``_scan.c``)
        return not _numbers_risky_c(raw)
    try:
        return not _risky_numbers(_outside_strings(raw))
    except Unparseable:
        return False
