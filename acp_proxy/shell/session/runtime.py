"""The proxy's sessions with a spawned or a remote agent, and the stdio entry point.

Contract: owns the lifecycle around one ``PumpSession`` (``session``): spawning the agent
(``run_proxy``: stdio, the signals, the recorder, the exit summary), the shutdown ladder that
takes a spawned agent down the same way whatever ended the session (``run_agent_session``: close
its stdin, wait ``grace_period``, SIGTERM its group, wait, SIGKILL; never an orphan), the drain
after its exit (``drain``), and the half-close of a remote agent's connection
(``run_remote_agent_session``). It never touches a frame: the session moves the bytes.

``run_proxy`` is the stdio entry point and owns the process's signals; the socket listener
(``sockets``) runs many sessions in one process and owns the signals itself. Both drive a
session through ``run_agent_session`` with a ``shutdown`` event, so every transport follows the
same lifecycle rules as stdio.
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from acp_proxy.config import Config
from acp_proxy.shell.agent.drain import drain_after_exit
from acp_proxy.shell.agent.process import (
    STDOUT_LINGER_S,
    AgentProcess,
    describe_status,
    exit_code_of,
    spawn_agent,
    spawn_error_exit,
)
from acp_proxy.shell.agent.spawn import SpawnError, early_signals
from acp_proxy.shell.agent.stderr import StderrTail, drain_stderr
from acp_proxy.shell.log.logsetup import get_logger
from acp_proxy.shell.session import hooks
from acp_proxy.shell.session.hooks import SessionObserver
from acp_proxy.shell.session.pump import PumpSession

if TYPE_CHECKING:
    from acp_proxy.shell.record.recorder import Recorder

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# After the agent died, how long the errors owed to the client wait for its last stderr lines.
STDERR_TAIL_WAIT_S = 0.5
# An agent connection without half-close (WebSocket), after the client's end of input: how
# often the session looks whether an answer is still owed.
ANSWERS_POLL_S = 0.01
# Where ``agent.stderr: passthrough`` copies the agent's stderr: the proxy's own.
STDERR_FD = 2


async def shutdown_on_signals(
    shutdown: anyio.Event,
    log: Any,
    event: str,
    signals: AsyncIterator[signal.Signals] | None = None,
) -> None:
    """Set ``shutdown`` on every SIGINT, SIGTERM or SIGHUP (logged as ``event``), until cancelled.

    One session's signal watcher, for stdio and ``--connect``: each signal takes the same
    ladder as client EOF. ``signals`` is a receiver the caller opened earlier (so
    that no signal is lost in between); without it, one is opened here.
    """
    if signals is None:
        with anyio.open_signal_receiver(*_SIGNALS) as own:
            await shutdown_on_signals(shutdown, log, event, own)
        return
    async for signum in signals:
        log.info(event, signal=signum.name)
        shutdown.set()


async def run_proxy(
    config: Config,
    agent_argv: list[str] | tuple[str, ...],
    *,
    client_stream: anyio.abc.ByteStream | None = None,
) -> int:
    """Spawn the agent, pump the session between it and the client, return the exit code.

    ``client_stream`` defaults to the proxy's own stdin/stdout. Returns the agent's exit code
    (128 + N when signal N ended it), or 127/126 when it cannot be spawned.
    """
    from acp_proxy.shell.streams.transports import stdio_stream

    log = get_logger()
    log.info(
        "starting",
        agent=list(agent_argv),
        config=config.source,
        rules=list(config.rule_names),
        middleware=[spec.name for spec in config.middleware],
    )
    # Signals are handled from before the spawn: one arriving right after the fork
    # takes the ladder, instead of the default action leaving the agent behind without us.
    recorder: Recorder | None = None
    if config.record.path is not None:
        # Imported only with a record path (start-up time).
        from acp_proxy.shell.record.recorder import exit_info, open_recorder

        refused: list[str] = []
        recorder = open_recorder(config, log=log, agent=agent_argv, refused=refused)
        if recorder is None:
            # --record names a file that cannot be written: a usage error, and the editor's
            # requests are answered with it (``startfail.answer_refusal``).
            from acp_proxy.shell.session.startfail import answer_refusal

            await answer_refusal(refused, client_stream)
            return 2
    with anyio.open_signal_receiver(*_SIGNALS) as signals:
        try:
            agent = await spawn_agent(agent_argv, config.agent)
        except SpawnError as exc:
            if recorder is not None:
                recorder.finish(None)
            code = spawn_error_exit(exc)
            from acp_proxy.shell.session.startfail import answer_start_failure

            client = client_stream if client_stream is not None else stdio_stream()
            await answer_start_failure(client, str(exc), log)
            return code
        log = log.bind(agent_pid=agent.pid)
        client = client_stream if client_stream is not None else stdio_stream()
        started = time.monotonic()
        shutdown = anyio.Event()
        # A signal that came between an early start (``spawn.start_early``) and the receiver
        # above takes the same ladder as one that comes now.
        for signum in early_signals():
            log.info("signal received; shutting the agent down", signal=signum.name)
            shutdown.set()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    shutdown_on_signals,
                    shutdown,
                    log,
                    "signal received; shutting the agent down",
                    signals,
                )
                rc, session = await run_agent_session(
                    config,
                    agent,
                    client,
                    client,
                    log=log,
                    shutdown=shutdown,
                    observers=[recorder] if recorder is not None else [],
                )
                tg.cancel_scope.cancel()
            if not shutdown.is_set() and not session.stats.client_eof:
                await answer_after_death(session, client, log)
        finally:
            if client_stream is None:
                with anyio.CancelScope(shield=True):
                    await client.aclose()
            if recorder is not None:
                recorder.finish(
                    exit_info(agent.returncode) if agent.returncode is not None else None
                )
    log.info(
        "exit",
        status=describe_status(rc),
        exit_code=exit_code_of(rc),
        duration_s=round(time.monotonic() - started, 3),
        **session.summary(),
    )
    return exit_code_of(rc)


async def answer_after_death(session: PumpSession, client: anyio.abc.ByteStream, log: Any) -> None:
    """The agent died with the client still there: answer each request the client sends next
    with the error the requests in flight got, until it closes its side or is silent for
    ``startfail.LINGER_S`` (``FIRST_WAIT_S`` when it has sent nothing yet), as when the agent
    cannot be started: a request written just after the first error is answered, not met with
    EOF."""
    from acp_proxy.shell.session.startfail import FIRST_WAIT_S, LINGER_S, answer_requests

    if session.agent_gone_reason is None:
        return
    data, detail = session.agent_gone_error()
    said = session.connection.stats.client_to_agent_in
    answered = await answer_requests(
        client,
        session.agent_gone_reason,
        detail=detail,
        data=data,
        first_wait_s=LINGER_S if said else FIRST_WAIT_S,
    )
    if answered:
        log.info("requests answered after the agent's exit", count=answered)


async def run_agent_session(
    config: Config,
    agent: AgentProcess,
    client_rx: anyio.abc.ByteReceiveStream,
    client_tx: anyio.abc.ByteSendStream,
    *,
    log: Any,
    shutdown: anyio.Event,
    observers: Sequence[SessionObserver] = (),
    on_session: Callable[[PumpSession], None] | None = None,
) -> tuple[int, PumpSession]:
    """Pump one client stream pair to/from a spawned ``agent`` and take it down with the ladder.

    Client EOF, or ``shutdown`` being set, starts the stdio ladder: close the agent's stdin, wait
    ``grace_period``, SIGTERM the group, wait, SIGKILL. Returns the agent's raw return code and the
    finished session. Never leaves the agent (or its group) behind, even when cancelled. The
    caller owns the client streams; ``on_session`` is told the session once it exists.
    """
    grace = config.agent.grace_period_s
    drain_timeout = config.agent.drain_timeout_s
    returncode: int | None = None
    input_closed = anyio.Event()
    shutdown_requested = anyio.Event()

    # The last lines of the agent's stderr go with the errors that answer its requests when it
    # dies (the last one in the message, the tail in ``error.data``): what the editor shows a
    # user whose agent failed at start.
    tail = StderrTail() if agent.stderr_fd is not None else None
    stderr_done = anyio.Event()

    def redact(raw: bytes) -> str:
        # Imported only when a line is logged or an agent died with stderr (start-up time).
        from acp_proxy.shell.log.framelog import redacted_text

        return redacted_text(config.record, raw)

    async def exit_reason() -> str:
        shutdown_requested.set()
        rc = await agent.wait()
        if tail is not None:
            with anyio.move_on_after(STDERR_TAIL_WAIT_S):
                await stderr_done.wait()  # its last lines, unless a leftover holds the pipe
        return f"agent {describe_status(rc)}"

    def exit_data() -> bytes | None:
        return tail.data(redact) if tail is not None else None

    def exit_detail() -> str | None:
        return tail.last_line(redact) if tail is not None else None

    session = PumpSession(
        config,
        client_rx,
        client_tx,
        agent.stdio,
        agent.stdio,
        log=log,
        agent_exit_reason=exit_reason,
        agent_exit_data=exit_data,
        agent_exit_detail=exit_detail,
        on_agent_input_closed=input_closed.set,
        observers=observers,
    )
    if on_session is not None:
        on_session(session)

    async def ladder() -> None:
        async with anyio.create_task_group() as inner:

            async def on_closed() -> None:
                await input_closed.wait()
                shutdown_requested.set()

            async def on_shutdown() -> None:
                await shutdown.wait()
                session.stop_client_input()
                shutdown_requested.set()

            inner.start_soon(on_closed)
            inner.start_soon(on_shutdown)
            await shutdown_requested.wait()
            inner.cancel_scope.cancel()
        if shutdown.is_set():
            session.stop_client_input()
        with anyio.move_on_after(grace):
            await input_closed.wait()
            await agent.wait()
            return
        if agent.returncode is None:
            log.warning("agent still running after grace period; sending SIGTERM", grace_s=grace)
            agent.signal_group(signal.SIGTERM)
            with anyio.move_on_after(grace):
                await agent.wait()
                return
            log.warning("agent ignored SIGTERM; sending SIGKILL")
            agent.signal_group(signal.SIGKILL)

    async def watch_exit(cancel: anyio.CancelScope) -> None:
        nonlocal returncode
        returncode = await agent.wait()
        agent.reap_group()
        log.info("agent " + describe_status(returncode), exit_code=exit_code_of(returncode))
        hooks.agent_exited(returncode)
        # Everything the agent wrote, and the errors owed to the client, reach even a slow or
        # paused client, for up to ``drain_timeout`` after the exit; then the rest is discarded.
        await drain_after_exit(session, log, drain_timeout)
        cancel.cancel()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ladder)
            if agent.stderr_fd is not None:
                stderr_fd, agent.stderr_fd = agent.stderr_fd, None

                async def drain() -> None:
                    try:
                        await drain_stderr(
                            stderr_fd,
                            log.bind(stream="agent_stderr"),
                            tail,
                            session,
                            copy_to=STDERR_FD if agent.stderr_passthrough else None,
                            redact=redact,
                        )
                    finally:
                        stderr_done.set()

                tg.start_soon(drain)
            else:
                stderr_done.set()
            tg.start_soon(watch_exit, tg.cancel_scope)
            await session.run()
            if returncode is None:
                returncode = await agent.wait()
            # The group is dead, so its stderr is at EOF: let the last lines reach the log.
            with anyio.move_on_after(STDOUT_LINGER_S):
                await stderr_done.wait()
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if agent.returncode is None:  # cancelled: never leave the agent behind
                agent.signal_group(signal.SIGKILL)
                await agent.wait()
            agent.reap_group()
            await agent.aclose()
    rc = agent.returncode if agent.returncode is not None else returncode
    assert rc is not None
    return rc, session


async def run_remote_agent_session(
    config: Config,
    agent_stream: anyio.abc.ByteStream,
    client_rx: anyio.abc.ByteReceiveStream,
    client_tx: anyio.abc.ByteSendStream,
    *,
    log: Any,
    shutdown: anyio.Event,
    agent_label: str,
    observers: Sequence[SessionObserver] = (),
    on_session: Callable[[PumpSession], None] | None = None,
) -> tuple[bool, PumpSession]:
    """Pump one client stream pair to/from an agent reached over a socket (``--connect``).

    Client EOF or ``shutdown`` half-closes the agent connection (the agent reads EOF, as with
    stdin); if the agent has not closed its side ``grace_period`` later, the session is ended.
    Returns ``(lost, session)``: ``lost`` is True when the agent side ended while the client was
    still sending, in which case every client request in flight got a -32603 error response
    naming the address (a lost connection answers the requests in flight with errors).
    The caller owns (and closes) all streams; ``on_session`` is told the session once it exists.
    """
    grace = config.agent.grace_period_s
    input_closed = anyio.Event()
    lost = False

    async def exit_reason() -> str:
        nonlocal lost
        if input_closed.is_set():
            return f"agent connection to {agent_label} closed"
        lost = True
        return f"agent connection to {agent_label} was lost"

    session = PumpSession(
        config,
        client_rx,
        client_tx,
        agent_stream,
        agent_stream,
        log=log,
        agent_exit_reason=exit_reason,
        on_agent_input_closed=input_closed.set,
        observers=observers,
    )
    if on_session is not None:
        on_session(session)

    async def on_shutdown() -> None:
        await shutdown.wait()
        session.stop_client_input()

    async def after_input_closed() -> None:
        await input_closed.wait()
        with anyio.move_on_after(grace):
            if getattr(agent_stream, "half_close", True):
                await anyio.sleep_forever()
            # No half-close (a WebSocket): the agent cannot see the end of the input, so the
            # connection ends once no answer is owed (or after the grace period).
            while session.connection.pending_client_requests:
                await anyio.sleep(ANSWERS_POLL_S)
            session.stop_agent_output()
            return
        log.warning(
            "agent did not close its connection within the grace period; closing it",
            grace_s=grace,
        )
        session.stop_agent_output()

    async with anyio.create_task_group() as tg:
        tg.start_soon(on_shutdown)
        tg.start_soon(after_input_closed)
        await session.run()
        tg.cancel_scope.cancel()
    return lost, session
