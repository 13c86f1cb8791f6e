"""The drain after a spawned agent exited: its last output and the errors it owes reach the client.

Contract: owns the time between the agent's exit and the end of its session: everything the
agent wrote, and the -32603 errors owed for the client's requests in flight, reach even a slow
or paused client for up to ``agent.drain_timeout``; then the rest is discarded and the log says
what. It never reads or writes a frame itself (the session's reader and writer do), and it
stops reading an output that a process outside the agent's group still holds open.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from acp_proxy.shell.agent.process import STDOUT_LINGER_S
from acp_proxy.shell.session.pump import PumpSession


async def drain_after_exit(session: PumpSession, log: Any, drain_timeout: float) -> None:
    """Return once ``session`` should be ended: the client got everything (and the writer toward
    the dead agent had one linger to finish), or ``drain_timeout`` passed (logged with what the
    client did not get). The caller cancels the session then."""
    deadline = time.monotonic() + drain_timeout
    # Its output is normally at EOF now. A reader that waits in receive() for a whole
    # linger means the pipe is empty yet open: a process outside the group still holds it.
    # (A reader waiting for the client to make room is not that: the client is slow.)
    while not session.agent_output_ended:
        now = time.monotonic()
        if now >= deadline:
            break
        idle = session.agent_receive_idle_s(now)
        if idle is not None and idle >= STDOUT_LINGER_S:
            log.warning(
                "the agent exited but its output is still open (held by a process outside "
                "its group); no longer reading it"
            )
            session.stop_agent_output()
            break
        wait = STDOUT_LINGER_S - idle if idle is not None else STDOUT_LINGER_S / 4
        await anyio.sleep(min(max(wait, 0.01), deadline - now))
    with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
        await session.to_client.finished.wait()
        # The client has everything; only the writer toward the dead agent can still be
        # stuck (its input held open by a process outside its group).
        await anyio.sleep(STDOUT_LINGER_S)
        log.warning("session did not finish after the agent exited; closing it")
        return
    log.warning(
        "the client did not take everything the agent wrote within agent.drain_timeout; "
        "discarding the rest",
        drain_timeout_s=drain_timeout,
        **session.undelivered(),
    )
