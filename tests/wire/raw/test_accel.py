"""The C accelerator's JSON helpers against their pure-Python references.

``_scan.member_span`` (where a member sits in a frame, for the fused annotation splice) must give
``rawsplice.member_span_py``'s answer, and ``_scan.numbers_risky`` (the coalescer's check that
orjson writes a frame's numbers back unchanged) ``rawscan._risky_numbers`` of the text outside
the strings, on generated and hostile input. ``splice_member`` and ``splice_value`` must give the
same bytes with and without the accelerator and with and without the canonical shortcut: the
splicer is the reference the lossless-rewrite property tests were written against.
"""

from __future__ import annotations

import contextlib
import functools
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_strategies import WS, json_strings, json_text

from acp_proxy.wire.raw import rawjson, rawscan, rawsplice

try:
    from acp_proxy.wire.raw import _scan
except ImportError:  # pragma: no cover - CI builds it (ACP_PROXY_REQUIRE_C)
    _scan = None  # type: ignore[assignment]

needs_c = pytest.mark.skipif(_scan is None, reason="the C accelerator is not built")

# Key texts as they appear between the quotes (escaped spellings of the wanted keys included).
KEYS = ["params", "update", "_meta", "x", r"upd\u0061te", r"_m\u0065ta", r"p\"q"]


def _risky_reference(raw: bytes) -> bool:
    try:
        return rawscan._risky_numbers(rawscan._outside_strings(raw))
    except rawjson.Unparseable:
        return True  # an unterminated string: the caller treats the frame as risky


@st.composite
def objects(draw: st.DrawFn, depth: int = 2) -> str:
    """An object whose keys come from ``KEYS`` (escaped spellings and repeats included), with
    whitespace anywhere JSON allows it and nested objects on the way to ``params.update``."""
    ws = draw(WS)
    members = []
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=5)):
        if depth > 0 and draw(st.booleans()):
            value = draw(_objects_at(depth - 1))
        else:
            value = draw(json_text(1))
        members.append(f'"{key}"{draw(WS)}:{draw(WS)}{value}')
    return "{" + ws + ("," + draw(WS)).join(members) + draw(WS) + "}"


# One strategy object per depth (a fresh one per draw is described again by hypothesis).
_objects_at = functools.cache(objects)


@needs_c
@settings(max_examples=200, deadline=None)
@given(
    text=objects(),
    path=st.sampled_from([(), ("params",), ("params", "update")]),
    key=st.sampled_from(["_meta", "x", "update"]),
    lead=WS,
)
def test_member_span_in_c_is_the_reference(
    text: str, path: tuple[str, ...], key: str, lead: str
) -> None:
    raw = (lead + text).encode()
    json.loads(raw)  # valid JSON, as every frame the fused path sees (orjson parsed it)
    steps = tuple(p.encode() for p in path)
    assert _scan.member_span(raw, steps, key.encode()) == rawsplice.member_span_py(
        raw, steps, key.encode()
    )


@needs_c
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"params":{"update":{}}}', (20, 21, -1, -1, -1)),
        (b'{ "params" : { "update" : { "a" : 1 } } }', (26, 36, -1, -1, 35)),
        (b'{"params":{"update":{"_meta":{"k":"}"},"z":[1,"]"]}}}', (20, 50, 29, 38, 50)),
        (b'{"params":{"update":{"_meta":1,"_meta":2}}}', None),  # repeated: the parse kept one
        (b'{"params":{"update":{},"update":{}}}', None),  # a step repeated
        (b'{"params":{"upd\\u0061te":{}}}', None),  # an escaped key may spell the step
        (b'{"params":{"update":[]}}', None),  # not an object
        (b'{"params":{}}', None),  # no such step
        (b"[]", None),
        (b'{"params":{"update":{"s":"\\\\","_meta":{}}}}', (20, 40, 38, 40, 40)),
    ],
)
def test_member_span_cases(raw: bytes, expected: tuple[int, ...] | None) -> None:
    path = (b"params", b"update")
    assert _scan.member_span(raw, path, b"_meta") == expected
    assert rawsplice.member_span_py(raw, path, b"_meta") == expected


