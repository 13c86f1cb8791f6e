"""The agent child process: spawn, stderr draining, the shutdown ladder, the exit code.

Contract: owns the agent's OS process and its process group. It spawns the agent in its own
session (so signals and clean-up reach grandchildren), always drains its stderr, stops it with
the ladder "close stdin, wait, SIGTERM the group, wait, SIGKILL the group" (issue 3, "The agent
process"; the ACP python-sdk's child shutdown), and reports its exit status shell-style. It never
touches the protocol: the agent's stdin/stdout are handed to the runtime as byte streams.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from acp_proxy.config import AgentConfig, StderrMode
from acp_proxy.transports import FdStream, enlarge_pipe

# Shell conventions (POSIX "Command Search and Execution").
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
# Longest agent stderr line kept whole in a log event; the rest of the line is dropped (and
# counted) so a binary blob on stderr cannot grow memory.
MAX_STDERR_LINE = 64 * 1024
# After the agent itself exited, how long its stdout may stay open (held by a process that left
# the group) before the proxy stops waiting for it.
STDOUT_LINGER_S = 2.0


class SpawnError(Exception):
    """The agent could not be started; ``exit_code`` is 127 (not found) or 126 (not runnable)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_code_of(returncode: int) -> int:
    """The shell-style exit code: the agent's own code, or 128 + N when signal N ended it."""
    return 128 - returncode if returncode < 0 else returncode


def describe_status(returncode: int) -> str:
    """How the agent ended, as a verb phrase: ``exited with status 3``, ``was killed by SIGKILL
    (status 137)``. Used in the -32603 errors (``"agent " + ...``) and the log."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (status {exit_code_of(returncode)})"
    return f"exited with status {returncode}"


@dataclass(slots=True)
class AgentProcess:
    """A running agent: its process, the streams to its stdin/stdout, and its process group."""

    process: anyio.abc.Process
    stdio: FdStream  # receive = the agent's stdout, send = the agent's stdin
    argv: tuple[str, ...]
    stderr_fd: int | None  # our read end of its stderr pipe (StderrMode.LOG), else None

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the agent's whole process group; False if the group is gone."""
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def wait(self) -> int:
        """Wait for the agent to exit; its raw return code (negative: killed by a signal)."""
        return await self.process.wait()

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def shutdown(self, grace_period_s: float, log: Any) -> int:
        """The ladder: close stdin, wait, SIGTERM the group, wait, SIGKILL the group.

        Returns the raw return code. Safe to call when the agent already exited.
        """
        await self.stdio.send_eof()
        with anyio.move_on_after(grace_period_s):
            return await self.process.wait()
        log.warning("agent did not exit after stdin closed; sending SIGTERM", pid=self.pid)
        self.signal_group(signal.SIGTERM)
        with anyio.move_on_after(grace_period_s):
            return await self.process.wait()
        log.warning("agent ignored SIGTERM; sending SIGKILL", pid=self.pid)
        self.signal_group(signal.SIGKILL)
        return await self.process.wait()

    def reap_group(self) -> None:
        """Kill what is left of the agent's process group (grandchildren: no orphans)."""
        self.signal_group(signal.SIGKILL)

    async def aclose(self) -> None:
        await self.stdio.aclose()
        if self.stderr_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.stderr_fd)
            self.stderr_fd = None


async def spawn_agent(
    argv: Sequence[str],
    agent: AgentConfig,
    environ: Mapping[str, str] | None = None,
) -> AgentProcess:
    """Start the agent in its own session with pipes for stdin/stdout (and stderr when logged).

    Raises ``SpawnError`` (127 not found, 126 not executable or other exec failure).
    """
    if not argv:
        raise SpawnError("no agent command given", EXIT_NOT_FOUND)
    env = dict(os.environ if environ is None else environ)
    env.update(agent.env)
    # Our own pipes (not asyncio's pipe transports): FdStream reads them in large chunks with no
    # per-read transport machinery, and we can enlarge their kernel buffers (issue 6).
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r: int | None = None
    err_w: int | None = None
    if agent.stderr is StderrMode.LOG:
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
    for fd in (in_w, out_r):
        enlarge_pipe(fd)
    try:
        # stderr passthrough: the agent inherits our stderr, so it is drained by whoever reads
        # ours (the editor) and never waits on the proxy.
        process = await anyio.open_process(
            list(argv),
            stdin=in_r,
            stdout=out_w,
            stderr=err_w if err_w is not None else None,
            env=env,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        _close_all(in_r, in_w, out_r, out_w, err_r, err_w)
        raise SpawnError(f"{argv[0]}: command not found", EXIT_NOT_FOUND) from exc
    except OSError as exc:
        _close_all(in_r, in_w, out_r, out_w, err_r, err_w)
        reason = exc.strerror or type(exc).__name__
        raise SpawnError(f"{argv[0]}: cannot execute: {reason}", EXIT_NOT_EXECUTABLE) from exc
    _close_all(in_r, out_w, err_w)  # the child's ends
    return AgentProcess(process, FdStream(out_r, in_w), tuple(argv), err_r)


def _close_all(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


async def drain_stderr(fd: int, log: Any) -> None:
    """Read the agent's stderr until EOF, one log event per line (StderrMode.LOG).

    Reads large chunks and never blocks on anything but the pipe, so a chatty agent cannot
    stall on a full stderr pipe. Lines longer than ``MAX_STDERR_LINE`` are truncated.
    """
    stream = FdStream(fd, None)  # owns (and closes) the read end
    pending = bytearray()
    dropping = False
    try:
        while True:
            try:
                chunk = await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                if nl < 0:
                    room = MAX_STDERR_LINE - len(pending)
                    if not dropping:
                        pending += chunk[start : start + max(room, 0)]
                        if len(chunk) - start > room:
                            dropping = True
                    break
                if not dropping:
                    pending += chunk[start : min(nl, start + MAX_STDERR_LINE - len(pending))]
                _log_stderr_line(log, bytes(pending), truncated=dropping)
                pending.clear()
                dropping = False
                start = nl + 1
        if pending:
            _log_stderr_line(log, bytes(pending), truncated=dropping)
    finally:
        await stream.aclose()


def _log_stderr_line(log: Any, line: bytes, *, truncated: bool) -> None:
    text = line.rstrip(b"\r").decode("utf-8", "replace")
    if truncated:
        log.info("agent stderr", line=text, truncated=True)
    else:
        log.info("agent stderr", line=text)


def spawn_error_exit(exc: SpawnError) -> int:
    """Print the one-line spawn error (shell style) and return its exit code."""
    print(f"acp-proxy: {exc}", file=sys.stderr)
    return exc.exit_code
