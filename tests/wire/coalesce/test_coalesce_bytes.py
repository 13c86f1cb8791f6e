"""Tests of the coalescer's bytes path: merging from each line's shape, without a parse.

The C scan (``_scan.update_shape``) is held to its Python reference (``update_shape_py``) on
lines of every spelling, valid or not. The bytes path is held to the path that parses, byte for
byte, on the same streams and the same schedules of pushes, looks and takes (each family it
merges: text chunks, v2 upserts, snapshots, and everything mixed), and both to the client state
the unmerged stream gives, line by line, at every barrier and at the end.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from coalesce_harness import reduce
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_coalesce import (
    _finish,
    _is_barrier,
    _opt,
    items,
    meta_patch,
    odd_block,
    prefix_states,
    weighted,
)

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.config import CoalesceConfig
from acp_proxy.wire.coalesce import queue as coalesce
from acp_proxy.wire.coalesce import shape as coalesce_shape
from acp_proxy.wire.coalesce.keys import classify, table_of
from acp_proxy.wire.coalesce.merge import Group
from acp_proxy.wire.coalesce.queue import OutboundQueue, OutFrame
from acp_proxy.wire.coalesce.shape import (
    FAST_TABLES,
    FIELD_TABLE,
    FIELDS,
    IDENTS,
    KIND_TABLES,
    update_shape_py,
)
from acp_proxy.wire.raw import block_scan as scan

C_SHAPE = getattr(scan.ACCELERATOR, "update_shape", None)
needs_c = pytest.mark.skipif(C_SHAPE is None, reason="the bytes path needs the C accelerator")


def su(update: JsonObject, sid: str = "s1") -> bytes:
    params = {"sessionId": sid, "update": update}
    return orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params})


def tcu(tid: str = "t1", **fields: Any) -> bytes:
    return su({"sessionUpdate": "tool_call_update", "toolCallId": tid, **fields})


def waited(frames: list[bytes], version: int = 2) -> list[bytes]:
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    for raw in frames:
        queue.push(OutFrame(raw, None, version), 0.0)
    out, _ = queue.take(0.0)
    return [line for run in out for line in run[:-1].split(b"\n")]


# -- the shape: C against its reference -----------------------------------------------------------

_TEXTS = st.text(alphabet=st.sampled_from(list('ab "\\/\n\t\x01é✓😀\u2028')), max_size=5)
_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        _TEXTS,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_TEXTS, inner, max_size=3)
    ),
    max_leaves=4,
)
_KINDS = st.sampled_from(
    [
        "agent_message_chunk",
        "agent_thought_chunk",
        "tool_call_update",
        "plan_update",
        "usage_update",
        "state_update",
        "plan",
        "_x.dev/custom",
    ]
)
_MEMBERS = st.sampled_from(
    [
        "messageId",
        "toolCallId",
        "content",
        "status",
        "title",
        "_meta",
        "rawInput",
        "plan",
        "cost",
        "unknownField",
        "sessionId",
    ]
)


def _member_value(name: str) -> st.SearchStrategy[Any]:
    if name in ("messageId", "toolCallId"):
        return st.one_of(st.sampled_from(["m1", "t1", "é\\"]), _VALUES)
    if name == "content":
        text = st.fixed_dictionaries({"type": st.just("text"), "text": _TEXTS})
        return st.one_of(text, text, st.just({"text": "x", "type": "text"}), _VALUES)
    if name == "plan":
        return st.one_of(
            st.fixed_dictionaries({"planId": st.sampled_from(["p1", "p2"]), "entries": _VALUES}),
            _VALUES,
        )
    return _VALUES


_UPDATES: st.SearchStrategy[Any] = st.tuples(
    _KINDS, st.lists(_MEMBERS, max_size=5, unique=True)
).flatmap(
    lambda a: st.fixed_dictionaries(
        {"sessionUpdate": st.just(a[0]), **{m: _member_value(m) for m in a[1]}}
    )
)
_MESSAGES: st.SearchStrategy[Any] = st.fixed_dictionaries(
    {
        "jsonrpc": st.sampled_from(["2.0", "2.0", "2.0", "1.0"]),
        "method": st.sampled_from(["session/update", "session/update", "session/other"]),
        "params": st.fixed_dictionaries(
            {"sessionId": st.sampled_from(["s1", "sé", "s\\"]), "update": _UPDATES},
            optional={"_meta": _VALUES},
        ),
    },
    optional={"id": st.integers(0, 3)},
)

# Changes of the bytes that keep them JSON, or break them, or make them what the coalescer
# refuses (numbers orjson respells, surrogate escapes): the reference answers for each.
_EDITS: list[tuple[bytes, bytes]] = [
    (b'"sessionUpdate":', b'"sessionUpdate":"x","sessionUpdate":'),  # a key given twice
    (b'"messageId"', b'"message\\u0049d"'),  # a key spelled with an escape
    (b'"params":{', b'"params":{"sessionId":"s9",'),  # a repeated envelope key
    (b'"text":"', b'"text":"\\ud83d\\ude00'),  # a surrogate pair escape
    (b'"text":"', b'"text":"\\\\ud800'),  # what the surrogate check mistakes for one
    (b'"text":"', b'"text":"\\u00e9\\/'),  # escapes orjson would spell otherwise
    (b'"status":', b'"status":1E+2,"n":'),  # an exponent
    (b'"status":', b'"status":12345678901234567,"n":'),  # 17 digits
    (b'"status":', b'"status":-0.5,"n":[1.25,0,-0],"m":'),
    (b'"title":', b'"title":' + b"[" * 300 + b"]" * 300 + b',"n":'),  # deep nesting
    (b'"text":"', b'"text":"\x7f\xff'),  # not UTF-8
    (b'"text":"', b'"text":"\x01'),  # a raw control character
    (b'"text":"', b'"text":"\xed\xa0\x80'),  # an encoded surrogate
    (b'"text":"', b'"text":"\\x'),  # an invalid escape
    (b'{"type":"text"', b'{"type":"text","type":"text"'),
    (b'"planId":', b'"planId":"p0","planId":'),
    (b"}}}", b"}}} "),
    (b"}}}", b"}}}x"),
    (b":", b" :\t"),
    (b",", b" ,\r\n "),
    (b"true", b"tru"),
    (b"null", b"nul"),
    (b"0", b"01"),
    (b'"2.0"', b'"2\\u002e0"'),
]


def _spelled(message: Any, how: int) -> bytes:
    if how == 0:
        return orjson.dumps(message)
    if how == 1:
        return json.dumps(message, separators=(",", ":")).encode()  # \u escapes
    return json.dumps(message, ensure_ascii=False).encode()  # spaces


@needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from([1, 2]),
    message=_MESSAGES,
    how=st.integers(0, 2),
    edits=st.lists(st.sampled_from(_EDITS), max_size=2),
    cut=st.one_of(st.none(), st.integers(0, 400)),
    flip=st.one_of(st.none(), st.tuples(st.integers(0, 400), st.integers(0, 255))),
)
def test_the_c_shape_is_its_reference(  # noqa: PLR0917 - hypothesis draws each one
    version: int,
    message: Any,
    how: int,
    edits: list[tuple[bytes, bytes]],
    cut: int | None,
    flip: tuple[int, int] | None,
) -> None:
    try:
        raw = _spelled(message, how)
    except (TypeError, orjson.JSONEncodeError):  # an integer beyond 64 bits (orjson)
        raw = _spelled(message, 1)
    for old, new in edits:
        raw = raw.replace(old, new, 1)
    if cut is not None:
        raw = raw[:cut]
    if flip is not None and raw:
        at = flip[0] % len(raw)
        raw = raw[:at] + bytes([flip[1]]) + raw[at + 1 :]
    assert C_SHAPE is not None
    kinds = KIND_TABLES[version]
    expected = update_shape_py(raw, FIELDS, IDENTS, FIELD_TABLE, kinds)
    assert C_SHAPE(raw, FIELDS, IDENTS, FIELD_TABLE, kinds) == expected


@needs_c
def test_the_shape_of_a_line() -> None:
    raw = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s\\u00e9","update"'
    raw += b':{"sessionUpdate":"agent_message_chunk","messageId":"m1","content":{"text":"a\\n'
    raw += b'\\"b","type":"text"}}}}'
    kinds = KIND_TABLES[2]
    assert C_SHAPE is not None
    shape = C_SHAPE(raw, FIELDS, IDENTS, FIELD_TABLE, kinds)
    assert shape is not None and shape == update_shape_py(raw, FIELDS, IDENTS, FIELD_TABLE, kinds)
    fast, key, ident, mask, order, text, nulls, objects = shape
    assert fast is FAST_TABLES[2]["agent_message_chunk"] and order is None
    # The text as its literal's bytes: spelled as orjson spells it (else decoded, below).
    assert (key, ident, text) == (("agent_message", "sé", "m1"), "m1", b'a\\n\\"b')
    spelled = raw.replace(b'"text":"a', b'"text":"\\u00e9\\/a')
    assert C_SHAPE(spelled, FIELDS, IDENTS, FIELD_TABLE, kinds)[5] == 'é/a\n"b'
    assert mask == sum(coalesce_shape.bit(n) for n in ("sessionUpdate", "messageId", "content"))
    assert nulls == 0 and objects == coalesce_shape.bit("content")
    for broken in (raw[:-1], raw + b"x", raw.replace(b'"2.0"', b'"2.1"'), b"[" + raw + b"]"):
        assert C_SHAPE(broken, FIELDS, IDENTS, FIELD_TABLE, kinds) is None
    # A kind the bytes path does not merge (or spelled with an escape): the line is parsed.
    for other in (b"_x.dev/custom", b"agent\\u005fmessage_chunk", b"tool_call_content_chunk"):
        odd = raw.replace(b"agent_message_chunk", other)
        assert C_SHAPE(odd, FIELDS, IDENTS, FIELD_TABLE, kinds) is None


def test_a_shape_keys_its_line_as_classify_does() -> None:
    """Every kind the bytes path knows: the entity key from the shape is ``classify``'s."""
    for version, fasts in FAST_TABLES.items():
        table = table_of(version)
        assert table is not None
        for kind, fast in fasts.items():
            update: JsonObject = {"sessionUpdate": kind}
            for name in ("messageId", "toolCallId", "terminalId", "compactionId", "sessionId"):
                if fast.id_bit == coalesce_shape.bit(name):
                    update[name] = "e1"
            if fast.id_bit == coalesce_shape.bit("plan"):
                update["plan"] = {"planId": "p1", "entries": []}
            raw = su(update)
            shape = update_shape_py(raw, FIELDS, IDENTS, FIELD_TABLE, KIND_TABLES[version])
            assert shape is not None and shape[0] is fast
            assert (fast.spec, shape[1]) == classify(orjson.loads(raw), table)


