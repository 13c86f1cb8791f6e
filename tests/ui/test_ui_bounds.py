"""The live view's memory bound, counted deterministically (tracemalloc), not timed.

A session far faster than the view (the hub drains one slice now and then) taps a 5 MiB frame
and 6,000 small updates; what the hub allocates on top of the frames the session holds
anyway stays within its stated bound (``bound_bytes``) plus what one slice's work allocates for
a moment, and every frame tapped is either published or counted as lost, in its place.
"""

from __future__ import annotations

import hashlib
import threading
import tracemalloc
from collections.abc import Iterable
from types import SimpleNamespace

import anyio
import orjson
import pytest
from ui_inproc import serving

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.shell.ui import hub as ui_hub
from acp_proxy.shell.ui import tap as ui_tap
from acp_proxy.shell.ui.hub import HubLimits, UiHub
from acp_proxy.ui import events, export
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.notes import Observed

KIB = 1024
MIB = 1024 * KIB
SLICE_ALLOCATES = 8 * MIB  # one slice's events, a shown frame's copies, while it is built


def _update(i: int) -> bytes:
    if i % 2:
        update = {
            "sessionUpdate": "tool_call_update",
            "toolCallId": f"call_{i % 3000}",
            "title": "t" * 40,
            "_meta": {f"k{j}": "v" * 20 for j in range(4)},
        }
    else:
        content = {"type": "text", "text": f"chunk {i} " + "w" * 60}
        update = {"sessionUpdate": "agent_message_chunk", "content": content}
    params = {"sessionId": "s", "update": update}
    return orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params})


class _Session:
    config = SimpleNamespace(
        source=None, rule_names=(), rules=(), middleware=(), max_parse_bytes=1 << 20
    )


def test_the_hub_holds_no_more_than_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ui_hub, "INGEST_BYTES", 640 * KIB)  # (the first read fits)
    monkeypatch.setattr(ui_hub, "VIEWS_BYTES", 512 * KIB, raising=False)
    hub = UiHub(mode="live", limits=HubLimits(history_bytes=MIB))
    session = _Session()
    tap = hub.session_observer(session)
    text = b"x" * (5 * MIB)
    big = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
    big += b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"'
    big += text + b'"}}}}'
    frames = [big] + [_update(i) for i in range(6_000)]  # what the session holds anyway
    notes = [Observed(Direction.AGENT_TO_CLIENT, f, None, (), (), "message") for f in frames]
    published = {"frames": 0, "lost": 0, "lost_events": 0}
    publish = hub.publish
    first: dict[str, object] = {}

    def counting(event: JsonObject) -> None:
        if "dir" in event:
            if not published["frames"]:
                first.update(event)
            published["frames"] += 1
        elif event.get("event") == "lost":
            frames = event["frames"]
            assert isinstance(frames, int)
            published["lost"] += frames
            published["lost_events"] += 1
        publish(event)

    monkeypatch.setattr(hub, "publish", counting)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for start in range(0, len(notes), 500):
            tap.on_notes(tuple(notes[start : start + 500]), tap.start + start / 1000)
            hub.drain(ui_hub.DRAIN_SLICE)  # the view falls behind: the queue fills, drops
        while hub.drain(ui_hub.DRAIN_SLICE):
            pass
        held = tracemalloc.get_traced_memory()[0] - base
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    bound = hub.bound_bytes()
    assert bound == MIB + 640 * KIB + 512 * KIB
    assert hub.held_bytes() <= bound
    assert held <= bound + MIB  # (the builder's and joiner's own small state)
    assert peak <= bound + SLICE_ALLOCATES
    # Every frame was published or counted lost, in its session, where it was dropped (one
    # event for each run of drops).
    assert hub.ingest_lost > 0
    assert published["frames"] + published["lost"] == len(frames)
    assert published["lost"] == hub.ingest_lost
    assert published["lost_events"] < len(notes) // 500 * 2
    # The big frame's first bytes are shown, and how much of it was left out.
    assert first["truncated"] == len(big) - ui_tap.FRAME_SHOWN
    assert first["raw"] == big[: ui_tap.FRAME_SHOWN].decode()


