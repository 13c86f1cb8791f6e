"""Starting the agent's OS process, without the event loop: the fork and exec, the parent-death
signal, the supervision flags, and the early start.

Contract: owns what must exist before (and without) anyio: the ``preexec_fn`` that ties the agent
to the proxy (``PR_SET_PDEATHSIG``), the subreaper flag and the process-wide supervision state
(``enable_supervision``), the pipes and the ``Popen`` of one agent (``start_agent``), and the early
start (``start_early`` / ``take_early``). ``acp_proxy.shell.agent.process`` wraps a started agent
for the event loop (``spawn_agent``) and does everything after. Imports nothing heavy: the command
line starts the agent from here before it imports anyio and the runtime.

The early start (start-up as users feel it): for a plain stdio session the CLI starts the agent as
soon as the command line and the config are known, and only then imports anyio, asyncio and the
runtime, so the agent's own start-up (a Node agent's is longer than those imports:
docs/performance.md, "Figures behind the code") runs while the proxy gets ready instead of after
it. Without a config file the config is known from the command line alone, and the agent starts
before the config model is even imported: this module imports neither the config nor
``dataclasses`` (the agent's settings come as ``AgentSettings``). Until the runtime installs its
signal handlers, SIGINT, SIGTERM and SIGHUP are recorded (``catch_signals``), and the runtime then
shuts the agent down with the usual ladder, as for a signal that comes later.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import itertools
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Protocol

# Shell conventions (POSIX "Command Search and Execution").
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
# The environment variable that marks an agent and everything it starts as one session's
# processes: "<proxy pid>.<session number>".
SESSION_ENV = "ACP_PROXY_SESSION"
# The exit status of a child that finds the proxy already gone before it could exec.
EXIT_PARENT_GONE = 128 + signal.SIGKILL
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PR_SET_CHILD_SUBREAPER = 36
# Larger pipe buffers mean fewer wake-ups per megabyte. Linux caps unprivileged
# processes at /proc/sys/fs/pipe-max-size (1 MiB by default); failure is harmless.
PIPE_SIZE = 1024 * 1024
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# What the runtime stops the agent for (``runtime._SIGNALS``), recorded before it can.
EARLY_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def enlarge_pipe(fd: int, size: int = PIPE_SIZE) -> None:
    """Best effort: grow the kernel buffer of pipe ``fd`` to ``size`` bytes."""
    with contextlib.suppress(OSError):
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, size)


class SpawnError(Exception):
    """The agent could not be started; ``exit_code`` is 127 (not found) or 126 (not runnable)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# -- supervision: process-wide state (the subreaper flag is per process) -------------------------


class _Supervision:
    __slots__ = ("enabled", "owned", "sessions")

    def __init__(self) -> None:
        self.enabled = False  # enable_supervision() ran: subreaper, reaper, final sweep
        self.owned: set[int] = set()  # pids whose status a ChildProcess collects
        self.sessions = itertools.count(1)


# Shared with ``process`` (the reaper, ``ChildProcess``): one per process, as the subreaper flag.
SUPERVISION = _Supervision()


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux only; None elsewhere or when libc cannot be loaded)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    func.restype = ctypes.c_int
    return func


def enable_supervision() -> bool:
    """Make this process the supervisor of its agents (the CLI calls it once, before spawning).

    Sets ``PR_SET_CHILD_SUBREAPER`` so descendants that leave the agent's session are adopted
    by the proxy (and can be killed and reaped by it), and turns on the reaper and the final
    sweep of ``run_supervised``. Returns whether this process is now a subreaper or PID 1.
    In-process callers (tests) never call it: a test runner must not become a subreaper.
    """
    SUPERVISION.enabled = True
    prctl = _prctl()
    subreaper = prctl is not None and prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return subreaper or os.getpid() == 1


