"""When merging pays: the queue merges only for a slow consumer, takes in pieces so that what
is not taken stays mergeable, and counts what it holds exactly; the writer keeps a slow peer's
kernel buffer short (a real pipe and a real slow reader).

The queue is pure (times are passed in); the outbox test runs the real writer task over a pipe.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.config import CoalesceConfig
from acp_proxy.meta.state import ClientModel
from acp_proxy.shell.streams import outbox as outbox_module
from acp_proxy.shell.streams.outbox import WRITE_CHUNK, Outbox, SideStats, write_all
from acp_proxy.shell.streams.transports import FdStream
from acp_proxy.wire.coalesce.gate import GATE_IDLE_MAX_S, GATE_MIN_S, GATE_UNREAD, STARVED_UNREAD
from acp_proxy.wire.coalesce.merge import Group
from acp_proxy.wire.coalesce.pace import RATE_WINDOW_S
from acp_proxy.wire.coalesce.queue import MERGE_COST_S, OutboundQueue, OutFrame
from acp_proxy.wire.coalesce.take import FRAME_OVERHEAD, Run
from acp_proxy.wire.written import rest_of

REQ = b'{"jsonrpc":"2.0","id":7,"method":"session/request_permission","params":{"sessionId":"s1"}}'


def tcu(tid: str = "t1", **fields: Any) -> bytes:
    update = {"sessionUpdate": "tool_call_update", "toolCallId": tid, **fields}
    params = {"sessionId": "s1", "update": update}
    return orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params})


def _state(lines: list[bytes]) -> object:
    """What a v2 client holds after applying ``lines`` in order."""
    model = ClientModel(2)
    for line in lines:
        model.apply(orjson.loads(line))
    return model.snapshot()


def written(out: list[bytes]) -> list[bytes]:
    return [line for run in out for line in run[:-1].split(b"\n")]


# -- taking in pieces ------------------------------------------------------------------------


def test_a_piece_is_taken_and_the_rest_still_merges() -> None:
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    for raw in (tcu("t1", status="a"), tcu("t2", status="a"), tcu("t3", status="a")):
        queue.push(OutFrame(raw, None, 2), 0.0)
    queue.push(OutFrame(tcu("t1", status="b"), None, 2), 0.0)
    # About one line's worth: the merged t1 only (whole lines, at least one).
    out, _ = queue.take(0.0, 10)
    assert written(out) == [tcu("t1", status="b")]
    assert len(queue) == 2
    # t2 still waits: a later update of it merges into it, t1's is a new entry (t1 was written).
    queue.push(OutFrame(tcu("t2", status="c"), None, 2), 0.0)
    queue.push(OutFrame(tcu("t1", status="c"), None, 2), 0.0)
    out, _ = queue.take(0.0)
    assert written(out) == [tcu("t2", status="c"), tcu("t3", status="a"), tcu("t1", status="c")]
    assert len(queue) == 0 and queue.pending_bytes == 0


def test_a_run_of_lines_is_cut_at_a_line_within_the_piece() -> None:
    queue = OutboundQueue(CoalesceConfig(enabled=False), coalesce=True)
    lines = [tcu(f"t{i}", status="a") for i in range(10)]
    queue.push(OutFrame(b"\n".join(lines), None, 2), 0.0)
    out, _ = queue.take(0.0, 3 * (len(lines[0]) + 1) + 5)
    assert written(out) == lines[:3]
    assert len(queue) == 7
    assert queue.pending_bytes == sum(len(x) + 1 for x in lines[3:]) - 1 + FRAME_OVERHEAD + 1
    out, _ = queue.take(0.0)
    assert written(out) == lines[3:]


def _held(queue: OutboundQueue) -> int:
    """What the queue holds, entry by entry (its own count must be the same)."""
    total = 0
    for entry in queue._done:
        if isinstance(entry, Group):
            total += entry.charge
        else:
            total += len(entry if isinstance(entry, bytes) else entry.raw) + 1 + FRAME_OVERHEAD
    for raw, _version, _lines in queue._fresh.frames:
        total += len(raw) + 1 + FRAME_OVERHEAD
    return total


_LINES = st.one_of(
    st.just(REQ),
    st.builds(
        lambda tid, status, pad: tcu(tid, status=status, rawOutput={"log": "x" * pad}),
        st.sampled_from(["t1", "t2", "t3"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 200),
    ),
    st.builds(lambda tid: tcu(tid, _meta=None), st.sampled_from(["t1", "t2"])),
)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.lists(_LINES, min_size=1, max_size=4)),
        # A run of lines whose number the shell's scan found (not counted again).
        st.tuples(st.just("push_counted"), st.lists(_LINES, min_size=1, max_size=4)),
        st.tuples(st.just("room"), st.none()),
        st.tuples(st.just("take"), st.sampled_from([None, 1, 300, 2000])),
        # The writer that sees its peer's pace: takes without a pass, merges while it waits.
        st.tuples(st.just("take_unlooked"), st.sampled_from([None, 1, 300, 2000])),
        st.tuples(st.just("look"), st.sampled_from([0.0, MERGE_COST_S * 70, 1.0])),
    ),
    max_size=60,
)


def _lines_held(queue: OutboundQueue) -> int:
    """The lines the queue holds, counted in its entries' bytes; the line counts it keeps
    beside them (a frame's, a run's) must be the same."""
    lines = 0
    for raw, _version, kept in queue._fresh.frames:
        assert kept == raw.count(b"\n") + 1
        lines += kept
    for entry in queue._done:
        if isinstance(entry, bytes):
            assert b"\n" not in entry  # one line
            lines += 1
        elif isinstance(entry, Run):
            assert entry.lines == entry.raw.count(b"\n") + 1 > 1
            lines += entry.lines
        else:
            lines += entry.lines
    return lines


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, bound=st.sampled_from([3, 8, 4096]))
def test_what_it_holds_is_counted_exactly_and_the_state_is_exact(
    ops: list[tuple[str, Any]], bound: int
) -> None:
    queue = OutboundQueue(CoalesceConfig(max_queue_messages=bound), coalesce=True)
    sent: list[bytes] = []
    out: list[bytes] = []
    now = 0.0
    for op, arg in ops:
        now += 0.001
        if op in {"push", "push_counted"}:
            lines = len(arg) if op == "push_counted" else 0
            queue.push(OutFrame(b"\n".join(arg), None, 2, lines), now)
            sent.extend(arg)
        elif op == "room":
            queue.has_room()
        elif op == "look":
            queue.look(now, arg)
        else:
            out.extend(queue.take(now, arg, look=op == "take")[0])
        # A group's parsed objects count from the moment it holds them (it used to miss what
        # the first look at a group's first line added).
        assert queue.pending_bytes - 400 * len(queue._run.index) == _held(queue)
        assert len(queue) == _lines_held(queue)
    out.extend(queue.take(now)[0])
    assert queue.pending_bytes == 0 and len(queue) == 0
    # The state at every barrier (the request) and at the end is the unmerged stream's.
    at_barrier: list[object] = []
    direct = ClientModel(2)
    for line in sent:
        if line == REQ:
            at_barrier.append(direct.snapshot())
        direct.apply(orjson.loads(line))
    model = ClientModel(2)
    seen: list[object] = []
    for line in written(out) if out else []:
        if line == REQ:
            seen.append(model.snapshot())
        model.apply(orjson.loads(line))
    assert seen == at_barrier
    assert model.snapshot() == direct.snapshot()


def test_the_merge_at_the_bound_is_bounded_and_the_looks_do_the_rest() -> None:
    """At its bound, ``has_room`` merges at most a few hundred waiting lines (the reader's task
    holds the event loop meanwhile); what is left stays fresh for the writer's looks."""
    queue = OutboundQueue(CoalesceConfig(max_queue_messages=600), coalesce=True)
    queue.consumed(len(tcu(status="0")) * 100, 1.0)  # a slow peer: merging pays
    frames = [tcu(f"t{i % 10}", status=str(i)) for i in range(1000)]
    for raw in frames:
        queue.push(OutFrame(raw, None, 2), 0.0)
    first, _ = queue.take(0.0, 1, look=False)  # the writer took a line: reading may go on
    assert first == [frames[0] + b"\n"]
    assert not queue.has_room()  # 256 of the 999 lines merged into 10; 743 wait fresh
    assert len(queue) == 10 + 743 and len(queue._fresh) == 743 and queue.stats.merged == 246
    while queue.look(0.0, 1.0):
        pass
    assert len(queue) == 10
    rest = written(queue.take(0.0, look=False)[0])
    assert _state([frames[0], *rest]) == _state(frames)


