"""The block fast path (``LineSplitter.feed_blocks`` + ``Connection.handle_many`` on ``Block``s)
is an optimisation only: for any stream, any chunking and any chain, it must produce exactly what
feeding the lines one by one produces (wire bytes, replies, notes, counters, tracker state), with
either block scanner (``acp_proxy.wire.raw.block_scan``: the pure-Python one and the C
accelerator)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from line_fixtures import CLIENT_LINES, LINES, TagToolCalls, notif

from acp_proxy.config import NonJsonPolicy
from acp_proxy.wire.chain import (
    Chain,
    Direction,
    Link,
)
from acp_proxy.wire.connection.pipeline import Connection, Result
from acp_proxy.wire.framing import Block, Line, LineSplitter
from acp_proxy.wire.raw import block_scan
from acp_proxy.wire.raw.block_scan import ScanResult, scan_py

try:
    from acp_proxy.wire.raw import _scan

    C_SCAN: Callable[[bytes, tuple[bytes, ...]], ScanResult] | None = _scan.scan
except ImportError:
    C_SCAN = None

SCANNERS = [
    pytest.param("python", id="python"),
    pytest.param(
        "c", id="c", marks=pytest.mark.skipif(C_SCAN is None, reason="C accelerator not built")
    ),
]


@contextmanager
def scanner(name: str) -> Iterator[None]:
    """Run the pipeline's block path on one scanner (not a fixture: hypothesis reruns the body)."""
    saved = block_scan.scan
    block_scan.scan = scan_py if name == "python" else C_SCAN  # type: ignore[assignment]
    try:
        yield
    finally:
        block_scan.scan = saved


A2C = Direction.AGENT_TO_CLIENT
C2A = Direction.CLIENT_TO_AGENT


class TagWithNeedles(TagToolCalls):
    """The same middleware behind other needles (hostile ones included: blank, one byte)."""

    def __init__(self, needles: tuple[bytes, ...]) -> None:
        self.needles = needles


# Needles a middleware may declare: the usual one, and ones that hit blank, whitespace and
# every line, or (holding a newline) none.
ODD_NEEDLES = [(b'"tool_call_update"',), (b" ",), (b"",), (b"\n",), (b"t", b"\r"), (b"{",)]


@dataclass
class Run:
    wire: bytes
    replies: bytes
    notes: list[object]
    stats: dict[str, int]
    pending: tuple[int, int]


def drive(
    chunks_by_dir: list[tuple[Direction, bytes]],
    chain: Chain,
    *,
    blocks: bool,
    join: bool,
    non_json: NonJsonPolicy,
) -> Run:
    conn = Connection(chain, non_json=non_json)
    splitters = {A2C: LineSplitter(1 << 20), C2A: LineSplitter(1 << 20)}
    wire: list[bytes] = []
    replies: list[bytes] = []
    notes: list[object] = []

    def take(res: Result) -> None:
        for f in res.forward:
            # A run of lines carries its line count (the outbound queue does not count its
            # newlines again); a single line may leave it unset.
            assert f.lines == f.raw.count(b"\n") + 1 if b"\n" in f.raw else f.lines in {0, 1}
        wire.extend(f.raw + b"\n" for f in res.forward)
        replies.extend(f.raw + b"\n" for f in res.reply)
        notes.extend(res.notes)

    for direction, chunk in chunks_by_dir:
        sp = splitters[direction]
        events = sp.feed_blocks(chunk) if blocks else sp.feed(chunk)
        take(conn.handle_many(direction, events, join=join))
    for direction, sp in splitters.items():
        take(conn.handle_many(direction, sp.end(), join=join))
    return Run(
        b"".join(wire),
        b"".join(replies),
        notes,
        conn.stats.as_dict(),
        (conn.pending_client_requests, conn.pending_agent_requests),
    )