def _child_setup(parent_pid: int) -> Callable[[], None]:
    """The ``preexec_fn`` of the agent: runs in the forked child, just before exec.

    ``preexec_fn`` is unsafe in a threaded program in general (the child could need a lock
    another thread held at fork: the proxy's only other threads are anyio workers, e.g. for
    name lookups). This one takes none: no import, no logging, no I/O; only ``sigprocmask``,
    ``prctl`` and ``getppid`` through objects prepared before the fork, and CPython
    re-initialises its own locks (GIL, import lock) in the child before calling it.
    """
    prctl = _prctl()
    sigkill = int(signal.SIGKILL)

    def setup() -> None:
        # The agent starts with no signal blocked, whatever the proxy's own mask (exec keeps it).
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        if prctl is not None:
            # SIGKILL when the proxy dies, even by kill -9. Had it died already, we were
            # reparented before prctl could take effect: the parent's pid tells.
            prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
            if os.getppid() != parent_pid:
                os._exit(EXIT_PARENT_GONE)

    return setup


class AgentSettings(Protocol):
    """What the start of an agent reads of its settings (``config.AgentConfig``; this module
    does not import the config, so that the command line can start an agent before it does)."""

    @property
    def env(self) -> Mapping[str, str]: ...  # overrides on top of the inherited environment

    @property
    def stderr(self) -> str: ...  # ``config.StderrMode``, a ``StrEnum``: "log" or "passthrough"


# ``config.StderrMode.LOG``: each line of the agent's stderr becomes a log event (else it is
# copied to the proxy's stderr as it is).
_STDERR_LOG = "log"


class Started:
    """An agent process just started: its ``Popen``, our ends of its pipes, its session."""

    __slots__ = (
        "argv",
        "popen",
        "session",
        "stderr_fd",
        "stderr_passthrough",
        "stdin_fd",
        "stdout_fd",
    )

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        *,
        stdin_fd: int,
        stdout_fd: int,
        stderr_fd: int,
        stderr_passthrough: bool,
        argv: tuple[str, ...],
        session: str,
    ) -> None:
        self.popen = popen
        self.stdin_fd = stdin_fd  # our write end of its stdin
        self.stdout_fd = stdout_fd  # our read end of its stdout
        self.stderr_fd = stderr_fd  # our read end of its stderr pipe
        self.stderr_passthrough = stderr_passthrough  # copied to our stderr (else: the log)
        self.argv = argv
        self.session = session  # the value of SESSION_ENV in its environment


def start_agent(
    argv: Sequence[str],
    agent: AgentSettings,
    environ: Mapping[str, str] | None = None,
) -> Started:
    """Start the agent in its own session with pipes for stdin, stdout and stderr.

    Must run in the thread that runs the event loop (the main thread): the parent-death signal
    fires when the thread that forked the agent ends, so a short-lived worker thread would take
    the agent with it.

    Raises ``SpawnError`` (127 not found, 126 not executable or other exec failure).
    """

    if not argv:
        raise SpawnError("no agent command given", EXIT_NOT_FOUND)
    env = dict(os.environ if environ is None else environ)
    env.update(agent.env)
    session = f"{os.getpid()}.{next(SUPERVISION.sessions)}"
    env[SESSION_ENV] = session
    # Our own pipes (not asyncio's pipe transports): FdStream reads them in large chunks with no
    # per-read transport machinery, and we can enlarge their kernel buffers.
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    # stderr is a pipe in both modes: the proxy keeps its last lines for the errors that tell
    # the editor why the agent died (``agent_stderr``), and logs or copies the rest.
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    for fd in (in_w, out_r):
        enlarge_pipe(fd)
    try:
        # subprocess.Popen rather than anyio.open_process: only Popen takes a preexec_fn (the
        # parent-death signal), and its exit is collected by ChildProcess, never by a child
        # watcher that the reaper could race. Like asyncio's own subprocess_exec, the fork and
        # exec happen synchronously in the loop's thread.
        popen = subprocess.Popen(
            list(argv),
            stdin=in_r,
            stdout=out_w,
            stderr=err_w,
            env=env,
            start_new_session=True,
            preexec_fn=_child_setup(os.getpid()),  # noqa: PLW1509 (see _child_setup)
        )
    except FileNotFoundError as exc:
        _close_all(in_r, in_w, out_r, out_w, err_r, err_w)
        raise SpawnError(f"{argv[0]}: command not found", EXIT_NOT_FOUND) from exc
    except (OSError, subprocess.SubprocessError) as exc:
        _close_all(in_r, in_w, out_r, out_w, err_r, err_w)
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise SpawnError(f"{argv[0]}: cannot execute: {reason}", EXIT_NOT_EXECUTABLE) from exc
    _close_all(in_r, out_w, err_w)  # the child's ends
    # Owned from the fork on: the reaper never takes this child's exit status (it may start
    # before the event loop claims an agent started early).
    SUPERVISION.owned.add(popen.pid)
    return Started(
        popen,
        stdin_fd=in_w,
        stdout_fd=out_r,
        stderr_fd=err_r,
        stderr_passthrough=agent.stderr != _STDERR_LOG,
        argv=tuple(argv),
        session=session,
    )


