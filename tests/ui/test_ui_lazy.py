"""The live view pays only for what is watched: what it shows is the same whether it described
a frame as it came (an observer watching) or later (when asked), whether the session observed
or watched; while nobody looks nothing is described and what it keeps is bounded.

In-process: a ``Connection`` in each mode feeds a ``UiTap`` as the session would, the hub's
events are compared (every field, every event).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from line_fixtures import AGENT_LINES, USER_LINES, TagToolCalls
from ui_inproc import serving

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.config import NonJsonPolicy
from acp_proxy.shell.ui import hub as ui_hub
from acp_proxy.shell.ui import tap as ui_tap
from acp_proxy.shell.ui.hub import HubLimits, UiHub
from acp_proxy.shell.ui.tap import UiTap
from acp_proxy.ui.pending import LOST_BYTES, Pending
from acp_proxy.wire.chain import Chain, Direction, Link
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.pipeline import Connection
from acp_proxy.wire.framing import LineSplitter
from acp_proxy.wire.notes import AS_CAME, Result

A2C = Direction.AGENT_TO_CLIENT
C2A = Direction.CLIENT_TO_AGENT
BUDGET = 100_000
SECRET = "sk-" + "Zq9" * 10
EXTRA = [
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
    b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"key '
    + SECRET.encode()
    + b'"}}}}',
    b'{"jsonrpc":"2.0","method":"session/update","params":{"apiKey":"hunter2"}}',
    b'{"jsonrpc":"2.0","method":"session/update","params":{"text":"'
    + b"x" * 3000
    + b'"}}',  # longer than the FRAME_SHOWN of these tests
]


@contextmanager
def small_frames() -> Iterator[None]:
    """A view that keeps 2,000 bytes of a frame (not a fixture: hypothesis reruns the body)."""
    saved = ui_tap.FRAME_SHOWN
    ui_tap.FRAME_SHOWN = 2000  # type: ignore[misc]
    try:
        yield
    finally:
        ui_tap.FRAME_SHOWN = saved  # type: ignore[misc]


class _Config:
    source = None
    rule_names = ()
    rules = ()
    middleware = ()
    max_parse_bytes = BUDGET


class _Session:
    config = _Config()


def feed(
    hub: UiHub, chunks: list[tuple[Direction, bytes]], mode: str, tagged: bool = False
) -> UiTap:
    """The chunks through a connection in ``mode`` as the shell's reader feeds it, each read's
    notes to the hub's tap."""
    chain = Chain([Link(TagToolCalls())] if tagged else [])
    conn = Connection(
        chain,
        non_json=NonJsonPolicy.LOG,
        max_parse_bytes=BUDGET,
        observe=mode == "observe",
        watch=mode == "watch",
    )
    tap = hub.session_observer(_Session())
    splitters = {A2C: LineSplitter(1 << 20), C2A: LineSplitter(1 << 20)}
    for n, (direction, chunk) in enumerate(chunks):
        splitter = splitters[direction]
        line = splitter.single_line(chunk)
        if line is not None:
            got = conn.handle_line(direction, line)
            res = Result((OutFrame(line, None, None),)) if got is AS_CAME else got
        else:
            res = conn.handle_many(direction, splitter.feed_blocks(chunk), join=True)
        if res.notes:
            tap.on_notes(res.notes, tap.start + n)
    for direction, splitter in splitters.items():
        res = conn.handle_many(direction, splitter.end())
        if res.notes:
            tap.on_notes(res.notes, tap.start + len(chunks))
    return tap


def shown(hub: UiHub) -> list[JsonObject]:
    events = list(hub.events())
    for event in events:
        header = event.get("header")
        if isinstance(header, dict):
            header.pop("started")  # (the clock)
    return events


@st.composite
def traffic(draw: st.DrawFn) -> list[tuple[Direction, bytes]]:
    picks = draw(st.lists(st.tuples(st.sampled_from([A2C, C2A]), st.integers(0, 100)), max_size=30))
    agent = [*AGENT_LINES, *EXTRA]
    streams = {A2C: agent[0] + b"\n", C2A: USER_LINES[0] + b"\n"}
    for direction, i in picks:
        pool = agent if direction is A2C else [*USER_LINES, EXTRA[1]]
        streams[direction] += pool[i % len(pool)] + b"\n"
    out: list[tuple[Direction, bytes]] = []
    for direction in (C2A, A2C):
        data = streams[direction]
        cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
        prev = 0
        for cut in [*cuts, len(data)]:
            out.append((direction, data[prev:cut]))
            prev = cut
    return out


