"""The outbox's direct write when the client's pipe is nearly full: only the line the kernel
cuts becomes the writer's tail; the whole lines after it wait in the queue, where later updates
still merge into them (they used to leave as one unmerged tail, a read's worth at a time)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from acp_proxy.config import CoalesceConfig
from acp_proxy.shell.outbox import Outbox, SideStats
from acp_proxy.wire.coalesce import OutboundQueue, OutFrame

pytestmark = pytest.mark.anyio


def tcu(status: str) -> bytes:
    update = {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": status}
    params = {"sessionId": "s1", "update": update}
    return orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params})


class NearlyFull:
    """A stream whose kernel buffer takes ``room`` bytes, then nothing."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.taken = b""

    def try_send(self, data: bytes) -> int:
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
