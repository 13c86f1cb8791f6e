"""The session watchdog: a lost wake-up is found, logged with both sides' state, and lifted.

Real outboxes over real pipes; the lost wake-up is made by hand (room made in the queue without
the writer's wake-up), since the proxy's own wake-ups no longer lose one.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import orjson
import pytest

from acp_proxy.config import CoalesceConfig
from acp_proxy.shell.session import watchdog
from acp_proxy.shell.streams.outbox import Outbox, SideStats
from acp_proxy.shell.streams.reader import Reader
from acp_proxy.shell.streams.transports import FdStream
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.queue import OutboundQueue, OutFrame


class _Log:
    def __init__(self) -> None:
        self.errors: list[tuple[str, dict[str, Any]]] = []

    def error(self, event: str, **fields: Any) -> None:
        self.errors.append((event, fields))


def _update(i: int) -> bytes:
    update = {"sessionUpdate": "tool_call_update", "toolCallId": f"t{i}", "status": "pending"}
    message = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": "s", "update": update},
    }
    return orjson.dumps(message)


def _outbox(fd: int, *, coalesce: bool, max_queue: int = 4) -> Outbox:
    queue = OutboundQueue(CoalesceConfig(max_queue_messages=max_queue), coalesce=coalesce)
    return Outbox(queue, FdStream(None, fd, close_fds=False), SideStats())


@pytest.mark.anyio
async def test_a_reader_waiting_for_room_its_queue_has_is_logged_and_woken() -> None:
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        to_client = _outbox(w1, coalesce=True)
        to_agent = _outbox(w2, coalesce=False)
        from_agent = Reader(Direction.AGENT_TO_CLIENT, 1 << 20)
        from_client = Reader(Direction.CLIENT_TO_AGENT, 1 << 20)
        for i in range(4):
            to_client.queue.push(OutFrame(_update(i), None, 2), 0.0)
        assert not to_client.queue.has_room()
        log = _Log()
        woke = anyio.Event()

        async def reader() -> None:
            from_agent.waiting = "room"
            await to_client.wait_room()
            from_agent.waiting = None
            woke.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await anyio.sleep(0.01)
            # Nothing is lost while the wait is justified.
            assert watchdog.check(log, from_client, to_agent, from_agent, to_client) == 0
            # Room made without a wake-up: the lost wake-up the watchdog is there for.
            to_client.queue.take(0.0)
            assert watchdog.check(log, from_client, to_agent, from_agent, to_client) == 1
            with anyio.fail_after(5):
                await woke.wait()
        assert [event for event, _ in log.errors] == [
            "watchdog: a lost wake-up stalled the session; lifting it (please report this bug)"
        ]
        fields = log.errors[0][1]
        assert fields["direction"] == "agent_to_client"
        assert fields["stall"] == "reader waits for room that its queue has"
        assert fields["agent_to_client"] == {
            "reader_waiting": "room",
            "reader_in_receive": False,
            "partial_line_bytes": 0,
            "queued_frames": 0,
            "queued_bytes": 0,
            "has_room": True,
            "read_while_paused": {"lines": 0, "bytes": 0},
            "replies": 0,
            "tail_bytes": 0,
            "writer_busy": False,
            "writer_parked": False,
            "peer_gone": False,
            "closed": False,
        }
        assert fields["client_to_agent"]["reader_waiting"] is None
    finally:
        for fd in (r1, w1, r2, w2):
            os.close(fd)


@pytest.mark.anyio
async def test_a_writer_parked_while_frames_wait_is_logged_and_woken() -> None:
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        to_client = _outbox(w1, coalesce=True)
        to_agent = _outbox(w2, coalesce=False)
        readers = (
            Reader(Direction.CLIENT_TO_AGENT, 1 << 20),
            Reader(Direction.AGENT_TO_CLIENT, 1 << 20),
        )
        log = _Log()
        woke = anyio.Event()

        async def writer() -> None:
            await to_agent.wait_ready(None)
            woke.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            await anyio.sleep(0.01)
            assert to_agent.parked
            assert watchdog.check(log, readers[0], to_agent, readers[1], to_client) == 0
            to_agent.queue.push(OutFrame(_update(1), None, 2), 0.0)  # pushed, no wake-up
            assert watchdog.check(log, readers[0], to_agent, readers[1], to_client) == 1
            with anyio.fail_after(5):
                await woke.wait()
        assert [fields["stall"] for _, fields in log.errors] == ["writer parked while frames wait"]
        assert log.errors[0][1]["direction"] == "client_to_agent"
        assert log.errors[0][1]["client_to_agent"]["queued_frames"] == 1
    finally:
        for fd in (r1, w1, r2, w2):
            os.close(fd)


@pytest.mark.anyio
async def test_a_wait_at_the_bound_that_only_a_merge_would_lift_is_not_reported() -> None:
    """The watchdog looks without merging: a reader at the bound whose fresh frames would merge
    below it waits for the writer's look, which wakes it; the watchdog neither merges nor
    reports it (its own merge would have made the room it then called lost)."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        to_client = _outbox(w1, coalesce=True)
        to_agent = _outbox(w2, coalesce=False)
        from_agent = Reader(Direction.AGENT_TO_CLIENT, 1 << 20)
        from_client = Reader(Direction.CLIENT_TO_AGENT, 1 << 20)
        for _ in range(4):  # one tool call four times: merges into one
            to_client.queue.push(OutFrame(_update(1), None, 2), 0.0)
        from_agent.waiting = "room"
        log = _Log()
        assert watchdog.check(log, from_client, to_agent, from_agent, to_client) == 0
        assert len(to_client.queue) == 4 and log.errors == []
        assert to_client.queue.has_room() and len(to_client.queue) == 1  # (what a look does)
    finally:
        for fd in (r1, w1, r2, w2):
            os.close(fd)