# -- the bytes path against the path that parses -------------------------------------------------

_TEXT = st.sampled_from(["a", "b", "cd", "", "é✓", 'q"\\', "\n"])
_MIDS = st.sampled_from(["m1", "m2"])
_BLOCK = weighted([_TEXT.map(lambda t: {"type": "text", "text": t})] * 5 + [odd_block])


def _chunks(version: int) -> st.SearchStrategy[JsonObject]:
    kinds = st.sampled_from(["agent_message_chunk", "agent_thought_chunk", "user_message_chunk"])
    if version == 2:
        return st.tuples(kinds, _MIDS, _BLOCK).map(
            lambda a: {"sessionUpdate": a[0], "messageId": a[1], "content": a[2]}
        )
    return st.tuples(kinds, st.one_of(st.none(), _MIDS), _BLOCK).map(
        lambda a: {
            "sessionUpdate": a[0],
            **({"messageId": a[1]} if a[1] is not None else {}),
            "content": a[2],
        }
    )


_PATCH_META = weighted([meta_patch] * 4 + [st.just("malformed")])


def _keyed(
    update: str, field: str, ids: list[str], **options: Any
) -> st.SearchStrategy[JsonObject]:
    """Updates of kind ``update`` keyed by ``field`` (one of ``ids``), with a random subset of
    ``options`` (strategies built once: a strategy made per draw was slow to describe)."""
    return st.tuples(st.sampled_from(ids), _opt({}, **options)).map(
        lambda a: {"sessionUpdate": update, field: a[0], **a[1]}
    )