@settings(max_examples=120, deadline=None)
@given(traffic(), st.booleans())
def test_what_is_shown_is_the_same_observed_or_watched_eager_or_late(
    chunks: list[tuple[Direction, bytes]], tagged: bool
) -> None:
    with small_frames():
        # The old way: observed, described as it came.
        eager = UiHub()
        eager.subscribe()
        feed(eager, chunks, "observe", tagged)
        eager.drain()
        # Watched, described only when asked.
        late = UiHub()
        feed(late, chunks, "watch", tagged)
        assert late.described == 0 and late.history.end == 0  # nobody looked
        late.drain()
    assert shown(late) == shown(eager)
    assert late.described == eager.described
    text = orjson.dumps(shown(late)).decode()
    assert SECRET not in text and "hunter2" not in text


def _lines(n: int, size: int = 200) -> list[bytes]:
    pad = b"w" * (size - 80)
    return [
        b'{"jsonrpc":"2.0","method":"session/update","params":{"n":%d,"t":"%s"}}' % (i, pad)
        for i in range(n)
    ]


def _n(event: JsonObject) -> int:
    raw = event["raw"]
    assert isinstance(raw, str)
    n: int = orjson.loads(raw)["params"]["n"]
    return n


def _watched_hub(limits: HubLimits | None = None) -> tuple[UiHub, Connection, UiTap]:
    hub = UiHub(limits=limits)
    conn = Connection(Chain([]), watch=True)
    return hub, conn, hub.session_observer(_Session())


def _read(conn: Connection, tap: UiTap, lines: list[bytes], t: float = 0.0) -> None:
    res = conn.handle_many(A2C, LineSplitter().feed_blocks(b"\n".join(lines) + b"\n"), join=True)
    tap.on_notes(res.notes, tap.start + t)


def test_nobody_looks_nothing_is_described_and_the_ring_keeps_the_latest() -> None:
    hub, conn, tap = _watched_hub(HubLimits(history_bytes=64 * 1024))
    lines = _lines(2000)  # 400,000 bytes, read 100 lines at a time
    for start in range(0, 2000, 100):
        _read(conn, tap, lines[start : start + 100], start / 100)
        assert hub.held_bytes() <= 64 * 1024
    assert hub.described == 0 and hub.history.end == 0
    kept = hub.pending.held
    assert 64 * 1024 - 2 * (100 * 200 + ui_tap.ITEM_BYTES) < kept <= 64 * 1024
    events: list[JsonObject] = []
    publish = hub.publish

    def keeping(event: JsonObject) -> None:  # (the history holds less than all of them)
        events.append(event)
        publish(event)

    hub.publish = keeping  # type: ignore[method-assign]
    hub.drain()
    # The oldest went first (the session's start with them), counted where they were.
    [lost] = [e for e in events if e.get("event") == "lost"]
    assert events[0] == lost
    frames = [e for e in events if e.get("dir")]
    assert lost["frames"] == 2000 + 1 - len(frames)  # (+ the session's start)
    assert [_n(e) for e in frames] == list(range(2000 - len(frames), 2000))
    assert hub.ingest_lost == lost["frames"]


def test_nobody_looks_the_ring_holds_at_most_its_bound_whatever_the_history_may(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ui_hub, "INGEST_BYTES", 64 * 1024)
    hub, conn, tap = _watched_hub()  # (history_bytes: 64 MiB)
    lines = _lines(2000)  # 400,000 bytes, read 100 lines at a time
    for start in range(0, 2000, 100):
        _read(conn, tap, lines[start : start + 100], start / 100)
        assert hub.pending.held <= 64 * 1024
    assert hub.described == 0
    assert hub.pending.held > 64 * 1024 - 2 * (100 * 200 + ui_tap.ITEM_BYTES)
    assert hub.ingest_lost > 0


def test_the_events_and_the_ring_share_the_history_bound() -> None:
    hub, conn, tap = _watched_hub(HubLimits(history_bytes=256 * 1024))
    lines = _lines(3000)
    _read(conn, tap, lines[:500])
    hub.drain()  # (someone asked)
    described = hub.history.held
    assert described > 0
    for start in range(500, 3000, 100):
        _read(conn, tap, lines[start : start + 100])
        assert hub.history.held + hub.pending.held <= 256 * 1024 + 64 * 1024
    # The events went first (the newest block stays), then the oldest frames not described.
    assert hub.history.held < described and hub.ingest_lost > 0


