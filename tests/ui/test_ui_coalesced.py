"""Merges the outbound queue made for a slow client, shown on the live view's timeline: the
queue tells its ``on_coalesced`` what each merged group became (and nothing when nobody
listens), the hub publishes a ``coalesced`` event, and a real session with a paused client shows
exactly the merges the client received."""

from __future__ import annotations

from typing import Any

import orjson
from ui_coalescing import CHUNKS, TEXT, chunks_read, paused_client, shown

from acp_proxy.config import CoalesceConfig
from acp_proxy.shell.ui.hub import UiHub
from acp_proxy.shell.ui.tap import UiTap
from acp_proxy.ui import events as stream
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.queue import OutboundQueue, OutFrame
from acp_proxy.wire.coalesce.take import Coalesced


def chunk(text: str, message: str = "m1") -> bytes:
    update = {
        "sessionUpdate": "agent_message_chunk",
        "messageId": message,
        "content": {"type": "text", "text": text},
    }
    note = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": "s", "update": update},
    }
    return orjson.dumps(note)


def drain(queue: OutboundQueue, frames: list[bytes]) -> bytes:
    for frame in frames:
        queue.push(OutFrame(frame, None, 2), 0.0)
    out, _ = queue.take(0.0)
    return b"".join(out)


FRAMES = [chunk("a"), chunk("b"), chunk("x", "m2"), chunk("c"), chunk("y", "m2"), chunk("z", "m3")]


def test_the_queue_tells_what_each_merged_group_became() -> None:
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    told: list[Coalesced] = []
    queue.on_coalesced = told.append
    written = drain(queue, FRAMES)
    lines = written.splitlines()
    assert lines == [chunk("abc"), chunk("xy", "m2"), chunk("z", "m3")]
    # m3 was not merged: nothing told about it.
    assert told == [
        Coalesced("agent_message_chunk", ("agent_message", "s", "m1"), 3, 1, len(lines[0]) + 1),
        Coalesced("agent_message_chunk", ("agent_message", "s", "m2"), 2, 1, len(lines[1]) + 1),
    ]


def test_without_a_listener_the_queue_writes_the_same_bytes() -> None:
    quiet = OutboundQueue(CoalesceConfig(), coalesce=True)
    told = OutboundQueue(CoalesceConfig(), coalesce=True)
    told.on_coalesced = lambda merge: None
    assert drain(quiet, FRAMES) == drain(told, FRAMES)
    assert quiet.stats == told.stats


def test_the_hub_publishes_a_coalesced_event() -> None:
    hub = UiHub()
    tap = UiTap(hub, hub.open_session({"acp-proxy-record": 1}))
    merge = Coalesced("tool_call_update", ("tool_call", "s", "c1"), 7, 1, 321)
    tap.on_coalesced(Direction.AGENT_TO_CLIENT, merge, tap.start + 1.5)
    hub.drain()
    event = list(hub.events())[-1]
    assert event == {
        "seq": 2,
        "conn": 1,
        "t": 1.5,
        "event": "coalesced",
        "direction": "agent_to_client",
        "update": "tool_call_update",
        "entity": ["tool_call", "s", "c1"],
        "frames": 7,
        "written": 1,
        "bytes": 321,
    }
    # Stream version 2 brought this event (3 added a frame's truncated field, 4 its policy).
    assert stream.hello("live", 0)["version"] == 4


def _merges(events: list[Any]) -> list[Any]:
    return [e for e in events if e.get("event") == "coalesced"]


def test_a_paused_clients_merges_are_shown_as_it_received_them() -> None:
    with paused_client() as session:
        chunk_frames = sum(1 for line in session.received if b'"method"' in line)

        def told(events: list[Any]) -> bool:
            # The view takes its events in batches: the last merges may show a moment after
            # the client read them. Waited for until every merged frame is accounted for.
            merges = _merges(events)
            gone = sum(m["frames"] - m["written"] for m in merges)
            return chunks_read(events) == CHUNKS and bool(merges) and gone == CHUNKS - chunk_frames

        events = shown(session.url, told)
        # Every chunk is shown as the session read it, and the merges as they were written.
        merges = _merges(events)
        assert {
            (m["direction"], m["update"], tuple(m["entity"]), m["written"]) for m in merges
        } == {("agent_to_client", "agent_message_chunk", ("agent_message", "s", "m1"), 1)}
        received = [orjson.loads(line) for line in session.received]
        texts = [m["params"]["update"]["content"]["text"] for m in received if m.get("method")]
        # The client got every chunk's text, in order, in fewer frames: as many fewer as the
        # merges say, and each merged frame as many bytes as its event says.
        assert "".join(texts) == "".join(f"{TEXT}{n:05d}" for n in range(CHUNKS))
        assert len(texts) == CHUNKS - sum(m["frames"] - m["written"] for m in merges)
        merged_sizes = sorted(m["bytes"] for m in merges)
        sizes = {len(line) for line in session.received}
        assert all(size in sizes for size in merged_sizes)
        # Each merge is shown in the session's conn, after the frames it merged (it happened
        # when they were written).
        assert all(m["conn"] == 1 for m in merges)
        first_chunk = next(e["seq"] for e in events if e.get("info", {}).get("update"))
        assert all(m["seq"] > first_chunk for m in merges)