def _upserts(version: int) -> st.SearchStrategy[JsonObject]:
    tools = _keyed(
        "tool_call_update",
        "toolCallId",
        ["t1", "t2"],
        title=st.sampled_from(["T", "U", None]),
        kind=st.sampled_from(["read", "edit"]),
        status=st.sampled_from(["pending", "in_progress", "completed", None]),
        content=st.sampled_from([[], None, [{"type": "content", "content": {"a": 1}}]]),
        rawInput=st.sampled_from([{"q": "x"}, {"q": "é", "n": [1, None]}, None]),
        rawOutput=st.sampled_from([{"p": 1}, "out"]),
        _meta=_PATCH_META,
    )
    odd = tools.map(lambda u: {**u, "unknownField": 1})  # (the parse refuses it)
    messages = _keyed(
        "agent_message",
        "messageId",
        ["m1", "m2"],
        content=st.one_of(st.none(), st.lists(_BLOCK, max_size=2)),
        _meta=_PATCH_META,
    )
    info = _opt(
        {"sessionUpdate": "session_info_update"},
        title=st.sampled_from(["T", None]),
        updatedAt=st.just("2026-01-01"),
        _meta=_PATCH_META,
    )
    if version == 1:  # (v1 upserts take the path that parses: their null rules)
        return weighted([tools] * 6 + [odd])
    return weighted([tools] * 6 + [odd, messages, messages, info])


