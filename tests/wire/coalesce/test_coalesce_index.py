"""Tests of the coalescer's per-entity index, its merge pass and what its bound counts.

The index finds a line's partner (its entity's last waiting entry after the last barrier)
without comparing it with the rest of the queue; the merge pass runs only on lines that wait,
and stops paying when nothing merges; the byte bound counts what the queue holds in memory,
measured here with tracemalloc.
"""

from __future__ import annotations

import base64
import gc
import tracemalloc
from collections.abc import Callable

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.config import CoalesceConfig
from acp_proxy.meta.registry import (
    CHUNK_KINDS,
    SNAPSHOT_KINDS,
    UPSERT_KINDS,
    MetaRule,
    entity_key,
    upsert_entity_key,
)
from acp_proxy.wire.coalesce import queue as coalesce
from acp_proxy.wire.coalesce import shape as coalesce_shape
from acp_proxy.wire.coalesce.keys import Class, classify, table_of
from acp_proxy.wire.coalesce.queue import OutboundQueue, OutFrame

CFG = CoalesceConfig()
REQ = b'{"jsonrpc":"2.0","id":7,"method":"session/request_permission","params":{"sessionId":"s1"}}'


def su(update: JsonObject, sid: str = "s1") -> bytes:
    message = {"jsonrpc": "2.0", "method": "session/update"}
    return orjson.dumps({**message, "params": {"sessionId": sid, "update": update}})


def tcu(tid: str = "t1", **fields: JsonValue) -> bytes:
    return su({"sessionUpdate": "tool_call_update", "toolCallId": tid, **fields})


def chunk(text: str, mid: str = "m1") -> bytes:
    content: JsonObject = {"type": "text", "text": text}
    return su({"sessionUpdate": "agent_message_chunk", "messageId": mid, "content": content})


def waited(frames: list[bytes], config: CoalesceConfig = CFG) -> list[bytes]:
    """Push every frame while the writer is busy, then take: the frames written, one each."""
    queue = OutboundQueue(config, coalesce=True)
    for raw in frames:
        queue.push(OutFrame(raw, None, 2), 0.0)
    out, _ = queue.take(0.0)
    return [line for run in out for line in run[:-1].split(b"\n")]


# --- the index --------------------------------------------------------------------------------


def test_interleaved_entities_each_merge_into_their_own_last_entry() -> None:
    frames = [
        tcu("t1", status="pending"),
        tcu("t2", status="pending"),
        chunk("a", "m1"),
        tcu("t1", status="in_progress"),
        chunk("b", "m2"),
        tcu("t2", status="completed"),
        chunk("c", "m1"),
        tcu("t1", status="completed"),
    ]
    assert waited(frames) == [
        tcu("t1", status="completed"),
        tcu("t2", status="completed"),
        chunk("ac", "m1"),
        chunk("b", "m2"),
    ]


def test_a_barrier_between_two_updates_of_one_entity_keeps_both() -> None:
    frames = [tcu(status="pending"), REQ, tcu(status="completed"), tcu(status="failed")]
    # Nothing crosses the request; after it, a new run with its own index.
    assert waited(frames) == [tcu(status="pending"), REQ, tcu(status="failed")]


def test_a_clear_followed_by_an_object_stays_two_updates() -> None:
    # RFD: "Replacing a clear followed by an object with just that object is wrong when earlier
    # metadata may exist."
    frames = [tcu(_meta=None), tcu(_meta={"a": 1}), tcu(_meta={"b": None, "c": 2})]
    # The object composes the two patches (its removal kept), spliced into the last line.
    assert waited(frames) == [tcu(_meta=None), tcu(_meta={"b": None, "c": 2, "a": 1})]
    # ... and a later update of that entity merges into the object, never across the clear.
    frames = [tcu(status="x", _meta={"a": 1}), tcu(_meta=None), tcu(_meta={"d": 4}), chunk("z")]
    assert waited(frames) == [tcu(_meta=None, status="x"), tcu(_meta={"d": 4}), chunk("z")]