@st.composite
def traffic(draw: st.DrawFn) -> list[tuple[Direction, bytes]]:
    lines = draw(st.lists(st.tuples(st.sampled_from([A2C, C2A]), st.integers(0, 100)), max_size=40))
    streams: dict[Direction, bytes] = {A2C: b"", C2A: b""}
    for direction, i in lines:
        pool = LINES if direction is A2C else CLIENT_LINES
        streams[direction] += pool[i % len(pool)] + b"\n"
    # The initialize exchange first, so the chain is on for what follows.
    streams[C2A] = CLIENT_LINES[0] + b"\n" + streams[C2A]
    streams[A2C] = LINES[0] + b"\n" + streams[A2C]
    out: list[tuple[Direction, bytes]] = []
    for direction in (C2A, A2C):
        data = streams[direction]
        cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
        prev = 0
        for cut in [*cuts, len(data)]:
            out.append((direction, data[prev:cut]))
            prev = cut
    return out


@pytest.mark.parametrize("scan_name", SCANNERS)
@settings(max_examples=150, deadline=None)
@given(traffic(), st.booleans(), st.sampled_from(list(NonJsonPolicy)), st.booleans())
def test_blocks_equal_lines(
    scan_name: str,
    chunks: list[tuple[Direction, bytes]],
    with_chain: bool,
    non_json: NonJsonPolicy,
    join: bool,
) -> None:
    def chain() -> Chain:
        return Chain([Link(TagToolCalls())] if with_chain else [])

    by_line = drive(chunks, chain(), blocks=False, join=False, non_json=non_json)
    with scanner(scan_name):
        by_block = drive(chunks, chain(), blocks=True, join=join, non_json=non_json)
    assert by_block == by_line


@pytest.mark.parametrize("scan_name", SCANNERS)
@settings(max_examples=60, deadline=None)
@given(traffic(), st.sampled_from(ODD_NEEDLES), st.sampled_from(list(NonJsonPolicy)), st.booleans())
def test_blocks_equal_lines_with_odd_needles(
    scan_name: str,
    chunks: list[tuple[Direction, bytes]],
    needles: tuple[bytes, ...],
    non_json: NonJsonPolicy,
    join: bool,
) -> None:
    def chain() -> Chain:
        return Chain([Link(TagWithNeedles(needles))])

    by_line = drive(chunks, chain(), blocks=False, join=False, non_json=non_json)
    with scanner(scan_name):
        by_block = drive(chunks, chain(), blocks=True, join=join, non_json=non_json)
    assert by_block == by_line


@pytest.mark.parametrize("scan_name", SCANNERS)
def test_plain_block_is_one_frame_with_exact_bytes(scan_name: str) -> None:
    with scanner(scan_name):
        plain_block_is_one_frame_with_exact_bytes()


def plain_block_is_one_frame_with_exact_bytes() -> None:
    conn = Connection(Chain([Link(TagToolCalls())]))
    sp = LineSplitter(1 << 20)
    conn.handle_many(C2A, sp.feed(CLIENT_LINES[0] + b"\n"))
    conn.handle_many(A2C, LineSplitter(1 << 20).feed(LINES[0] + b"\n"))
    body = b"\n".join(
        [notif("agent_message_chunk")] * 3
        + [notif("tool_call_update")]
        + [notif("plan_update")] * 2
    )
    events = LineSplitter(1 << 20).feed_blocks(body + b"\n")
    assert events == [Block(body)] and Block(body).count == 6
    res = conn.handle_many(A2C, events, join=True)
    tagged = orjson.loads(notif("tool_call_update"))
    tagged["params"]["update"]["_meta"] = {"x.dev/k": 1}
    assert [f.raw for f in res.forward] == [
        b"\n".join([notif("agent_message_chunk")] * 3),
        orjson.dumps(tagged),
        b"\n".join([notif("plan_update")] * 2),
    ]
    assert [f.lines for f in res.forward] == [3, 0, 2]
    assert conn.stats.agent_to_client_in == 7 and conn.stats.agent_to_client_out == 7