def test_with_an_observer_frames_are_described_as_they_come_and_dropped_newest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ui_hub, "INGEST_BYTES", 50_000)
    hub, conn, tap = _watched_hub()
    hub.subscribe()
    lines = _lines(1000)
    for start in range(0, 1000, 100):
        _read(conn, tap, lines[start : start + 100])
        assert hub.pending.held <= 50_000 + LOST_BYTES
    assert hub.ingest_lost > 0
    while hub.drain(ui_hub.DRAIN_SLICE):
        pass
    events = [e for e in hub.events() if e.get("dir") or e.get("event") == "lost"]
    # What was described is a prefix of the stream, then one count of what was not.
    assert events[-1] == {**events[-1], "event": "lost", "frames": hub.ingest_lost}
    shown_n = [_n(e) for e in events[:-1]]
    assert shown_n == list(range(len(shown_n)))
    assert len(shown_n) + hub.ingest_lost == 1000


@pytest.mark.anyio
async def test_a_request_answers_with_everything_tapped_before_it() -> None:
    hub, conn, tap = _watched_hub()
    lines = _lines(700)
    _read(conn, tap, lines)
    assert hub.described == 0
    async with serving(hub) as served:
        status, body = await served.get("/history")
        assert status == 200
        events = [orjson.loads(line) for line in body.splitlines()]
        frames = [e for e in events if e.get("dir")]
        assert [f["raw"].encode() for f in frames] == lines
        assert events[1]["event"] == "session"
        # Then nobody looks again: what comes next waits.
        _read(conn, tap, lines[:3])
        assert hub.described == 700 and len(hub.pending.items) == 1
        status, body = await served.get(f"/export?conn={tap.conn}")
        assert status == 200 and body.count(b"\n") == 1 + 703
    assert hub.described == 703


def test_a_sessions_start_keeps_its_place_among_the_frames() -> None:
    hub = UiHub()
    first = hub.session_observer(_Session())
    first.on_generated(A2C, (b'{"a":1}',), first.start)
    second = hub.session_observer(_Session())
    second.on_generated(A2C, (b'{"b":2}',), second.start)
    hub.drain()
    order = [(e["conn"], e.get("event") or e["raw"]) for e in hub.events()]
    assert order == [(1, "session"), (1, '{"a":1}'), (2, "session"), (2, '{"b":2}')]


def test_the_ring_counts_what_came_and_what_left() -> None:
    ring = Pending()
    items: list[tuple[Any, ...]] = [(1, 0.0, "frame", 100), (1, 0.0, "run", None, [], 5, 300)]
    items += [(2, 0.0, "stderr", b"x", 50)]
    for item in items:
        ring.add(item)
    assert (ring.held, ring.added, ring.left) == (450, 3, 0)
    assert ring.refuse((2, 1.0, "run", None, [], 7, 99)) == 7
    assert ring.items[-1] == (2, 1.0, "lost", {2: 7}, LOST_BYTES)
    assert ring.drop_oldest(600) == 6  # the frame and the run of five
    assert ring.items[0] == (1, 0.0, "lost", {1: 6}, LOST_BYTES)
    assert (ring.held, ring.left, ring.lost) == (50 + 2 * LOST_BYTES, 2, 13)
    taken = ring.take()
    assert [i[2] for i in taken] == ["lost", "stderr", "lost"]
    assert (ring.held, ring.added, ring.left) == (0, 3, 3)


def test_a_slice_takes_no_more_frames_than_asked_for_of_a_run() -> None:
    ring = Pending()
    run = (1, 0.0, "run", "agent_to_client", [b"a\nbb", b"ccc", b"d\ne"], 5, 9 + 256)
    ring.add(run)
    [first] = ring.take(2)
    assert first == (1, 0.0, "run", "agent_to_client", [b"a", b"bb"], 2, 3)
    assert ring.items[0] == (1, 0.0, "run", "agent_to_client", [b"ccc", b"d", b"e"], 3, 6 + 256)
    assert (ring.held, ring.left) == (6 + 256, 0)  # (the run is not gone yet)
    assert [i[5] for i in ring.take(3)] == [3]
    assert (ring.held, ring.left) == (0, 1)


def test_the_hub_describes_a_read_in_slices() -> None:
    hub, conn, tap = _watched_hub()
    _read(conn, tap, _lines(700))  # one item
    hub.drain(ui_hub.DRAIN_SLICE)  # the session's start and 255 frames
    assert hub.described == ui_hub.DRAIN_SLICE - 1
    while hub.drain(ui_hub.DRAIN_SLICE):
        pass
    assert hub.described == 700 and hub.pending.held == 0