def test_an_entity_whose_last_entry_never_merges_starts_a_new_entry() -> None:
    # A line orjson would respell is kept as it came; the next update of the entity waits
    # behind it instead of merging into the entry before it (per-entity order).
    odd = tcu(status="x").replace(b'"status"', b'"rawInput":{"n":1.5E+2},"status"')
    frames = [tcu(status="a"), odd, tcu(status="b"), tcu(status="c")]
    assert waited(frames) == [tcu(status="a"), odd, tcu(status="c")]


def test_a_full_queue_merges_what_waits_then_refuses_and_drops_nothing() -> None:
    queue = OutboundQueue(CoalesceConfig(max_queue_messages=4), coalesce=True)
    for raw in (tcu("t0", status="a"), tcu("t1", status="a"), tcu("t2", status="a")):
        queue.push(OutFrame(raw, None, 2), 0.0)
    # The writer takes one line (the peer reads slowly): t1 and t2 wait, looked at.
    assert queue.take(0.0, 1) == ([tcu("t0", status="a") + b"\n"], None)
    for raw in (tcu("t1", status="b"), REQ):
        assert queue.has_room()
        queue.push(OutFrame(raw, None, 2), 0.0)
    assert len(queue) == 4
    assert queue.has_room() and len(queue) == 3  # at the bound, the pass merged t1
    queue.push(OutFrame(tcu("t1", status="c"), None, 2), 0.0)
    assert not queue.has_room() and len(queue) == 4  # nothing merges across REQ
    queue.push(OutFrame(tcu("t2", status="z"), None, 2), 0.0)  # owed: pushed regardless
    out, _ = queue.take(0.0)
    expected = [tcu("t1", status="b"), tcu("t2", status="a"), REQ, tcu("t1", status="c")]
    assert out == [b"\n".join([*expected, tcu("t2", status="z")]) + b"\n"]
    assert queue.has_room() and queue.pending_bytes == 0 and len(queue) == 0


# --- a pass that does not pay ------------------------------------------------------------------


def test_merging_that_does_not_pay_is_skipped_then_tried_again(looks: list[bytes]) -> None:
    calls = looks
    queue = OutboundQueue(CFG, coalesce=True)
    distinct = [tcu(f"t{i}", status="a") for i in range(200)]
    for raw in distinct[:100]:
        queue.push(OutFrame(raw, None, 2), 0.0)
    queue.push(OutFrame(REQ, None, 2), 0.0)
    out, _ = queue.take(0.0)
    # Each update looked at once (the request too on the bytes path: its scan stops at "id").
    assert [c for c in calls if c != REQ] == distinct[:100] and queue.stats.merged == 0
    calls.clear()
    # Nothing merged: the next 100 lines wait as they came, unparsed, in order.
    for raw in [*distinct[100:], tcu("t199", status="b")]:
        queue.push(OutFrame(raw, None, 2), 0.0)
    out, _ = queue.take(0.0)
    assert calls == [] and queue.stats.skipped == 101
    assert out == [b"\n".join([*distinct[100:], tcu("t199", status="b")]) + b"\n"]
    # Past the skipped lines, merging is tried again.
    for raw in [tcu("t1", status="x"), tcu("t1", status="y")]:
        queue.push(OutFrame(raw, None, 2), 0.0)
    assert queue.take(0.0) == ([tcu("t1", status="y") + b"\n"], None)


def test_a_paused_client_stops_the_reading_even_when_everything_merges() -> None:
    queue = OutboundQueue(CoalesceConfig(max_queue_messages=100), coalesce=True)
    read = 0
    while queue.has_room() and read < 10_000:  # bounded: it used to read forever
        queue.push(OutFrame(tcu(rawOutput={"p": read}), None, 2), 0.0)
        read += 1
    assert read == 200  # twice the bound, merged at the bound as it came
    assert len(queue) <= 100 and not queue.has_room()
    while queue.look(0.0, 1.0):  # merged while the writer waits...
        pass
    assert len(queue) == 1 and not queue.has_room()  # ... the writer took nothing: no reading
    # Filling a paused peer's buffer is no progress: the reading stays stopped.
    assert queue.take(0.0, paused=True) == ([tcu(rawOutput={"p": read - 1}) + b"\n"], None)
    assert not queue.has_room()
    queue.push(OutFrame(tcu(status="x"), None, 2), 0.0)  # (a reply owed, pushed regardless)
    assert queue.take(0.0) == ([tcu(status="x") + b"\n"], None)
    assert queue.has_room()  # the writer made progress: reading resumes