def _snapshots(version: int) -> st.SearchStrategy[JsonObject]:
    plans: st.SearchStrategy[JsonObject] = st.tuples(
        st.sampled_from(["p1", "p2"]), st.integers(0, 3)
    ).map(
        lambda a: {
            "sessionUpdate": "plan_update",
            "plan": {"type": "items", "planId": a[0], "entries": [a[1]]},
        }
    )
    usage = _opt(
        {"sessionUpdate": "usage_update", "used": 1, "size": 9},
        cost=st.sampled_from([None, {"amount": 1.5, "currency": "USD"}]),
        _meta=st.just({"k": 1}),
    )
    if version == 1:
        plan: st.SearchStrategy[JsonObject] = st.integers(0, 3).map(
            lambda n: {"sessionUpdate": "plan", "entries": [n]}
        )
        return weighted([plans, usage, usage, plan])
    state: st.SearchStrategy[JsonObject] = st.sampled_from(["running", "idle"]).map(
        lambda s: {"sessionUpdate": "state_update", "state": s}
    )
    return weighted([plans, usage, usage, state])


FAMILIES = {"text chunks": _chunks, "upserts": _upserts, "snapshots": _snapshots}
_BARRIERS = [
    b'{"jsonrpc":"2.0","id":7,"method":"session/request_permission","params":{"sessionId":"s1"}}',
    b'{"jsonrpc":"2.0","id":3,"result":{}}',
]


def _spell(update: JsonObject, sid: str, how: int) -> bytes:
    """One notification, spelled as different senders spell it."""
    message = {"jsonrpc": "2.0", "method": "session/update"}
    if how == 3:  # the update's members in another order
        update = dict(reversed(update.items()))
    message["params"] = {"sessionId": sid, "update": update}  # type: ignore[assignment]
    return _spelled(message, how % 3)


