"""The agent child process: spawn, the shutdown ladder, the exit code, no orphans.

Contract: owns the agent's OS process and its process group. It spawns the agent in its own
session (so signals and clean-up reach grandchildren), hands its stderr pipe to the runtime
(``agent_stderr`` reads it), stops it with
the ladder "close stdin, wait, SIGTERM the group, wait, SIGKILL the group" (docs/running.md;
the ACP python-sdk's child shutdown), and reports its exit status shell-style. It never
touches the protocol: the agent's stdin/stdout are handed to the runtime as byte streams.

No orphans, ever, on Linux:

- The agent dies with the proxy, even on ``kill -9``: ``PR_SET_PDEATHSIG`` = SIGKILL, set in the
  child before exec, then a ``getppid`` check closes the race with a proxy that died before it.
- The proxy is a child subreaper (``enable_supervision``, called once by the CLI): a descendant
  that leaves the agent's session (``setsid``) is adopted by the proxy instead of init. Every
  agent carries a session cookie in its environment (``ACP_PROXY_SESSION``, the way Jenkins
  finds a build's processes), so when the agent is gone, its session's leftovers are SIGKILLed
  along with its process group; when the proxy exits, every descendant still alive is.
- Adopted processes are reaped (on SIGCHLD, and every few seconds in case one was missed), also
  as PID 1 in a container. Only pids that no ``ChildProcess`` owns are reaped, so an agent's
  exit status is never stolen from the object that waits for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.abc

from acp_proxy.base.values import value
from acp_proxy.config import AgentConfig
from acp_proxy.shell.agent.spawn import (
    SESSION_ENV,
    SUPERVISION,
    SpawnError,
    start_agent,
    take_early,
)
from acp_proxy.shell.streams.transports import FdStream

# After the agent itself exited, how long its stdout may stay open (held by a process that left
# the group) before the proxy stops waiting for it.
STDOUT_LINGER_S = 2.0
# Without a pidfd (not Linux, or Linux < 5.3): how often a waiter polls for the agent's exit.
POLL_S = 0.05
# The reaper's safety net: it runs on every SIGCHLD, and at least this often.
REAP_INTERVAL_S = 5.0
# The longest the exit sweep keeps looking for new descendants before it kills what it stopped.
SWEEP_S = 2.0


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


def _read(path: str) -> bytes:
    """A /proc file's contents (plain ``open``: pathlib is not worth its import at start-up)."""
    with open(path, "rb") as file:
        return file.read()


def _child_ids(pid: int) -> list[int]:
    """The children of ``pid`` (every thread's), from /proc; [] when they cannot be read."""
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for tid in tasks:
        try:
            text = _read(f"/proc/{pid}/task/{tid}/children").decode()
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return _child_ids_by_scan(pid)  # a kernel without CONFIG_PROC_CHILDREN
        except OSError:
            continue
        children.extend(int(child) for child in text.split())
    return children