# --- the bound counts memory -------------------------------------------------------------------


def _terminal(data: bytes) -> bytes:
    encoded = base64.b64encode(data).decode()
    return su({"sessionUpdate": "terminal_output_chunk", "terminalId": "x1", "data": encoded})


STREAMS: dict[str, Callable[[int], bytes]] = {
    "distinct entities, nothing merges": lambda i: tcu(f"call_{i:06d}", status="pending"),
    "one tool call's progress": lambda i: tcu(
        "t1", status="in_progress", rawOutput={"p": i, "log": "x" * (i % 50)}, _meta={"k": i}
    ),
    "ten tool calls' progress": lambda i: tcu(f"t{i % 10}", rawOutput={"p": [i, i + 1]}),
    "text chunks of one message": lambda i: chunk(f"word{i} "),
    "eight messages' chunks, interleaved": lambda i: chunk(f"wörd{i} ", f"m{i % 8}"),
    "tool calls' creations, then status and content": lambda i: (
        tcu(f"t{i % 7}", title="Run", kind="execute", rawInput={"q": "x" * (i % 40)})
        if i < 7
        else tcu(f"t{i % 7}", status="in_progress", content=[{"type": "content", "n": i}])
    ),
    "plans and usage": lambda i: (
        su({"sessionUpdate": "usage_update", "used": i, "size": 9})
        if i % 2
        else su({"sessionUpdate": "plan_update", "plan": {"planId": "p", "entries": [i]}})
    ),
    "terminal output": lambda i: _terminal(b"line %d\n" % i),
}


@pytest.mark.parametrize("stream", list(STREAMS), ids=list(STREAMS))
def test_the_byte_bound_counts_what_the_queue_holds(stream: str) -> None:
    make = STREAMS[stream]
    config = CoalesceConfig(max_queue_messages=1000, max_queue_bytes=1 << 30)
    gc.collect()
    tracemalloc.start()
    try:
        queue = OutboundQueue(config, coalesce=True)
        base = tracemalloc.get_traced_memory()[0]
        for i in range(3000):
            if not queue.has_room():
                break
            # A frame as the shell reads it: a slice of a read, exactly its size (orjson's
            # output would keep a 4 KiB buffer each, which frames read never have).
            queue.push(OutFrame(bytes(bytearray(make(i))), None, 2), 0.0)
        queue.has_room()  # the merge pass at the bound
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held <= queue.pending_bytes
    # ... and not wildly more: the bound still lets the queue hold what it says.
    assert queue.pending_bytes <= 8 * held + 64 * 1024


# --- the keys agree with the registry ----------------------------------------------------------

SIDS = st.sampled_from(["s1", "s2"])
IDS = st.one_of(st.sampled_from(["a", "b"]), st.none(), st.integers(0, 1))


def _update(version: int) -> st.SearchStrategy[JsonObject]:
    kinds = sorted(
        {*UPSERT_KINDS[version], *CHUNK_KINDS[version], *SNAPSHOT_KINDS[version]}
        | {"plan_removed", "notice", "_x.dev/custom"}
    )
    fields = st.sampled_from(
        ["toolCallId", "messageId", "terminalId", "compactionId", "sessionId", "plan"]
    )
    members: st.SearchStrategy[dict[str, JsonValue]] = st.dictionaries(fields, IDS, max_size=3)
    plan: st.SearchStrategy[JsonValue] = st.one_of(st.none(), IDS.map(lambda v: {"planId": v}))

    def build(a: tuple[str, dict[str, JsonValue], JsonValue]) -> JsonObject:
        update: JsonObject = {"sessionUpdate": a[0], **a[1]}
        if a[2] is not None and "plan" in a[1]:
            update["plan"] = a[2]  # sometimes a plan object with an id, sometimes not
        return update

    return st.tuples(st.sampled_from(kinds), members, plan).map(build)