def _stream(family: str, version: int) -> st.SearchStrategy[list[bytes]]:
    line = st.tuples(
        FAMILIES[family](version), st.sampled_from(["s1", "s1", "s2"]), st.integers(0, 3)
    ).map(lambda a: _spell(*a))
    barrier = st.sampled_from(_BARRIERS)
    return st.lists(weighted([line] * 8 + [barrier]), min_size=2, max_size=24)


# Built once (a strategy built per example was described again each time).
_STREAMS = {(f, v): _stream(f, v) for f in FAMILIES for v in (1, 2)}


# One step of a consumer: take everything, take about N bytes, look for S seconds, ask for room.
_STEPS = st.sampled_from(
    [None] * 6 + [("take", None), ("take", 1), ("take", 300), ("look", 1.0), ("room", None)]
)


def _drive(
    frames: list[bytes], version: int, steps: list[Any], config: CoalesceConfig, bytes_path: bool
) -> tuple[list[bytes], tuple[int, ...]]:
    """The frames pushed one by one, the consumer's steps between them, then taken to the end:
    what was written (one line each) and the queue's counts."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(coalesce, "BYTES_PATH", bytes_path)
        queue = OutboundQueue(config, coalesce=True)
        out: list[bytes] = []
        now = 0.0
        for raw, step in zip(frames, steps, strict=True):
            if step is not None:
                op, arg = step
                if op == "take":
                    out.extend(queue.take(now, arg)[0])
                elif op == "look":
                    queue.look(now, arg)
                else:
                    queue.has_room()
            now += 0.02
            queue.push(OutFrame(raw, None, version), now)
            for entry in queue._done:  # what a group counts is what it holds, merge after merge
                assert not isinstance(entry, Group) or entry.recharge() == 0
        while True:
            taken, deadline = queue.take(now)
            out.extend(taken)
            if deadline is None:
                break
            now = deadline
        assert len(queue) == 0 and queue.pending_bytes == 0
    lines = [line for run in out for line in run[:-1].split(b"\n")]
    stats = queue.stats
    return lines, (stats.pushed, stats.written, stats.merged, stats.split, stats.passes)


def _same_as_parsing_and_the_unmerged_state(
    frames: list[bytes], version: int, steps: list[Any], config: CoalesceConfig
) -> list[bytes]:
    fast, fast_stats = _drive(frames, version, steps, config, True)
    parsed, parsed_stats = _drive(frames, version, steps, config, False)
    assert fast == parsed  # byte for byte
    assert fast_stats == parsed_stats
    # The client state, line by line: at every barrier (nothing crossed one) and at the end.
    assert reduce(fast, version) == reduce(frames, version)
    barriers = [f for f in frames if _is_barrier_line(f, version)]
    at_out = [n for n, f in enumerate(fast) if f in barriers]
    at_in = [n for n, f in enumerate(frames) if f in barriers]
    assert [fast[n] for n in at_out] == barriers
    assert prefix_states(fast, version, at_out) == prefix_states(frames, version, at_in)
    return fast


def _is_barrier_line(raw: bytes, version: int) -> bool:
    message = json.loads(raw)
    if "id" in message:
        return True
    return _is_barrier(raw, version)


_CONFIGS = st.sampled_from(
    [
        CoalesceConfig(),
        CoalesceConfig(max_queue_messages=3),
        CoalesceConfig(max_queue_messages=8),
        CoalesceConfig(min_interval_ms=50),
    ]
)


@needs_c
@pytest.mark.parametrize("family", list(FAMILIES))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_bytes_path_writes_what_the_parse_writes(family: str, data: st.DataObject) -> None:
    version = data.draw(st.sampled_from([1, 2]), label="version")
    frames = data.draw(_STREAMS[family, version], label="frames")
    steps = data.draw(st.lists(_STEPS, min_size=len(frames), max_size=len(frames)), label="steps")
    config = data.draw(_CONFIGS, label="config")
    _same_as_parsing_and_the_unmerged_state(frames, version, steps, config)


@needs_c
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_bytes_path_writes_what_the_parse_writes_on_any_stream(data: st.DataObject) -> None:
    """Every kind, mergeable or not, every barrier (``test_coalesce``'s streams)."""
    version = data.draw(st.sampled_from([1, 2]), label="version")
    seq = data.draw(items(version), label="items")
    seq = _finish(seq, version, [i.raw for i in seq if not i.barrier])
    frames = [item.raw for item in seq]
    steps = data.draw(st.lists(_STEPS, min_size=len(frames), max_size=len(frames)), label="steps")
    config = data.draw(_CONFIGS, label="config")
    fast, _ = _drive(frames, version, steps, config, True)
    parsed, _ = _drive(frames, version, steps, config, False)
    assert fast == parsed
    assert reduce(fast, version) == reduce(frames, version)


# -- the rules, case by case ----------------------------------------------------------------------


@needs_c
def test_a_tool_call_s_updates_merge_with_its_creation_s_members_carried(
    parses: list[bytes],
) -> None:
    meta, raw_input = {"a": 1}, {"q": "é"}
    created = tcu(title="Run", kind="execute", status="pending", rawInput=raw_input, _meta=meta)
    progress = [tcu(status="in_progress", content=[{"type": "content", "n": i}]) for i in range(3)]
    done = tcu(status="completed")
    out = waited([created, *progress, done])
    # The last line, then what only earlier lines had, in the order the merged update met them
    # (the creation's order), encoded as the parse encodes them.
    expected = done[:-3] + b',"title":"Run","kind":"execute","rawInput":' + orjson.dumps(raw_input)
    expected += b',"_meta":{"a":1},"content":[{"type":"content","n":2}]}}}'
    assert out == [expected]
    # Nothing parsed but the members a later line dropped, once each.
    assert sorted(parses) == sorted(
        [b'"Run"', b'"execute"', orjson.dumps(raw_input), b'{"a":1}', b'[{"type":"content","n":2}]']
    )


@needs_c
def test_two_meta_patches_compose_by_parsing(parses: list[bytes]) -> None:
    lines = [tcu(status="a", _meta={"a": 1, "b": 2}), tcu(status="b"), tcu(_meta={"a": None})]
    with_bytes = waited(lines)
    assert with_bytes == [tcu(_meta={"a": None, "b": 2}, status="b")]
    assert lines[2] in parses  # the third line: two patches compose, the parse does it


@needs_c
def test_a_usage_snapshot_keeps_its_cost_on_v2_and_stops_on_v1() -> None:
    cost: JsonObject = {"amount": 1.5, "currency": "USD"}
    with_cost = su({"sessionUpdate": "usage_update", "used": 1, "size": 9, "cost": cost})
    without = su({"sessionUpdate": "usage_update", "used": 2, "size": 9})
    carried = without[:-3] + b',"cost":' + orjson.dumps(cost) + b"}}}"
    assert waited([with_cost, without]) == [carried]
    assert waited([with_cost, without], version=1) == [with_cost, without]
    later = su({"sessionUpdate": "usage_update", "used": 3, "size": 9, "cost": cost})
    assert waited([with_cost, without, later]) == [later]  # the later snapshot, as it came


@needs_c
def test_a_line_the_shape_refuses_takes_the_path_that_parses() -> None:
    # Notification-level _meta (not a plain envelope): classified and merged by parsing.
    traced = orjson.loads(tcu(status="b"))
    traced["params"]["_meta"] = {"traceparent": "00-1"}
    frames = [tcu(status="a"), orjson.dumps(traced)]
    assert waited(frames) == frames  # (params._meta differs: never merged)
    spaced = json.dumps(orjson.loads(tcu(status="c")), ensure_ascii=False).encode()
    assert waited([tcu(status="a"), spaced]) == [spaced]