@needs_c
def test_member_span_refuses_wrong_types() -> None:
    with pytest.raises(TypeError):
        _scan.member_span(b"{}", ("params",), b"_meta")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _scan.member_span("{}", (), b"_meta")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _scan.numbers_risky("1e5")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _scan.splice_member(b"{}", ("params",), b"_meta", b'"_meta":', b"1", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _scan.splice_member(b"{}", (), b"_meta", b'"_meta":', "1", None)  # type: ignore[arg-type]


@needs_c
@settings(max_examples=500, deadline=None)
@given(text=json_text(3), junk=st.binary(max_size=40))
def test_numbers_risky_in_c_is_the_reference(text: str, junk: bytes) -> None:
    raw = text.encode()
    assert _scan.numbers_risky(raw) is _risky_reference(raw)
    assert _scan.numbers_risky(junk) is _risky_reference(junk)  # hostile bytes too


@needs_c
@pytest.mark.parametrize(
    ("raw", "risky"),
    [
        (b'{"a":1e5}', True),
        (b'{"a":1.5E-3}', True),
        (b'{"a":"1e5"}', False),  # inside a string
        (b'{"a":12345678901234567}', True),  # 17 digits
        (b'{"a":1234567890123456}', False),
        (b'{"a":"12345678","b":901234567890}', False),  # a string splits the run
        (b'{"a":"\\"1e5"}', False),
        (b'{"a":true,"b":false}', False),
        (b'{"a":"unterminated', True),
    ],
)
def test_numbers_risky_cases(raw: bytes, risky: bool) -> None:
    assert _scan.numbers_risky(raw) is risky
    assert _risky_reference(raw) is risky


@st.composite
def update_frames(draw: st.DrawFn) -> tuple[bytes, Any, Any]:
    """A frame with ``params.update`` (maybe an existing ``_meta``), its parse, and a new
    ``_meta`` object built the way the fused path builds one (old keys kept in order, values
    changed or added at the end) or any object."""
    old_keys = draw(st.lists(st.sampled_from(["a", "b", "c/d"]), max_size=3, unique=True))
    values = st.one_of(
        st.sampled_from(["1", '"x"', "null", "{}", '{"n":1,"m":2}', "[1,2]", "1.0", "1e5"]),
        json_text(1),
    )
    old_text = None
    if draw(st.booleans()):
        ws = draw(WS)
        old_text = (
            "{" + ws + ",".join(f'"{k}"{ws}:{ws}{draw(values)}' for k in old_keys) + draw(WS) + "}"
        )
    members = ['"sessionUpdate":"tool_call_update"', '"title":' + draw(json_strings())]
    if old_text is not None:
        members.insert(draw(st.integers(0, 2)), '"_meta":' + draw(WS) + old_text)
    text = '{"method":"session/update","params":{"update":{' + ",".join(members) + "}}}"
    if draw(st.booleans()):  # orjson's own form, where it can write the frame
        with contextlib.suppress(orjson.JSONDecodeError):
            text = orjson.dumps(orjson.loads(text)).decode()
    raw = text.encode()
    old = json.loads(raw)["params"]["update"].get("_meta", rawjson.Unencodable)
    new: dict[str, Any]
    if isinstance(old, dict) and draw(st.booleans()):
        new = dict(old)
        for k in draw(st.lists(st.sampled_from(["a", "z", "example.dev/route"]), max_size=2)):
            new[k] = draw(st.sampled_from(["edge", None, 1, {"n": 1, "m": 2}, [2, 1]]))
    else:
        new = draw(st.dictionaries(st.sampled_from(["a", "z"]), st.sampled_from(["e", 1, None])))
    return raw, old, new


@settings(max_examples=400, deadline=None)
@given(case=update_frames())
def test_splice_member_is_the_same_with_and_without_the_accelerator(
    case: tuple[bytes, Any, Any],
) -> None:
    raw, old, new = case
    present = old is not rawjson.Unencodable
    path = ("params", "update")
    try:
        slow: bytes | None = rawsplice._splice_member_py(
            raw, path, "_meta", old if present else None, new, present=present
        )
    except (rawjson.Unparseable, rawjson.Unencodable):
        slow = None
    try:
        fast: bytes | None = rawsplice.splice_member(
            raw, path, "_meta", old if present else None, new, present=present
        )
    except (rawjson.Unparseable, rawjson.Unencodable):
        fast = None
    assert fast == slow
    if present and fast is not None:
        # The shortcut (a canonical old object encoded whole) against the splicer alone.
        vs = raw.index(b'"_meta":') + len(b'"_meta":')
        vs = rawscan.ws(raw, vs)
        ve = rawscan.value_end(raw, vs)
        splicer = rawsplice._Splicer(raw)
        end = splicer.value(vs, old, new)
        assert end == ve
        assert (
            rawsplice.splice_value(raw, vs, old, new, ve)
            == raw[:vs] + b"".join(splicer.out) + raw[ve:]
        )


def test_the_splice_shortcut_keeps_a_nested_objects_member_order() -> None:
    """A nested object changed into one with its members in another order: the splicer keeps
    the old order (it copies the members it shares), so the shortcut must not encode it whole."""
    raw = b'{"params":{"update":{"_meta":{"a":{"x":1,"y":2}}}}}'
    old: Any = {"a": {"x": 1, "y": 2}}
    new: Any = {"a": {"y": 2, "x": 1}}
    vs = raw.index(b'{"a"')
    ve = vs + len(b'{"a":{"x":1,"y":2}}')
    assert rawsplice.splice_value(raw, vs, old, new, ve) == raw


def test_the_splice_shortcut_does_not_take_a_non_canonical_object() -> None:
    raw = b'{"params":{"update":{"_meta":{"a" : 1.0}}}}'
    old: Any = {"a": 1.0}
    new: Any = {"a": 1.0, "b": "x"}
    vs = raw.index(b'{"a"')
    ve = raw.index(b"}") + 1
    assert (
        rawsplice.splice_value(raw, vs, old, new, ve)
        == b'{"params":{"update":{"_meta":{"a" : 1.0,"b":"x"}}}}'
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"params":{"update":{}}}', b'{"params":{"update":{"_meta":{"k":"v"}}}}'),
        (b'{"params":{"update":{ }}}', b'{"params":{"update":{"_meta":{"k":"v"} }}}'),
        (b'{"params":{"update":{"a":1}}}', b'{"params":{"update":{"a":1,"_meta":{"k":"v"}}}}'),
        (b'{"params":{"update":{"a":1 } }}', b'{"params":{"update":{"a":1,"_meta":{"k":"v"} } }}'),
    ],
)
def test_splice_member_adds_the_member_last(raw: bytes, expected: bytes) -> None:
    new: Any = {"k": "v"}
    path = ("params", "update")
    assert rawsplice.splice_member(raw, path, "_meta", None, new, present=False) == expected
    assert rawsplice._splice_member_py(raw, path, "_meta", None, new, present=False) == expected