def _close_all(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


# -- the early start ---------------------------------------------------------------------------


# An early agent is taken only for the command and settings it was started with.
_EarlyKey = tuple[tuple[str, ...], dict[str, str], str]


def _key(argv: Sequence[str], agent: AgentSettings) -> _EarlyKey:
    return (tuple(argv), dict(agent.env), str(agent.stderr))


class _Early:
    __slots__ = ("agent", "signals")

    def __init__(self) -> None:
        self.agent: tuple[_EarlyKey, Started] | None = None
        # Recorded before the runtime's handlers, each signal once (bounded by EARLY_SIGNALS:
        # a sender repeating one adds nothing; the ladder starts once anyway).
        self.signals: list[int] = []


_EARLY = _Early()


def start_early(argv: Sequence[str], agent: AgentSettings) -> bool:
    """Start the agent now, for the runtime's ``spawn_agent`` to take (``take_early``); False
    when it could not be started (the runtime then tries again and reports why, as always).
    Records the signals the runtime handles from here on (``catch_signals``)."""
    catch_signals()
    try:
        started = start_agent(argv, agent)
    except SpawnError:
        return False
    _EARLY.agent = (_key(argv, agent), started)
    return True


def started_early() -> bool:
    """An agent was started early and not taken yet."""
    return _EARLY.agent is not None


def take_early(argv: Sequence[str], agent: AgentSettings) -> Started | None:
    """The agent ``start_early`` started for this command and these settings, once; else None.

    An early agent started for another command or other settings is never run: it is killed
    (with its process group) and reaped here, so the caller starts the right one and nothing
    is left behind. (The command line starts one before it reads the config only where the
    config is the default one, whose settings a test holds equal to those it starts with.)
    """
    early = _EARLY.agent
    if early is None:
        return None
    _EARLY.agent = None
    key, started = early
    if key == _key(argv, agent):
        return started
    _discard(started)
    return None


def _discard(started: Started) -> None:
    """Kill an agent that never got a byte of the session, and everything it started."""
    with contextlib.suppress(OSError):
        os.killpg(started.popen.pid, signal.SIGKILL)  # its own session: pgid == pid
    started.popen.wait()
    SUPERVISION.owned.discard(started.popen.pid)
    _close_all(started.stdin_fd, started.stdout_fd, started.stderr_fd)


def catch_signals() -> None:
    """Record SIGINT, SIGTERM and SIGHUP instead of dying of them, until the runtime installs
    its own handlers and reads them (``early_signals``)."""
    for signum in EARLY_SIGNALS:
        signal.signal(signum, _record)


def _record(signum: int, frame: FrameType | None) -> None:
    if signum not in _EARLY.signals:
        _EARLY.signals.append(signum)


def early_signals() -> list[signal.Signals]:
    """The signals recorded before the runtime's handlers, once (each at most once, in the
    order they first came)."""
    caught, _EARLY.signals = _EARLY.signals, []
    return [signal.Signals(signum) for signum in caught]