@pytest.mark.parametrize("scan_name", SCANNERS)
def test_a_batch_or_blank_line_in_a_block_does_not_split_the_rest_into_lines(
    scan_name: str,
) -> None:
    """A batch (or a blank line) among plain updates goes through the per-line path
    alone; the ``{"`` lines around it are still forwarded as whole runs (it used to send the
    entire run line by line: a stream with the odd batch in it lost the block fast path)."""
    with scanner(scan_name):
        batch_or_blank_line_in_a_block()


def batch_or_blank_line_in_a_block() -> None:
    conn = Connection(Chain([Link(TagToolCalls())]))
    conn.handle_many(C2A, LineSplitter(1 << 20).feed(CLIENT_LINES[0] + b"\n"))
    conn.handle_many(A2C, LineSplitter(1 << 20).feed(LINES[0] + b"\n"))
    chunk = notif("agent_message_chunk")
    batch = b"[" + chunk + b"," + notif("plan_update") + b"]"
    body = b"\n".join([batch, chunk, chunk, batch, b"", b"  ", chunk, chunk, chunk, batch])
    events = LineSplitter(1 << 20).feed_blocks(body + b"\n")
    assert events == [Block(body)] and Block(body).count == 10
    res = conn.handle_many(A2C, events, join=True)
    assert [f.raw for f in res.forward] == [
        batch,
        chunk + b"\n" + chunk,
        batch,
        b"\n".join([chunk] * 3),
        batch,
    ]
    assert conn.stats.agent_to_client_in == 1 + 8 and conn.stats.agent_to_client_out == 1 + 8


def test_feed_blocks_splits_like_feed() -> None:
    sp = LineSplitter(100)
    assert sp.feed_blocks(b"ab") == []
    assert sp.feed_blocks(b"c\n{1}\n{2}\n{3") == [Line(b"abc"), Block(b"{1}\n{2}")]
    assert sp.feed_blocks(b"}\n") == [Line(b"{3}")]
    assert sp.feed_blocks(b"\n \n") == []
    assert sp.end() == []
    # Longer than the limit: falls back to per-line events (an oversize line may be inside).
    assert [type(e).__name__ for e in LineSplitter(4).feed_blocks(b"{1}\n{22222}\n")] == [
        "Line",
        "Oversize",
    ]


@pytest.mark.parametrize("scan_name", SCANNERS)
def test_a_block_whose_picked_lines_all_pass_is_forwarded_as_it_came(scan_name: str) -> None:
    """Batches of plain updates among plain updates: every line the scan picked passes
    untouched, so the block goes on as ONE frame, the very bytes object it came in (no run is
    cut out of it, which copied the read again); a batch holding a request still goes alone."""
    with scanner(scan_name):
        block_whose_picked_lines_all_pass()


def block_whose_picked_lines_all_pass() -> None:
    conn = Connection(Chain([Link(TagToolCalls())]))
    conn.handle_many(C2A, LineSplitter(1 << 20).feed(CLIENT_LINES[0] + b"\n"))
    conn.handle_many(A2C, LineSplitter(1 << 20).feed(LINES[0] + b"\n"))
    chunk = notif("agent_message_chunk")
    batch = b"[" + chunk + b"," + notif("plan_update") + b"]"
    body = b"\n".join([batch, chunk, chunk, batch, chunk, batch])
    events = LineSplitter(1 << 20).feed_blocks(body + b"\n")
    assert events == [Block(body)]
    res = conn.handle_many(A2C, events, join=True)
    assert len(res.forward) == 1
    block = events[0]
    assert isinstance(block, Block) and res.forward[0].raw is block.raw
    assert res.forward[0].lines == 6
    assert conn.stats.agent_to_client_in == 1 + 6 and conn.stats.agent_to_client_out == 1 + 6

    asks = b'[{"jsonrpc":"2.0","id":9,"method":"fs/read_text_file","params":{"sessionId":"s"}}]'
    body = b"\n".join([chunk, batch, chunk, asks, chunk])
    res = conn.handle_many(A2C, LineSplitter(1 << 20).feed_blocks(body + b"\n"), join=True)
    assert [f.raw for f in res.forward] == [
        chunk,
        batch,
        chunk,
        asks,
        chunk,
    ]