def test_a_group_counts_what_its_first_look_parsed() -> None:
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    big = {"log": "x" * 2000}
    queue.push(OutFrame(tcu("t1", rawOutput=big), None, 2), 0.0)
    queue.push(OutFrame(tcu("t1", status="b"), None, 2), 0.0)
    queue.push(OutFrame(REQ, None, 2), 0.0)
    queue.has_room()
    queue.take(0.0, 1)  # the pass; the group is written, the request waits
    groups = [e for e in queue._done if isinstance(e, Group)]
    assert groups == [] and queue.pending_bytes == len(REQ) + 1 + FRAME_OVERHEAD


# -- merging pays only for a slow consumer ---------------------------------------------------


def test_a_fast_consumer_gets_the_frames_unparsed(parses: list[bytes]) -> None:
    calls = parses
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    # The writer measured the peer reading 10 MB a second: 1 / MERGE_COST_S lines and more.
    queue.push(OutFrame(tcu(status="a"), None, 2), 0.0)
    queue.consumed(int(2 * len(tcu(status="a")) / MERGE_COST_S), 1.0)
    frames = [tcu(status=s) for s in "bcd"]
    for raw in frames:
        queue.push(OutFrame(raw, None, 2), 0.0)
    assert not queue.merging(0.0)
    out, _ = queue.take(0.0)
    assert written(out) == [tcu(status="a"), *frames] and calls == []


