"""Hypothesis strategies for JSON text as peers write it (whitespace, escapes, nesting)."""

from __future__ import annotations

import functools
import json

from hypothesis import strategies as st

WS = st.sampled_from(["", "", "", " ", "\t", "\n ", "  \r\n"])


@st.composite
def json_strings(draw: st.DrawFn) -> str:
    chars = draw(st.lists(st.characters(exclude_categories=["Cs"]), max_size=8))
    body = "".join(_char(c, draw(st.booleans())) for c in chars)
    if draw(st.integers(0, 9)) == 0:
        body += draw(st.sampled_from(["\\ud800", "\\uDFFF", "\\/", "\\b\\f\\n\\r\\t"]))
    return '"' + body + '"'


# One strategy object per depth: a fresh one per draw made hypothesis describe it again
# (``inspect.getsource`` on every call), a third of these properties' time.
@functools.cache
def json_text(depth: int = 3) -> st.SearchStrategy[str]:
    scalars = st.one_of(NUMBERS, json_strings(), st.sampled_from(["true", "false", "null"]))
    if depth == 0:
        return scalars

    @st.composite
    def containers(draw: st.DrawFn) -> str:
        if draw(st.booleans()):
            items = draw(st.lists(json_text(depth - 1), max_size=4))
            inner = ",".join(draw(WS) + i + draw(WS) for i in items)
            return "[" + (inner or draw(WS)) + "]"
        keys = draw(st.lists(json_strings(), max_size=5, unique_by=json.loads))
        members = [
            draw(WS) + k + draw(WS) + ":" + draw(WS) + draw(json_text(depth - 1)) + draw(WS)
            for k in keys
        ]
        return "{" + (",".join(members) or draw(WS)) + "}"

    return st.one_of(scalars, containers())


NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(
        [
            "18446744073709551617",
            "-9223372036854775809",
            "1E+2",
            "1e-7",
            "-0.0",
            "-0",
            "1.000",
            "1e400",
            "0.1000000000000000055511151231257827",
        ]
    ),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)


def _char(c: str, escape: bool) -> str:
    if c == '"':
        return '\\"'
    if c == "\\":
        return "\\\\"
    if ord(c) < 0x20 or escape:
        if ord(c) > 0xFFFF:
            hi, lo = divmod(ord(c) - 0x10000, 0x400)
            return f"\\u{0xD800 + hi:04x}\\u{0xDC00 + lo:04X}"
        return f"\\u{ord(c):04x}"
    return c