def test_an_unchanged_nan_member_does_not_stop_the_splice() -> None:
    """Found by hypothesis: ``_meta`` holding ``1e400`` (parsed as infinity by the standard
    library) and left as it is: the C path cannot encode the new value, so the splicer keeps
    the member's bytes; the frame must come out as it came, not be refused."""
    raw = b'{"params":{"update":{"_meta":{"a":1,"c/d":1e400},"title":"x"}}}'
    old: Any = json.loads(raw)["params"]["update"]["_meta"]
    new: Any = dict(old)
    path = ("params", "update")
    assert rawsplice.splice_member(raw, path, "_meta", old, new, present=True) == raw
    assert rawsplice._splice_member_py(raw, path, "_meta", old, new, present=True) == raw


@needs_c
@settings(max_examples=400, deadline=None)
@given(items=st.lists(json_text(2), max_size=6), lead=WS, gaps=st.lists(WS, min_size=14))
def test_array_elements_in_c_is_the_reference(items: list[str], lead: str, gaps: list[str]) -> None:
    """A batch's entries found in C (``_scan.array_elements``) are the Python walk's."""
    inner = ",".join(
        gaps[k % len(gaps)] + item + gaps[(k + 7) % len(gaps)] for k, item in enumerate(items)
    )
    raw = (lead + "[" + (inner or gaps[0]) + "]").encode()
    json.loads(raw)
    start = rawscan.value_start(raw)
    assert _scan.array_elements(raw, start) == rawscan.array_elements_py(raw, start)
    assert rawscan.array_elements(raw, start) == rawscan.array_elements_py(raw, start)


@needs_c
@pytest.mark.parametrize("raw", [b"[1,]", b"[1 2]", b"{}", b"[", b'["x]'])
def test_array_elements_in_c_declines_what_is_not_an_array(raw: bytes) -> None:
    assert _scan.array_elements(raw, 0) is None


JSONISH = st.lists(
    st.sampled_from([b"{", b"}", b"[", b"]", b'"', b"\\", b":", b",", b" ", b"1", b"e", b"x"])
    | st.sampled_from([b'"params"', b'"update"', b'"_meta"', b"\n"]),
    max_size=60,
).map(b"".join)


@needs_c
@settings(max_examples=1500, deadline=None)
@given(raw=st.one_of(JSONISH, st.binary(max_size=80)), at=st.integers(0, 80))
def test_the_c_helpers_never_read_past_hostile_input(raw: bytes, at: int) -> None:
    """Truncated, unbalanced and random bytes (the helpers are meant for parsed frames, but
    nothing may crash or answer an offset outside the frame)."""
    path = (b"params", b"update")
    span = _scan.member_span(raw, path, b"_meta")
    if span is not None:
        assert all(-1 <= x <= len(raw) for x in span)
    out = _scan.splice_member(raw, path, b"_meta", b'"_meta":', b"{}", None)
    assert out is None or len(out) == len(raw) + len(b'"_meta":{}') + (
        span is not None and span[4] >= 0
    )
    got = _scan.array_elements(raw, min(at, len(raw)))
    if got is not None:
        spans, close = got
        assert 0 <= close < len(raw) and all(0 <= a < b <= close for a, b in spans)
    assert _scan.numbers_risky(raw) in (True, False)