def _registry_key(message: JsonObject, version: int) -> tuple[Class, object] | None:
    """The class and entity the queue used before its index: the registry's own answers."""
    params = message["params"]
    assert isinstance(params, dict)
    update = params["update"]
    assert isinstance(update, dict)
    sid = params["sessionId"]
    assert isinstance(sid, str)
    kind = update["sessionUpdate"]
    upsert = UPSERT_KINDS[version].get(kind)  # type: ignore[arg-type]
    if upsert is not None:
        key = upsert_entity_key(upsert, sid, update)
        cls = Class.OPAQUE if upsert.meta_rule is MetaRule.CREATE else Class.UPSERT
    elif (chunk_kind := CHUNK_KINDS[version].get(kind)) is not None:  # type: ignore[arg-type]
        if chunk_kind.value_field == "data":
            cls = Class.B64_CHUNK
        elif chunk_kind.entity == "tool_call":
            cls = Class.OPAQUE
        else:
            cls = Class.TEXT_CHUNK
        if version == 1 and kind in {"user_message_chunk", "agent_message_chunk"} | {
            "agent_thought_chunk"
        }:
            key = ("v1_message_stream", sid)
        else:
            key = entity_key(message, version)
    elif kind in SNAPSHOT_KINDS[version]:
        cls, key = Class.SNAPSHOT, entity_key(message, version)
    else:
        return None
    return None if key is None else (cls, key)


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from([1, 2]), sid=SIDS, data=st.data())
def test_the_keys_table_gives_the_registry_s_answers(
    version: int, sid: str, data: st.DataObject
) -> None:
    update = data.draw(_update(version))
    message: JsonObject = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": sid, "update": update},
    }
    table = table_of(version)
    assert table is not None
    found = classify(message, table)
    expected = _registry_key(message, version)
    got = None if found is None else (found[0].cls, found[1])
    assert got == expected
    if found is not None:
        assert found[0].kind == update["sessionUpdate"] and found[0].version == version


def test_what_is_never_classified() -> None:
    table = table_of(2)
    assert table is not None and table_of(None) is None and table_of(3) is None
    good = orjson.loads(tcu(status="a"))
    assert classify(good, table) is not None
    for broken in (
        {**good, "id": 1},
        {**good, "jsonrpc": "1.0"},
        {**good, "method": "session/other"},
        {**good, "params": []},
        {**good, "params": {"sessionId": 1, "update": {}}},
        {**good, "params": {"sessionId": "s1", "update": {"sessionUpdate": ["x"]}}},
        [good],
    ):
        assert classify(broken, table) is None


@pytest.mark.parametrize("bytes_path", [True, False])
def test_a_merged_update_is_written_without_parsing_its_line_again(
    parses: list[bytes], bytes_path: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if bytes_path and not coalesce_shape.BYTES_PATH:
        pytest.skip("the bytes path needs the C accelerator")
    monkeypatch.setattr(coalesce, "BYTES_PATH", bytes_path)
    frames = [tcu(status="a", title="T"), tcu(status="b"), tcu(rawOutput={"n": 1})]
    assert waited(frames) == [tcu(rawOutput={"n": 1}, status="b", title="T")]
    if bytes_path:
        # No line parsed: the members later lines dropped are, to be encoded as the parse would
        # (the title when the second line came, the status when the third did).
        assert parses == [b'"T"', b'"b"']
    else:
        # Each line parsed once to classify it, the first once more to open the group; the
        # merged frame is spliced into the last line with the parse the merge already had.
        assert parses == [frames[0], frames[1], frames[0], frames[2]]