def test_a_slow_consumer_gets_them_merged(looks: list[bytes]) -> None:
    calls = looks
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    queue.push(OutFrame(tcu(status="a"), None, 2), 0.0)
    queue.consumed(len(tcu(status="a")) * 100, 1.0)  # 100 lines a second
    for s in "bcd":
        queue.push(OutFrame(tcu(status=s), None, 2), 0.0)
    assert queue.merging(0.0)
    out, _ = queue.take(0.0)
    assert written(out) == [tcu(status="d")]
    assert {tcu(status=s) for s in "abcd"} <= set(calls)  # each looked at


def test_a_peer_that_takes_every_write_at_once_is_not_waited_for() -> None:
    # Without a measure of the peer (a TCP socket), a write the kernel took whole says the peer
    # keeps up: nothing is merged until a write is partial again.
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    queue.peer_waits = False
    for s in "abc":
        queue.push(OutFrame(tcu(status=s), None, 2), 0.0)
    assert written(queue.take(0.0)[0]) == [tcu(status=s) for s in "abc"]
    queue.peer_waits = True
    for s in "abc":
        queue.push(OutFrame(tcu(status=s), None, 2), 0.0)
    assert written(queue.take(0.0)[0]) == [tcu(status="c")]


def test_the_writer_merges_while_it_waits_and_what_merged_goes_first(
    looks: list[bytes],
) -> None:
    """A look merges about as many lines as fit in the time given (``MERGE_COST_S`` a line);
    a take without a pass writes what was merged first, then the rest as it came, unparsed."""
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    queue.consumed(len(tcu(status="0")) * 100, 1.0)  # 100 lines a second: merging pays
    frames = [tcu(f"t{i % 2}", status=str(i)) for i in range(200)]
    for raw in frames:
        queue.push(OutFrame(raw, None, 2), 0.0)
    looks.clear()  # (pushing looks at nothing)
    calls = looks
    queue.look(0.0, 70.5 * MERGE_COST_S)  # 70 lines (whole frames)
    # Each line looked at once (parsed, or scanned on the bytes path), and each group's first
    # line once more when the group forms.
    assert len(calls) == 72 and set(calls) == set(frames[:70])
    assert len(queue) == 2 + 130
    # A piece of about one line: the first entity's merge, the rest waits.
    out, _ = queue.take(0.0, 10, look=False)
    assert written(out) == [tcu("t0", status="68")]
    out, _ = queue.take(0.0, look=False)
    assert written(out) == [tcu("t1", status="69"), *frames[70:]]
    assert set(calls) == set(frames[:70])  # the frames not looked at were never parsed
    assert len(queue) == 0 and queue.pending_bytes == 0


