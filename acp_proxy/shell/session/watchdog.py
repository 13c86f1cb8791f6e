"""The session watchdog: a wait that nothing will lift is a bug, logged loudly and lifted.

Contract: owns looking at each direction of a session, once every ``WATCH_S``, for a wait whose
condition already holds while its wake-up never came (a lost wake-up): a reader that waits for
room its queue has, or for reply room the sender's replies have; a writer parked without a
deadline while its queue holds frames. Each is logged at error level with the state of both
sides of the session, and lifted (the missing wake-up is given). It never reads, writes or
decides what a frame becomes, and a session whose wake-ups all arrive never hears from it.

A pending wake-up (set, its task not run yet) is not a lost one: the event loop runs a woken
task before the watchdog looks again, so only a wait with no wake-up pending is reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio

from acp_proxy.shell.streams.outbox import Outbox
from acp_proxy.shell.streams.reader import Reader

WATCH_S = 1.0


def lost_wakeups(reader: Reader, forward: Outbox, back: Outbox) -> Iterator[tuple[str, Outbox]]:
    """The lost wake-ups of one direction: (what was lost, the outbox whose wake-up it was).

    ``reader`` reads one peer; ``forward`` is the outbox toward the other peer, ``back`` the one
    toward the peer ``reader`` reads (its replies)."""
    waiting = reader.waiting
    # (``room_now``: a look that merged would make the room it then reports.)
    if waiting == "room" and not forward.reader_woken() and forward.queue.room_now():
        yield "reader waits for room that its queue has", forward
    elif waiting == "reply room" and not back.reader_woken() and back.has_reply_room():
        yield "reader waits for reply room that the replies have", back
    if forward.parked and not forward.writer_woken() and (len(forward.queue) or forward.replies):
        yield "writer parked while frames wait", forward


def side_state(reader: Reader, outbox: Outbox) -> dict[str, Any]:
    """What the log says of one direction: its reader, and the outbox it fills."""
    lines, nbytes = outbox.queue.paused_input
    return {
        "reader_waiting": reader.waiting,
        "reader_in_receive": reader.receiving is not None,
        "partial_line_bytes": reader.splitter.buffered,
        "queued_frames": len(outbox.queue),
        "queued_bytes": outbox.queue.pending_bytes,
        "has_room": outbox.queue.room_now(),
        "read_while_paused": {"lines": lines, "bytes": nbytes},
        "replies": len(outbox.replies),
        "tail_bytes": sum(len(part) for part in outbox.tail),
        "writer_busy": outbox.busy,
        "writer_parked": outbox.parked,
        "peer_gone": outbox.broken,
        "closed": outbox.closed,
    }


def check(
    log: Any,
    from_client: Reader,
    to_agent: Outbox,
    from_agent: Reader,
    to_client: Outbox,
) -> int:
    """One look at both directions: each lost wake-up logged (with both sides' state) and given.
    Returns how many were found."""
    found = [
        (direction, what, outbox)
        for direction, reader, forward, back in (
            ("agent_to_client", from_agent, to_client, to_agent),
            ("client_to_agent", from_client, to_agent, to_client),
        )
        for what, outbox in lost_wakeups(reader, forward, back)
    ]
    for direction, what, outbox in found:
        log.error(
            "watchdog: a lost wake-up stalled the session; lifting it (please report this bug)",
            direction=direction,
            stall=what,
            agent_to_client=side_state(from_agent, to_client),
            client_to_agent=side_state(from_client, to_agent),
        )
        if what.startswith("writer"):
            outbox.wake_writer()
        else:
            outbox.wake_reader()
    return len(found)


async def watch(
    log: Any, from_client: Reader, to_agent: Outbox, from_agent: Reader, to_client: Outbox
) -> None:
    """Look every ``WATCH_S`` until cancelled (the session ends)."""
    while True:
        await anyio.sleep(WATCH_S)
        check(log, from_client, to_agent, from_agent, to_client)
