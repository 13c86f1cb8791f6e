"""The live view's history (acp_proxy.ui.history): the shared byte stream every observer reads,
kept as blocks, compared with the plain list of events it stands for."""

from __future__ import annotations

import zlib

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.ui import history as history_module
from acp_proxy.ui.history import GZIP_HEADER, History


def chunk(seq: int, size: int) -> bytes:
    # A JSON string holding what a frame may hold: escaped newlines, "id: " and blank lines.
    text = f"x\n\nid: {seq + 1}\n" * (size // 10 + 1)
    return b"id: %d\ndata: %b\n\n" % (seq, orjson.dumps({"seq": seq, "text": text}))


def joined(parts: list[bytes | memoryview]) -> bytes:
    return b"".join(bytes(p) for p in parts)


# Each step: append an event of this size, then maybe seal (a batch ends), then maybe read.
steps = st.lists(
    st.tuples(st.integers(0, 3000), st.booleans(), st.booleans()), min_size=1, max_size=80
)


@settings(max_examples=150, deadline=None)
@given(steps, st.integers(1, 40_000), st.integers(0, 90), st.integers(1, 9000))
def test_the_blocks_are_the_stream(
    plan: list[tuple[int, bool, bool]], limit: int, since: int, batch: int
) -> None:
    history = History(limit)
    chunks: list[bytes] = []
    cursor = 0  # a reader taking batches as it goes
    got = b""
    lost = False
    for seq, (size, seal, read) in enumerate(plan, start=1):
        chunks.append(chunk(seq, size))
        history.append(seq, chunks[-1])
        if seal:
            history.seal()
        if read and not lost:
            found = history.read(cursor, batch)
            if found is None:
                lost = True  # what it had not read was dropped: it is cut off
            else:
                parts, cursor = found
                got += joined(parts)
    stream = b"".join(chunks)
    assert history.end == len(stream)
    assert history.last_seq == len(chunks)
    # Whatever is held is the stream's tail from an event boundary, within the bound (but
    # always the newest block, and never more than one block plus the open events past it).
    first = history.first_seq
    held = b"".join(chunks[first - 1 :])
    assert history.held == len(held)
    assert history.dropped == first - 1
    assert history.start == len(stream) - len(held)
    if first > 2:  # something was dropped: what is left fits the bound, or is one block
        assert history.held <= max(limit, len(chunks[-1]) + history_module.BLOCK_BYTES * 2)
    # A reader gets the stream in order, with no gap, until it is cut off.
    assert stream.startswith(got)
    # A replay from any seq is the stream from the event after it (or the oldest held).
    parts, missing = history.since(since)
    assert missing == max(0, first - since - 1)
    assert joined(parts) == b"".join(chunks[max(since, first - 1) :])
    assert list(history.data(since)) == [
        c[c.index(b"data: ") + 6 : -2] for c in chunks[max(since, first - 1) :]
    ]
    # Compressed (a reader that accepts gzip): the same bytes once inflated, from any event on.
    packed, _ = history.since(since, gzip=True)
    inflate = zlib.decompressobj(wbits=31)
    assert inflate.decompress(GZIP_HEADER + joined(packed)) == joined(parts)
    # ... and from a cursor, whole blocks. Their compressed copies count as held: past the
    # bound, the oldest blocks went.
    now_held = b"".join(chunks[history.first_seq - 1 :])
    found = history.read(history.start, 1 << 30, gzip=True)
    assert found is not None
    assert zlib.decompressobj(wbits=31).decompress(GZIP_HEADER + joined(found[0])) == now_held
    assert history.held >= len(b"".join(chunks[history.first_seq - 1 :]))


def test_a_reader_is_handed_slices_of_the_blocks_not_events() -> None:
    history = History(1 << 30)
    for seq in range(1, 1001):
        history.append(seq, chunk(seq, 50))
    history.seal()
    parts, offset = history.read(0, 1 << 30) or ([], 0)
    # 1,000 events of about 100 bytes: a couple of blocks, not a thousand buffers.
    assert len(parts) <= 1 + history.end // history_module.BLOCK_BYTES
    assert offset == history.end
    # A cursor in the middle of a block (a replay from seq 500) is one slice of it.
    start = history.offset_of(500)
    assert history.read(start, 1 << 30) is not None
    assert joined(history.read(start, 1 << 30)[0]).startswith(b"id: 500\n")  # type: ignore[index]


def test_a_reader_behind_what_is_held_is_told() -> None:
    history = History(1000)
    for seq in range(1, 200):
        history.append(seq, chunk(seq, 100))
        history.seal()
    assert history.dropped > 0
    assert history.read(0, 1 << 20) is None
    assert history.read(history.start, 1 << 20) is not None