def test_a_paused_peer_s_merges_are_encoded_ahead_and_a_later_merge_undoes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A look with nothing fresh to merge (a paused peer, a full queue) encodes the merged
    groups ahead of the write, from the head, counted in what the queue holds; the write then
    encodes nothing. A group that merges a later line drops what was encoded: it writes the
    later state."""
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    queue.consumed(len(tcu(status="0")) * 100, 1.0)  # 100 lines a second: merging pays
    for raw in (tcu("t1", status="a"), tcu("t2", status="a"), REQ):
        queue.push(OutFrame(raw, None, 2), 0.0)
    for raw in (tcu("t3", status="a"), tcu("t3", status="b"), tcu("t4", status="a")):
        queue.push(OutFrame(raw, None, 2), 0.0)
    queue.push(OutFrame(tcu("t4", status="b"), None, 2), 0.0)
    queue.look(0.0, 1.0)  # merges: t3 and t4 become groups
    groups = [e for e in queue._done if isinstance(e, Group)]
    assert len(groups) == 2 and all(g.ready is None for g in groups)
    before = queue.pending_bytes
    queue.look(0.0, 1.0)  # nothing fresh: encoded ahead
    assert [g.ready for g in groups] == [[tcu("t3", status="b")], [tcu("t4", status="b")]]
    encoded = sum(len(tcu(t, status="b")) for t in ("t3", "t4"))
    assert queue.pending_bytes - before > encoded
    assert queue.pending_bytes - 400 * len(queue._run.index) == _held(queue)
    # t3 is offered a line it refuses (another notification-level _meta): its encoding holds.
    traced = orjson.loads(tcu("t3", status="z"))
    traced["params"]["_meta"] = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    queue.push(OutFrame(orjson.dumps(traced), None, 2), 0.0)
    queue.look(0.0, 1.0)
    assert groups[0].ready == [tcu("t3", status="b")]
    queue.push(OutFrame(tcu("t4", status="c"), None, 2), 0.0)
    queue.look(0.0, 1.0)  # t4 merges the later line: its encoding is dropped
    assert groups[0].ready is not None and groups[1].ready is None
    assert queue.pending_bytes - 400 * len(queue._run.index) == _held(queue)
    encodes: list[Group] = []
    encode = Group._encode

    def counting(group: Group) -> list[bytes]:
        encodes.append(group)
        return encode(group)

    monkeypatch.setattr(Group, "_encode", counting)
    out, _ = queue.take(0.0, look=False)
    assert written(out) == [
        tcu("t1", status="a"),
        tcu("t2", status="a"),
        REQ,
        tcu("t3", status="b"),
        tcu("t4", status="c"),  # merged into its earlier place: before t3's later line
        orjson.dumps(traced),
    ]
    assert encodes == [groups[1]]  # t3 was written as encoded ahead
    assert queue.pending_bytes == 0


def test_a_take_without_a_pass_leaves_what_it_did_not_take_mergeable() -> None:
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    queue.consumed(len(tcu(status="0")) * 100, 1.0)
    for i in range(100):
        queue.push(OutFrame(tcu(f"t{i % 4}", status=str(i)), None, 2), 0.0)
    size = sum(len(tcu(f"t{i % 4}", status=str(i))) + 1 for i in range(10))
    out, _ = queue.take(0.0, size, look=False)
    assert written(out) == [tcu(f"t{i % 4}", status=str(i)) for i in range(10)]
    queue.look(0.0, 1.0)
    # The rest merged: each entity's last update, in the order the entities came (t2 first).
    assert written(queue.take(0.0, look=False)[0]) == [
        tcu(f"t{i % 4}", status=str(i)) for i in (98, 99, 96, 97)
    ]


# -- the unread bytes of a peer, and the writer's gate -----------------------------------------


def test_a_pipe_says_what_its_reader_has_not_read() -> None:
    r, w = os.pipe()
    stream = FdStream(None, w, close_fds=False)
    try:
        os.write(w, b"x" * 1000)
        assert stream.unread() == 1000
        os.read(r, 300)
        assert stream.unread() == 700
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.anyio
async def test_the_writer_keeps_a_slow_reader_s_pipe_short() -> None:
    """A reader of 4 KiB every millisecond behind a 1 MiB pipe: while the queue merges, the
    writer keeps what the reader has not read near ``GATE_UNREAD`` (it used to fill the pipe:
    ~1,500 updates nothing could merge any more), and the reader ends in the exact state."""
    r, w = os.pipe()
    try:
        import fcntl

        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ, as the proxy does for its stdout
    except OSError:  # pragma: no cover - capped by the system
        pass
    stream = FdStream(None, w, close_fds=False)
    outbox = Outbox(OutboundQueue(CoalesceConfig(), coalesce=True), stream, SideStats())
    frames = [tcu(f"t{i % 50}", status=str(i), rawOutput={"log": "y" * 600}) for i in range(6000)]
    received = bytearray()
    peak = [0]

    def read_slowly() -> None:
        while True:
            unread = stream.unread() or 0
            peak[0] = max(peak[0], unread)
            data = os.read(r, 4096)
            if not data:
                return
            received.extend(data)
            time.sleep(0.001)

    reader = threading.Thread(target=read_slowly, daemon=True)
    reader.start()
    async with anyio.create_task_group() as tg:
        tg.start_soon(write_all, outbox, lambda: None, lambda: None)
        for i in range(0, len(frames), 100):
            while not outbox.queue.has_room():
                await outbox.wait_room()
            now = time.monotonic()
            if outbox.push(tuple(OutFrame(f, None, 2) for f in frames[i : i + 100]), now):
                outbox.flush_now(now)
            await anyio.sleep(0)
        outbox.close()
    os.close(w)
    await anyio.to_thread.run_sync(reader.join)
    os.close(r)
    lines = bytes(received).split(b"\n")[:-1]
    assert _state(lines) == _state(frames)
    assert len(lines) < len(frames) // 2
    assert peak[0] <= GATE_UNREAD + 2 * WRITE_CHUNK, peak[0]


@pytest.mark.anyio
async def test_a_paused_peer_s_buffer_is_filled_once_nothing_is_left_to_merge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader that pauses: at first the writer keeps its pipe short and merges what waits;
    once the peer has read nothing for ``GATE_PAUSED_S`` and nothing is left to merge or encode
    ahead, the writer fills the pipe and waits in the write, as with coalescing off (the kernel
    wakes it the moment the peer reads). The reader then ends in the exact state."""
    # 0.4 s instead of 0.1 s: under load the sampling thread may start 100 ms late, and would
    # then have nothing to judge the short pipe by.
    paused_s = 0.4
    monkeypatch.setattr(outbox_module, "GATE_PAUSED_S", paused_s)
    r, w = os.pipe()
    fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    stream = FdStream(None, w, close_fds=False)
    outbox = Outbox(OutboundQueue(CoalesceConfig(), coalesce=True), stream, SideStats())
    # 2,000 tool calls, two updates each: merged, still more than the pipe holds.
    frames = [tcu(f"t{i // 2}", status=str(i), rawOutput={"log": "y" * 600}) for i in range(4000)]
    received = bytearray()
    unread: dict[str, int] = {}
    start = time.monotonic()  # the gate's first look is later: no fill before start + 100 ms

    full = (1 << 20) - WRITE_CHUNK

    def read_later() -> None:
        # Early: the pipe is kept short. Late (from 3 ``paused_s`` on, for as long as a loaded
        # machine needs to merge and encode what waits, up to a minute): the pipe gets full
        # while the reader still reads nothing.
        early: list[int] = []
        while True:
            seen = stream.unread() or 0
            at = time.monotonic() - start  # taken after the look: ``seen`` is no later
            if at >= 3 * paused_s and (seen > full or at > 60):
                break
            if at < paused_s:
                early.append(seen)
            time.sleep(0.002)
        unread["early"] = max(early, default=-1)
        unread["late"] = seen
        while data := os.read(r, 1 << 16):
            received.extend(data)

    reader = threading.Thread(target=read_later, daemon=True)
    async with anyio.create_task_group() as tg:
        tg.start_soon(write_all, outbox, lambda: None, lambda: None)
        now = time.monotonic()
        assert outbox.queue.has_room()
        outbox.push(tuple(OutFrame(f, None, 2) for f in frames), now)
        reader.start()
        outbox.flush_now(now)
        outbox.close()
    os.close(w)
    await anyio.to_thread.run_sync(reader.join)
    os.close(r)
    assert 0 <= unread["early"] <= GATE_UNREAD + WRITE_CHUNK, unread
    assert unread["late"] > full, unread
    lines = bytes(received).split(b"\n")[:-1]
    assert _state(lines) == _state(frames)
    assert len(lines) < len(frames)