def _child_ids_by_scan(pid: int) -> list[int]:
    """The children of ``pid``: every process whose parent it is, from /proc/*/stat."""
    children: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = _read(f"/proc/{entry}/stat")
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        if int(stat.rsplit(b")", 1)[1].split()[1]) == pid:
            children.append(int(entry))
    return children


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, parents before children."""
    found: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo:
        for child in _child_ids(todo.pop()):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def _halted(pid: int) -> bool:
    """Whether ``pid`` is stopped, a zombie or gone (it can fork no more)."""
    try:
        stat = _read(f"/proc/{pid}/stat")
    except OSError:
        return True
    return stat.rsplit(b")", 1)[1].split()[0] in (b"T", b"t", b"Z", b"X")


def _has_cookie(pid: int, cookie: bytes) -> bool:
    try:
        environ = _read(f"/proc/{pid}/environ")
    except OSError:  # gone, or not ours to read
        return False
    return cookie in environ.split(b"\0")


def kill_leftovers(session: str | None) -> int:
    """SIGKILL the proxy's descendants that belong to ``session`` (its cookie is in their
    environment), or all of them when ``session`` is None (the proxy is exiting). Live agents
    are spared: each is stopped by its own ladder. Returns how many were signalled.

    Freeze, then kill. A one-pass "list, then SIGKILL each" loses a process that forks between
    the listing and the kill (a fork-and-exit chain changes pid every fork; the new child is
    adopted by the proxy and nobody looks again). So each descendant found is first SIGSTOPped,
    together with its whole process group when it left the proxy's session (``setsid``; a
    signal to a group restarts a fork under way, so no child escapes it), and the listing is
    repeated, once each has stopped, until a pass finds nothing new (at most ``SWEEP_S``); then
    every stopped group and process is SIGKILLed.

    Leftovers run after their agent is gone, so they get no grace period: the agent had its
    ladder. The killed ones that the proxy adopted are reaped by ``reap_adopted``.
    """
    cookie = None if session is None else f"{SESSION_ENV}={session}".encode()
    own_session = os.getsid(0)
    groups: list[int] = []
    stopped: list[int] = []
    seen: set[int] = set()
    deadline = time.monotonic() + SWEEP_S
    while True:
        found = len(stopped)
        for pid in _descendants(os.getpid()):
            if pid in seen or pid in SUPERVISION.owned:
                continue
            seen.add(pid)
            if cookie is not None and not _has_cookie(pid, cookie):
                continue
            group = _own_group(pid, own_session)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if group is not None and group not in groups:
                    os.killpg(group, signal.SIGSTOP)
                    groups.append(group)
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        if len(stopped) == found or time.monotonic() > deadline:
            break
        # A signal sent to one process is queued, not yet taken: one in the middle of fork()
        # finishes it (the child is not stopped) and only then stops. List again once each
        # has stopped, so that the listing holds every child they made.
        for pid in stopped[found:]:
            while not _halted(pid) and time.monotonic() < deadline:
                time.sleep(0.0005)
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    killed = 0
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def _own_group(pid: int, own_session: int) -> int | None:
    """The process group of ``pid`` when it may be signalled whole: outside the proxy's own
    session (whose groups can hold processes that are not the proxy's descendants: its own
    parent's), and not a live agent's group (each agent is stopped by its own ladder)."""
    try:
        if os.getsid(pid) == own_session:
            return None
        group = os.getpgid(pid)
    except OSError:
        return None
    return None if group in SUPERVISION.owned else group


def reap_adopted() -> int:
    """Reap every exited child that no ``ChildProcess`` waits for; returns how many.

    Never ``waitpid(-1)``: that could take an agent's status away from its ``ChildProcess``.
    """
    reaped = 0
    for pid in _child_ids(os.getpid()):
        if pid in SUPERVISION.owned:
            continue
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if done == pid:
            reaped += 1
    return reaped


async def _reap_forever() -> None:
    with anyio.open_signal_receiver(signal.SIGCHLD) as sigchld:
        while True:
            reap_adopted()
            with anyio.move_on_after(REAP_INTERVAL_S):
                async for _ in sigchld:
                    break


async def run_supervised(main: Callable[..., Awaitable[int]], *args: Any) -> int:
    """Run the proxy's top level ``main(*args)``; with supervision on, reap adopted processes
    while it runs and kill (then reap) every descendant left when it returns."""
    if not SUPERVISION.enabled:
        return await main(*args)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_reap_forever)
            try:
                code = await main(*args)
            finally:
                tg.cancel_scope.cancel()
    finally:
        kill_leftovers(None)
        reap_adopted()
    return code


class ChildProcess:
    """A spawned child whose exit status only this object collects.

    Waits on a pidfd (Linux 5.3+) or else polls every ``POLL_S``; any number of tasks may
    ``wait()`` at once (one of them watches, the others wait for its word).
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = os.pidfd_open(popen.pid)
        self._watching = False
        self._changed = anyio.Event()
        SUPERVISION.owned.add(self.pid)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        """Wait for the child to exit; its raw return code (negative: killed by a signal)."""
        while self._popen.returncode is None:
            if self._watching:
                await self._changed.wait()
                continue
            self._watching = True
            try:
                if self._pidfd is not None:
                    await anyio.wait_readable(self._pidfd)
                else:
                    await anyio.sleep(POLL_S)
            finally:
                self._watching = False
                changed, self._changed = self._changed, anyio.Event()
                changed.set()
            if self._popen.poll() is not None:
                self._release()
        return self._popen.returncode

    def _release(self) -> None:
        # A watcher still registered on the pidfd closes it itself when it wakes up.
        if self._pidfd is not None and not self._watching:
            os.close(self._pidfd)
            self._pidfd = None
        SUPERVISION.owned.discard(self.pid)

    def close(self) -> None:
        """Stop owning the child; if it has not been waited for, the reaper takes it over."""
        if self._popen.returncode is None and self._popen.poll() is None:
            # Marked done so that Popen.__del__ does not queue it for subprocess's own clean-up,
            # whose waitpid could later hit a reused pid (another agent's).
            self._popen.returncode = 0
        self._release()


@value(frozen=False)
class AgentProcess:
    """A running agent: its process, the streams to its stdin/stdout, and its process group."""

    process: ChildProcess
    stdio: FdStream  # receive = the agent's stdout, send = the agent's stdin
    argv: tuple[str, ...]
    stderr_fd: int | None  # our read end of its stderr pipe (None once handed to its reader)
    session: str = ""  # the value of SESSION_ENV in its environment
    stderr_passthrough: bool = True  # its stderr is copied to ours (else: into the log)

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
        """Kill what is left of the agent's process group, and its session's processes that
        left the group (``setsid``): no orphans."""
        self.signal_group(signal.SIGKILL)
        if self.session:
            kill_leftovers(self.session)

    async def aclose(self) -> None:
        await self.stdio.aclose()
        if self.stderr_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.stderr_fd)
            self.stderr_fd = None
        self.process.close()


async def spawn_agent(
    argv: Sequence[str],
    agent: AgentConfig,
    environ: Mapping[str, str] | None = None,
) -> AgentProcess:
    """Start the agent (``spawn.start_agent``: its own session, pipes, the parent-death signal),
    or take the one the command line started early for this command (``spawn.start_early``),
    and wrap it for the event loop. Runs in the event loop's thread.

    Raises ``SpawnError`` (127 not found, 126 not executable or other exec failure).
    """
    started = take_early(argv, agent) if environ is None else None
    if started is None:
        started = start_agent(argv, agent, environ)
    return AgentProcess(
        ChildProcess(started.popen),
        FdStream(started.stdout_fd, started.stdin_fd),
        started.argv,
        started.stderr_fd,
        started.session,
        started.stderr_passthrough,
    )


def spawn_error_exit(exc: SpawnError) -> int:
    """Print the one-line spawn error (shell style) and return its exit code."""
    print(f"acp-proxy: {exc}", file=sys.stderr)
    return exc.exit_code