async def _fetch(port: int, target: str) -> tuple[bytes, int, str]:
    """A request's response head, its body's length and SHA-256, the body not kept."""
    request = f"GET {target}&token=t HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    digest = hashlib.sha256()
    head = b""
    size = -1  # while the head is read
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request.encode())
        while True:
            try:
                chunk = await stream.receive(1 << 16)
            except anyio.EndOfStream:
                break
            if size < 0:
                head += chunk
                if b"\r\n\r\n" not in head:
                    continue
                head, _, chunk = head.partition(b"\r\n\r\n")
                size = 0
            digest.update(chunk)
            size += len(chunk)
    return head, size, digest.hexdigest()


@pytest.mark.anyio
async def test_history_and_export_go_out_in_pieces_built_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub = UiHub(mode="records", limits=HubLimits(history_bytes=16 * MIB))
    conn = hub.open_session({"acp-proxy-record": 1})
    for n in range(4000):  # about 8.7 MB of events
        hub.add_line(conn, {"t": n, "dir": "agent_to_client", "raw": f"{n} " + "x" * 2000})
    hub.published()
    hello = orjson.dumps(events.hello("records", hub.builder.head))
    history = hello + b"\n" + b"\n".join(hub.history.data()) + b"\n"
    record = export.record_lines(list(hub.events(conn)), hub.sessions[conn].header)
    on_loop: list[bool] = []
    feed = export.RecordWriter.feed

    def watched(self: export.RecordWriter, held: Iterable[JsonObject]) -> bytes:
        held = list(held)
        if held:
            on_loop.append(threading.current_thread() is threading.main_thread())
        return feed(self, held)

    monkeypatch.setattr(export.RecordWriter, "feed", watched)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        async with serving(hub) as served:
            got: list[tuple[bytes, int, str]] = []

            async def fetch(target: str) -> None:
                got.append(await _fetch(served.port, target))

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(fetch, "/history?since=0")
                tg.start_soon(fetch, f"/export?conn={conn}")
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    bodies = {(size, digest) for _, size, digest in got}
    assert bodies == {
        (len(history), hashlib.sha256(history).hexdigest()),
        (len(record), hashlib.sha256(record).hexdigest()),
    }
    assert all(head.startswith(b"HTTP/1.1 200 OK\r\n") for head, _, _ in got)
    # Five bodies of 8.7 MB at once: what the server allocates for them all is less than one
    # of them (pieces of PIECE_BYTES, read from the history as they go).
    assert peak < len(history)
    assert on_loop and not any(on_loop)  # the export was parsed and encoded in a worker thread


def test_an_ended_sessions_view_goes_first_then_a_live_one_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ui_hub, "VIEWS_BYTES", 64 * KIB)
    hub = UiHub(mode="records")
    ended = hub.open_session({"acp-proxy-record": 1})
    for i in range(30):
        hub.add_line(ended, {"t": i, "dir": "agent_to_client", "raw": _update(i).decode()})
    hub.add_line(ended, {"t": 30, "event": "end", "exit": None, "summary": {}})
    kept = hub.views_held
    assert 0 < kept <= 64 * KIB
    live = hub.open_session({"acp-proxy-record": 1})
    for i in range(60):
        hub.add_line(live, {"t": i, "dir": "agent_to_client", "raw": _update(i).decode()})
    # The ended session stays (its events, its export) without its panel; the live one's
    # panel stops where the bound was reached, and says so.
    assert set(hub.sessions) == {ended, live}
    assert hub.sessions[ended].view.snapshot()["stopped_at"] == 0
    snapshot = hub.sessions[live].view.snapshot()
    assert snapshot["truncated"] is True
    stopped = snapshot["stopped_at"]
    assert isinstance(stopped, int) and hub.builder.head - 60 < stopped <= hub.builder.head
    assert hub.views_held == hub.sessions[live].view.held <= 64 * KIB
