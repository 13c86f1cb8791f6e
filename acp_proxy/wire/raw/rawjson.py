"""Exact JSON values: parsing a frame, encoding what the proxy changed, JSON equality.

Contract: this module owns every conversion between a frame's bytes and JSON values that the
proxy makes on a frame it may forward (where values sit in the bytes is ``rawscan``; rewriting a
frame by splicing is ``rawsplice``). It never does I/O. Its rules (lossless rewriting; style.md
habit 4, "byte-exact by default"):

1. Parsing. ``loads`` uses orjson, the fast path; when orjson refuses a frame, the standard
   library parser, which keeps integers exact and accepts what JSON's grammar allows but orjson
   refuses: a lone surrogate escape (``"\\ud800"``) and numbers beyond a double (``1e400``
   becomes ``inf``). What neither can parse (nesting deeper than the recursion limit, invalid
   UTF-8) raises ``Unparseable``: the caller forwards the frame as it came and logs the skip; it
   never drops it. A middleware therefore sees an integer outside [-2**63, 2**64) as orjson's
   float; what it did not change still leaves with the original digits (``rawsplice``), which
   is what a check for long digit runs on every frame would buy, at a cost of 10 ns a byte.
2. Encoding. ``encode_value`` encodes only new values: orjson, or the standard library for
   integers beyond 64 bits and lone surrogates; a non-finite float (which orjson would silently
   write as ``null``) raises ``Unencodable``.
3. Shapes. ``could_be_frame`` is the cheap check of whether an agent line can be a JSON-RPC frame
   at all (no parse): after ``{`` comes whitespace, ``"`` or ``}``; after ``[`` comes whitespace,
   ``]``, ``{`` or ``[``.
"""

from __future__ import annotations

import json
import math

import orjson

from acp_proxy.base.jsontypes import JsonValue


class Unparseable(ValueError):
    """Neither orjson nor the exact parser can read the frame (it is forwarded untouched)."""


class Unencodable(ValueError):
    """A value a middleware produced cannot be written as JSON (not serializable, NaN, inf)."""


_LBRACE, _LBRACKET = b"{["
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