def test_a_paused_peer_is_looked_at_less_and_less_often_but_a_resumed_one_at_once() -> None:
    """While the peer reads nothing and its pace is unknown, the writer's wait doubles from
    ``GATE_MIN_S`` up to ``GATE_IDLE_MAX_S`` (a paused client costs few wake-ups, and one that
    resumes waits at most that long); as soon as it reads, the wait starts short again."""
    r, w = os.pipe()
    stream = FdStream(None, w, close_fds=False)
    outbox = Outbox(OutboundQueue(CoalesceConfig(), coalesce=True), stream, SideStats())
    try:
        fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4 * GATE_UNREAD)
        outbox.queue.push(OutFrame(tcu(status="a"), None, 2), 0.0)
        assert os.write(w, b"x" * (2 * GATE_UNREAD)) == 2 * GATE_UNREAD
        waits = [outbox.gate(0.001 * n) for n in range(7)]
        assert waits == [
            GATE_MIN_S,
            2 * GATE_MIN_S,
            4 * GATE_MIN_S,
            8 * GATE_MIN_S,
            GATE_IDLE_MAX_S,
            GATE_IDLE_MAX_S,
            GATE_IDLE_MAX_S,
        ]
        os.read(r, GATE_UNREAD // 2)  # it resumed, and is still behind
        wait = outbox.gate(0.007)
        assert wait is not None and wait < GATE_IDLE_MAX_S
    finally:
        os.close(r)
        os.close(w)


@contextlib.contextmanager
def _piped_outbox() -> Iterator[tuple[int, int, Outbox]]:
    """An outbox writing into a real pipe of 1 MiB: (its read end, its write end, the outbox)."""
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        stream = FdStream(None, w, close_fds=False)
        yield r, w, Outbox(OutboundQueue(CoalesceConfig(), coalesce=True), stream, SideStats())
    finally:
        os.close(r)
        os.close(w)


def test_a_peer_that_reads_everything_at_once_stops_the_merging() -> None:
    """A look that finds the peer read what it was given, down to less than ``STARVED_UNREAD``:
    the peer waits for the proxy, so the queue stops merging at once (a paused client that
    resumed is fed at the pace of a plain queue). It merges again once more than half of
    ``GATE_UNREAD`` stayed unread for a rate window, not sooner: right after a burst of writes
    a peer that keeps up has not read them yet."""
    with _piped_outbox() as (r, w, outbox):
        queue = outbox.queue
        queue.push(OutFrame(tcu(status="a"), None, 2), 0.0)
        assert outbox.gate(0.0) is None and outbox.gauged
        assert queue.peer_waits  # nothing given, nothing read: no word yet
        os.write(w, b"x" * (GATE_UNREAD // 2 + 1))
        outbox.gate(0.001)
        assert queue.peer_waits  # behind
        os.read(r, GATE_UNREAD // 2 + 1 - (STARVED_UNREAD - 1))  # one byte short of 16 KiB left
        outbox.gate(0.002)
        assert not queue.peer_waits  # it read what it was given
        os.write(w, b"x" * (GATE_UNREAD // 2 - STARVED_UNREAD + 2))  # half of GATE_UNREAD + 1
        outbox.gate(0.002 + RATE_WINDOW_S / 2)
        assert not queue.peer_waits  # behind, but not for a rate window yet
        outbox.gate(0.002 + RATE_WINDOW_S)
        assert queue.peer_waits
        os.read(r, 1 << 20)
        os.write(w, b"x" * 100)
        outbox.stats.bytes += 100  # as the writer counts what it wrote
        outbox.gate(0.008)
        assert not queue.peer_waits
        # A burst of writes it has not read yet (1 MiB): no merging within the rate window.
        os.write(w, b"x" * ((1 << 20) - 200))
        outbox.stats.bytes += (1 << 20) - 200
        outbox.gate(0.0085)
        assert not queue.peer_waits
        outbox.gate(0.008 + RATE_WINDOW_S)
        assert queue.peer_waits


def test_a_paused_peer_that_resumed_is_seen_to_have_read_its_buffer() -> None:
    """The first look after a long pause compares with the last one, however long ago: a peer
    that read down its full buffer is fed at once, without merging."""
    with _piped_outbox() as (r, w, outbox):
        queue = outbox.queue
        queue.push(OutFrame(tcu(status="a"), None, 2), 0.0)
        os.write(w, b"x" * (1 << 19))
        outbox.stats.bytes += 1 << 19
        outbox.gate(0.0)
        outbox.gate(0.1)
        assert queue.peer_waits and outbox.paused(0.2)  # it read nothing
        os.read(r, 1 << 20)  # three seconds later it reads all of it
        assert outbox.gate(3.0) is None
        assert not queue.peer_waits and not outbox.paused(3.0)


def test_the_rest_of_a_cut_run_keeps_its_line_count() -> None:
    """What the kernel did not take of a direct write waits in the queue with its line count
    (the written lines' newlines are counted, not the rest's); an unknown count stays unknown."""
    lines = [tcu(f"t{i}", status="a") for i in range(5)]
    raw = b"\n".join(lines)
    cut = len(lines[0]) + 1 + len(lines[1]) + 1
    rest = rest_of(OutFrame(raw, None, 2, 5), cut)
    assert (rest.raw, rest.lines, rest.version) == (b"\n".join(lines[2:]), 3, 2)
    assert rest_of(OutFrame(raw, None, 2), cut).lines == 0


@pytest.mark.anyio
async def test_the_reader_is_woken_once_a_paused_peer_s_queue_is_drained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader waiting for room is woken by the writer whenever a take may have made room,
    also when the take found nothing left to write. The lost wake-up this guards against: the
    reader stopped at the paused-input cap, the writer filled the paused peer's pipe with the
    whole queue, and its next take (nothing left, the cap lifted) woke nobody: the session hung
    with an empty queue, the agent blocked on its full pipe."""
    monkeypatch.setattr(outbox_module, "GATE_PAUSED_S", 0.0)
    with _piped_outbox() as (r, w, outbox):
        queue = OutboundQueue(CoalesceConfig(max_queue_messages=50), coalesce=True)
        outbox.queue = queue
        # The peer is paused with its pipe all but full: the writer's fill has to wait in
        # the write, and the reader looks at the queue meanwhile.
        full = (1 << 20) - 100
        os.write(w, b"x" * full)
        outbox.stats.bytes += full
        for i in range(100):
            queue.push(OutFrame(tcu(f"t{i % 2}", status=str(i)), None, 2), time.monotonic())
        assert not queue.has_room()
        woke = anyio.Event()
        looked = anyio.Event()

        async def reader() -> None:
            while not queue.has_room():
                looked.set()  # (after the writer's first wake-up: "no room" still)
                await outbox.wait_room()
            woke.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(write_all, outbox, lambda: None, lambda: None)
            tg.start_soon(reader)
            with anyio.fail_after(5.0):
                while not outbox.busy:  # the fill waits in the write
                    await anyio.sleep(0.001)
                await looked.wait()
            # The peer resumes and reads everything it is given.
            os.set_blocking(r, False)
            with anyio.move_on_after(5.0):
                while not woke.is_set():
                    with contextlib.suppress(BlockingIOError):
                        os.read(r, 1 << 20)
                    await anyio.sleep(0.001)
            outbox.close()
            tg.cancel_scope.cancel()
        assert woke.is_set()


@pytest.mark.anyio
async def test_a_paused_peer_s_reader_and_writer_do_not_wake_each_other_in_a_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a paused peer is not yet judged paused (``GATE_PAUSED_S``) and nothing is left to
    merge or encode ahead, the writer looks again only after its wait: it wakes the reader
    (waiting for room) only when a look did something, and the reader's wake-up of the writer
    is not answered by another wake-up of the reader. The bug this guards against: each woke
    the other at once, thousands of times in the 100 ms before the pause was judged (about
    70 ms of the proxy's CPU at every pause of a client)."""
    monkeypatch.setattr(outbox_module, "GATE_PAUSED_S", 10.0)  # never judged paused here
    watched_s = 0.25
    with _piped_outbox() as (_r, w, outbox):
        queue = OutboundQueue(CoalesceConfig(max_queue_messages=50), coalesce=True)
        outbox.queue = queue
        # The peer read nothing of what it was given, far above what the gate keeps unread.
        os.write(w, b"x" * (2 * GATE_UNREAD))
        outbox.stats.bytes += 2 * GATE_UNREAD
        for i in range(100):  # two tool calls: the reader reached the paused-input cap
            queue.push(OutFrame(tcu(f"t{i % 2}", status=str(i)), None, 2), time.monotonic())
        assert not queue.has_room()
        looks = [0]
        look = OutboundQueue.look

        def counted(self: OutboundQueue, now: float, seconds: float) -> bool:
            looks[0] += 1
            return look(self, now, seconds)

        monkeypatch.setattr(OutboundQueue, "look", counted)
        woken = [0]
        wait_space = Outbox._wait_space

        async def counted_wait(self: Outbox) -> None:
            woken[0] += 1
            await wait_space(self)

        monkeypatch.setattr(Outbox, "_wait_space", counted_wait)

        async def reader() -> None:
            await outbox.wait_room()

        async with anyio.create_task_group() as tg:
            tg.start_soon(write_all, outbox, lambda: None, lambda: None)
            tg.start_soon(reader)
            await anyio.sleep(watched_s)
            outbox.close()
            tg.cancel_scope.cancel()
    # At most one look per wait once the waits reached ``GATE_IDLE_MAX_S`` (a few shorter
    # ones before), however fast the machine; the loop made thousands.
    most = int(watched_s / GATE_IDLE_MAX_S) + 16
    assert 1 <= looks[0] <= most, looks
    assert 1 <= woken[0] <= most, woken
