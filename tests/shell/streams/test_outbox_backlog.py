"""The outbox's direct write when the client's pipe is nearly full: only the line the kernel
cuts becomes the writer's tail; the whole lines after it wait in the queue, where later updates
still merge into them (they used to leave as one unmerged tail, a read's worth at a time)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from acp_proxy.config import CoalesceConfig
from acp_proxy.shell.streams.outbox import Outbox, SideStats
from acp_proxy.shell.streams.transports import NonBlockingSend
from acp_proxy.wire.coalesce.queue import OutboundQueue, OutFrame

pytestmark = pytest.mark.anyio


def tcu(status: str, call: str = "t1") -> bytes:
    update = {"sessionUpdate": "tool_call_update", "toolCallId": call, "status": status}
    params = {"sessionId": "s1", "update": update}
    return orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params})


class NearlyFull(NonBlockingSend):
    """A stream whose kernel buffer takes ``room`` bytes, then nothing."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.taken = b""

    def try_send(self, data: bytes | memoryview) -> int:
        n = min(self.room, len(data))
        self.room -= n
        self.taken += bytes(data[:n])
        return n

    async def send(self, data: Any) -> None:  # pragma: no cover - the writer is not run
        raise AssertionError


async def test_lines_the_kernel_did_not_take_wait_in_the_queue_and_merge() -> None:
    stream = NearlyFull(room=10)
    outbox = Outbox(OutboundQueue(CoalesceConfig(), coalesce=True), stream, SideStats())  # type: ignore[arg-type]
    run = b"\n".join([tcu("a"), tcu("b"), tcu("c")])
    assert outbox.push((OutFrame(run, None, 2),), 0.0) is False  # written at once
    assert stream.taken == tcu("a")[:10]
    assert b"".join(bytes(p) for p in outbox.tail) == tcu("a")[10:] + b"\n"  # the cut line
    outbox.push((OutFrame(tcu("d"), None, 2),), 0.0)  # behind the tail: it waits
    frames, _ = outbox.queue.take(0.0)
    assert frames == [tcu("d") + b"\n"]  # b and c were waiting: d merged them away
    assert outbox.queue.stats.merged == 2


class NearlyFullVector(NearlyFull):
    """``NearlyFull`` with ``writev``: records the buffers it was given."""

    VECTORED = True

    def __init__(self, room: int) -> None:
        super().__init__(room)
        self.calls: list[list[Any]] = []

    def try_sendv(self, parts: list[bytes | memoryview]) -> int:
        self.calls.append(list(parts))
        return self.try_send(b"".join(bytes(p) for p in parts))


@pytest.mark.parametrize("coalesce", [True, False])
async def test_a_big_write_of_several_frames_is_not_joined_and_loses_nothing(
    coalesce: bool,
) -> None:
    """A read in full flow is several frames (the line completing the last read's partial one,
    the block's runs): they go to ``writev`` as they are, and what the kernel did not take is
    the cut line as the tail, then the whole lines after it in the queue, byte for byte."""
    first = tcu("first")
    run = b"\n".join([tcu("pending", f"t{i:05d}") for i in range(1200)])  # nothing merges
    batch = b"[" + tcu("x") + b"]"
    frames = (OutFrame(first, None, 2, 1), OutFrame(run, None, 2, 1200), OutFrame(batch, None, 2))
    stream_bytes = b"".join(f.raw + b"\n" for f in frames)
    assert len(stream_bytes) >= 64 * 1024
    room = len(first) + 1 + run.index(tcu("pending", "t00700")) + 17  # inside a line of the run
    stream = NearlyFullVector(room)
    outbox = Outbox(OutboundQueue(CoalesceConfig(), coalesce=coalesce), stream, SideStats())  # type: ignore[arg-type]
    assert outbox.push(frames, 0.0) is False
    [parts] = stream.calls
    assert parts[0] is first and parts[2] is run and parts[4] is batch  # no copy of them
    assert [bytes(p) for p in parts[1::2]] == [b"\n"] * 3
    assert stream.taken == stream_bytes[:room]
    cut = stream_bytes.index(b"\n", room) + 1
    assert b"".join(bytes(p) for p in outbox.tail) == stream_bytes[room:cut]
    waiting, _ = outbox.queue.take(0.0)
    assert b"".join(waiting) == stream_bytes[cut:]
    assert outbox.stats.bytes == room and outbox.stats.writes == 1
