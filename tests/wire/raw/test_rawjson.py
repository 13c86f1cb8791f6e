"""Lossless JSON (``rawjson``, ``rawscan``, ``rawsplice``): parsing and splicing, as properties.

The generator writes JSON the way hostile or merely unusual peers do: random whitespace, big and
negative integers, odd number spellings (``1E+2``, ``-0.0``, ``1e400``), every escape including
lone surrogates, unicode, and nesting. The judge is an exact parser (``json`` with
``parse_float=Decimal``): after a rewrite the output must hold exactly the original document with
the changes applied, and an unchanged document must come out byte for byte.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from json_strategies import WS, json_strings, json_text

from acp_proxy.rules.engine import Rule, RuleDirection, RulesMiddleware
from acp_proxy.wire.chain import Chain, Direction, Link
from acp_proxy.wire.connection.pipeline import Connection
from acp_proxy.wire.framing import Line
from acp_proxy.wire.raw import rawjson, rawscan, rawsplice

# --- a generator of unusual but valid JSON text -----------------------------------------------


def exact(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"), parse_float=Decimal)


def _objects(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every object in ``value``."""
    found = []
    if isinstance(value, dict):
        found.append(path)
        for k, v in value.items():
            found.extend(_objects(v, (*path, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found.extend(_objects(v, (*path, i)))
    return found


def _edit(value: Any, path: tuple[Any, ...], key: str, new: Any) -> Any:
    """A copy of ``value`` with ``key`` of the object at ``path`` set (``...``: removed); values,
    not mutation, like a well-behaved middleware (untouched subtrees are shared)."""
    if not path:
        out = dict(value)
        if new is ...:
            out.pop(key, None)
        else:
            out[key] = new
        return out
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        copy = list(value)
        copy[head] = _edit(value[head], rest, key, new)
        return copy
    return {**value, head: _edit(value[head], rest, key, new)}


NEW_VALUES = st.one_of(
    st.just(...),
    st.integers(-(2**70), 2**70),
    st.text(max_size=5),
    st.none(),
    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(
    doc=json_text(),
    picks=st.lists(st.tuples(st.integers(0, 50), st.text(max_size=4), NEW_VALUES), max_size=3),
    wrap_ws=WS,
)
# Found by hypothesis: the second pick's object was replaced by the first (a stale path).
@example(doc='{"\\ud800":{"\\ud800":0,"":{}}}', picks=[(33, "", 0), (1, "", ...)], wrap_ws="")
def test_splice_changes_only_what_changed(doc: str, picks: list[Any], wrap_ws: str) -> None:
    raw = (wrap_ws + doc).encode("utf-8")
    old = rawjson.loads(raw)
    expected = exact(raw)
    new = old
    for index, fresh_key, value in picks:
        # The objects of the document as edited so far: an earlier pick may have replaced one
        # that held another (hypothesis found such a pair: an object set to 0, then edited).
        objects = _objects(new)
        if not objects:
            break
        path = objects[index % len(objects)]
        existing = list(_at(new, path))
        key = fresh_key
        if existing and index % 2:
            key = existing[index % len(existing)]  # edit an existing member half of the time
        new = _edit(new, path, key, value)
        expected = _edit(expected, path, key, value)
    out = rawsplice.splice(raw, old, new)
    assert exact(out) == expected
    if new is old:
        assert out == raw


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        value = value[p]
    return value


@settings(max_examples=300, deadline=None)
@given(doc=json_text())
def test_exact_loads_keeps_integers_of_any_size(doc: str) -> None:
    raw = doc.encode("utf-8")
    assert _ints(rawjson.exact_loads(raw)) == _ints(exact(raw))
    # ``loads`` is orjson's answer whenever orjson gives one (a middleware then sees an integer
    # beyond 64 bits as a float; its bytes still leave unchanged, see the splice property).
    value = rawjson.loads(raw)
    assert json.dumps(value, sort_keys=True, default=str) == json.dumps(
        _orjson_or_exact(raw), sort_keys=True, default=str
    )


def _orjson_or_exact(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return rawjson.exact_loads(raw)


def _ints(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, dict):
        return [i for v in value.values() for i in _ints(v)]
    if isinstance(value, list):
        return [i for v in value for i in _ints(v)]
    return []


# --- fixed cases ------------------------------------------------------------------------------

FRAME = (
    b'{ "jsonrpc" : "2.0", "method":"session/update", "params":{"sessionId":"s","update":'
    b'{"sessionUpdate":"tool_call_update","toolCallId":"c","n":18446744073709551617,'
    b' "x":1e400, "s":"\\ud800\\u00e9" } } }'
)


def test_splice_adds_meta_and_keeps_every_other_byte() -> None:
    old: Any = rawjson.loads(FRAME)
    update = {**old["params"]["update"], "_meta": {"example.dev/route": "edge"}}
    new = {**old, "params": {**old["params"], "update": update}}
    assert rawsplice.splice(FRAME, old, new) == FRAME.replace(
        b'\\u00e9" }', b'\\u00e9","_meta":{"example.dev/route":"edge"} }'
    )


def test_splice_removes_a_member_with_its_separator() -> None:
    raw = b'{"a":1, "b":2 ,"c":3}'
    old = rawjson.loads(raw)
    assert rawsplice.splice(raw, old, {"b": 2, "c": 3}) == b'{"b":2 ,"c":3}'
    assert rawsplice.splice(raw, old, {"a": 1, "c": 3}) == b'{"a":1,"c":3}'
    assert rawsplice.splice(raw, old, {"a": 1, "b": 2}) == b'{"a":1, "b":2}'
    assert rawsplice.splice(raw, old, {}) == b"{}"


def test_splice_of_an_equal_copy_is_the_original() -> None:
    old = rawjson.loads(FRAME)
    copy = json.loads(json.dumps(old))  # no shared objects at all
    assert rawsplice.splice(FRAME, old, copy) == FRAME


def test_repeated_key_every_copy_is_changed() -> None:
    raw = b'{"a":1,"a":2}'
    assert rawjson.loads(raw) == {"a": 2}
    # Every copy of a changed key gets the new value: the same reading for first-wins and
    # last-wins parsers.
    assert rawsplice.splice(raw, {"a": 2}, {"a": 5}) == b'{"a":5,"a":5}'


@pytest.mark.parametrize(
    "raw",
    [
        b'"\\ud800"',
        b"1e400",
        b"[18446744073709551617]",
        b'{"a":-0}',
    ],
)
def test_loads_accepts_what_orjson_refuses(raw: bytes) -> None:
    value = rawjson.loads(raw)
    assert rawsplice.splice(raw, value, value) == raw


@pytest.mark.parametrize(
    "raw",
    [b"[" * 1100 + b"]" * 1100, b'{"a":"\xff"}', b"{", b"NaN", b'{"a":Infinity}'],
)
def test_unparseable(raw: bytes) -> None:
    with pytest.raises(rawjson.Unparseable):
        rawjson.loads(raw)


@pytest.mark.parametrize("value", [float("inf"), [1, float("nan")], {"a": -float("inf")}])
def test_encode_refuses_non_finite_floats(value: object) -> None:
    # orjson would write them as null: a silent change of value.
    with pytest.raises(rawjson.Unencodable):
        rawjson.encode_value(value)


def test_encode_keeps_big_integers_and_lone_surrogates() -> None:
    assert rawjson.encode_value({"n": 2**64 + 1}) == b'{"n":18446744073709551617}'
    assert rawjson.encode_value("\ud800") == b'"\\ud800"'


@pytest.mark.parametrize(
    ("line", "frame"),
    [
        (b'{"a":1}', True),
        (b"{}", True),
        (b'{ "a":1}', True),
        (b'  {"a":1}', True),
        (b"[]", True),
        (b'[{"a":1}]', True),
        (b"[[]]", True),
        (b"[ 1]", True),
        (b"[INFO] Starting server", False),
        (b"[2026-12-03 10:00:00] debug", False),
        (b"{not json} x", False),
        (b"[1]", False),
        (b"{", False),
        (b"", False),
        (b"hello", False),
    ],
)
def test_could_be_frame(line: bytes, frame: bool) -> None:
    assert rawjson.could_be_frame(line) is frame


@pytest.mark.parametrize(
    ("raw", "exact_again"),
    [
        (b'{"a":1,"b":"x","c":[1.5,-2]}', True),
        (b'{"a":"1e5 and 12345678901234567890 in text"}', True),
        (b'{"a":1e5}', False),
        (b'{"a":12345678901234567890}', False),
        (b'{"a":0.30000000000000004}', False),
        (b'{"a":"\\ud83d\\ude00"}', False),
    ],
)
def test_reencodes_exactly(raw: bytes, exact_again: bool) -> None:
    assert rawscan.reencodes_exactly(raw) is exact_again


def test_member_bytes() -> None:
    raw = b'{"jsonrpc":"2.0","id":18446744073709551617,"method":"x","id":1E2}'
    assert rawscan.member_bytes(raw, "id") == b"1E2"
    assert rawscan.member_bytes(raw, "nope") is None
    assert rawscan.member_bytes(b"[1]", "id") is None


_ID_SPELLINGS = [
    "0",
    "-0",
    "7",
    "-12",
    "1.0",
    "1E2",
    "1e-3",
    "18446744073709551617",
    '"a"',
    '""',
    '"x y"',
    '"\\u0041"',
    '"a\\"b"',
    "null",
    "[1]",
    '{"id":2}',
]


@settings(max_examples=300, deadline=None)
@given(
    top=st.sampled_from(_ID_SPELLINGS),
    nested=st.one_of(st.none(), st.sampled_from(_ID_SPELLINGS)),
    repeat=st.one_of(st.none(), st.sampled_from(_ID_SPELLINGS)),
    key=st.sampled_from(['"id"', '"id"', '"\\u0069d"']),
    params=json_text(2),
    ws=WS,
    first=st.booleans(),
)
def test_id_bytes_is_member_bytes(
    *,
    top: str,
    nested: str | None,
    repeat: str | None,
    key: str,
    params: str,
    ws: str,
    first: bool,
) -> None:
    """The fast read of a request id's bytes gives exactly what the full member scan
    gives, whatever the spelling, escapes, nested or repeated ids around it."""
    members = [f'"jsonrpc":{ws}"2.0"', f'"method":{ws}"session/prompt"', f'"params":{ws}{params}']
    if nested is not None:
        members[2] = f'"params":{ws}{{"id":{ws}{nested},{ws}"p":{ws}{params}}}'
    member = f"{key}{ws}:{ws}{top}"
    members.insert(0 if first else len(members), member)
    if repeat is not None:
        members.append(f'"id":{repeat}')
    raw = ("{" + ws + ("," + ws).join(members) + ws + "}").encode()
    rawjson.loads(raw)  # a frame that parses, as the pipeline's callers guarantee
    assert rawscan.id_bytes(raw) == rawscan.member_bytes(raw, "id")


# --- through the rules (the pipeline's rewrite) -----------------------------------------------

EDGE_ROUTE = Rule(
    name="edge-route",
    set_meta={"example.dev/route": "edge"},
    direction=RuleDirection.AGENT_TO_CLIENT,
    update_kinds=("tool_call_update",),
)


@settings(max_examples=200, deadline=None)
@given(payload=json_text(), title=json_strings(), pretty=WS, batch=st.booleans())
def test_rules_change_only_the_meta_they_set(
    payload: str, title: str, pretty: str, batch: bool
) -> None:

    update = (
        '{"sessionUpdate":'
        + pretty
        + '"tool_call_update","toolCallId":"t1","title":'
        + title
        + ',"rawOutput":'
        + pretty
        + payload
        + "}"
    )
    frame = (
        '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        + update
        + "}}"
    ).encode()
    raw = b"[" + frame + b"]" if batch else frame
    conn = Connection(Chain([Link(RulesMiddleware([EDGE_ROUTE]))]))
    conn.handle(Direction.CLIENT_TO_AGENT, Line(b'{"jsonrpc":"2.0","id":0,"method":"initialize"}'))
    conn.handle(
        Direction.AGENT_TO_CLIENT, Line(b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2}}')
    )
    [out] = conn.handle(Direction.AGENT_TO_CLIENT, Line(raw)).forward
    expected = exact(raw)
    target = expected[0] if batch else expected
    target["params"]["update"]["_meta"] = {"example.dev/route": "edge"}
    assert exact(out.raw) == expected
    # Everything before the new member is the agent's own bytes.
    assert out.raw.startswith(raw[: raw.rindex(b"}}}")])


def test_deep_values_never_hit_the_recursion_limit() -> None:
    # A peer may nest 1024 levels (orjson's limit), past Python's recursion limit: an equal
    # copy made by a middleware, and JSON equality itself, must not raise RecursionError.
    raw = b'{"a":' + b"[" * 1000 + b"]" * 1000 + b"}"
    old = rawjson.loads(raw)
    copy = orjson.loads(raw)  # equal, no shared objects
    assert rawsplice.splice(raw, old, copy) == raw
    assert rawsplice.splice(raw, old, {**copy, "b": 1}) == raw[:-1] + b',"b":1}'
    assert rawjson.json_equal(old, copy)
    assert not rawjson.json_equal(old, {"a": [[[]]]})


def test_splicing_a_big_frame_makes_one_copy() -> None:
    """The spliced frame is built in one copy: ``raw[:i] + member + raw[i:]`` on a 4 MiB frame
    held two 4 MiB intermediates at once (the peak RSS of a big annotated frame showed it)."""
    import tracemalloc

    text = "tool output " * 400_000
    raw = orjson.dumps(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": "s", "update": {"sessionUpdate": "x", "text": text}},
        }
    )
    update = orjson.loads(raw)["params"]["update"]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        added = rawsplice.splice_member(
            raw, ("params", "update"), "_meta", None, {"a/b": 1}, present=False
        )
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert added == raw[:-3] + b',"_meta":{"a/b":1}}}}'
    assert peak < 1.5 * len(raw)
    # A member that is there: spliced in place, also in one copy.
    with_meta = added
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        changed = rawsplice.splice_member(
            with_meta, ("params", "update"), "_meta", {"a/b": 1}, {"a/b": 2}, present=True
        )
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert changed == raw[:-3] + b',"_meta":{"a/b":2}}}}'
    assert peak < 1.5 * len(raw)
    assert update["sessionUpdate"] == "x"
