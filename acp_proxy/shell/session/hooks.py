"""Who gets told about sessions: the observer interfaces and the process-wide observers.

Contract: owns the two observer interfaces (``SessionObserver``: what recording, metrics and
tracing see of one session; ``ProcessObserver``: what telemetry sees of the process), the list of
installed ``ProcessObserver``s, and the three calls the session, the agent session and the
listener make into it. With nothing installed (the default) each call is one check of an empty
list: metrics and tracing cost nothing when off. Imports nothing heavy and nothing else of the
shell; the observers themselves (``acp_proxy.shell.telemetry.metrics_server``,
``acp_proxy.shell.telemetry.tracing``) are
imported only when enabled. All calls happen on the event loop's thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:  # types only: importing this module loads nothing of the core
    from acp_proxy.wire.chain import Direction
    from acp_proxy.wire.coalesce.take import Coalesced
    from acp_proxy.wire.connection.pipeline import Note


class EndedSession(Protocol):
    """What an observer may read of a session that ended (a ``session.PumpSession``)."""

    def summary(self) -> dict[str, Any]:
        """Counts for the exit summary line."""


class SessionObserver(Protocol):
    """What recording, metrics and tracing see of one session.

    A ``PumpSession`` with observers runs its ``Connection`` in observe mode: every frame read
    comes with an ``Observed`` note (the raw frame, what was sent instead, the replies, each
    message's method / id / the method a response answers). An observer whose class sets
    ``frames_only = True`` reads no more of a frame than its bytes, what was sent instead, the
    replies and who changed it: when every observer of a session is such, its ``Connection``
    watches instead (``watch=True``: the fast paths stay, the frames they forwarded as they came
    arrive as ``Passed`` runs). Observers run on the session's task, synchronously, so they must
    be quick and must never raise (a failing observer would stop the session); heavy work
    (files, exporters) goes behind a bounded buffer of their own.
    """

    def on_notes(self, notes: tuple[Note, ...], now: float) -> None:
        """The notes of one read (``Observed`` per frame, ``VersionNegotiated``, warnings...);
        ``now`` is ``time.monotonic()``."""

    def on_generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        """Frames the proxy wrote on its own toward ``direction``'s receiver (the -32603 errors
        owed when a peer is gone), without their newlines."""

    def on_end(self, session: EndedSession, now: float) -> None:
        """The session is over (``session.summary()`` has its counts)."""


class CoalesceObserver(Protocol):
    """A ``SessionObserver`` that also wants to know what the outbound queue merged (the live
    view): it has this method, which the others do not need."""

    def on_coalesced(self, direction: Direction, merge: Coalesced, now: float) -> None:
        """Toward ``direction``'s receiver, ``merge.merged`` frames the session had read (and
        told ``on_notes`` about) were written as ``merge.written`` frames of ``merge.size``
        bytes: the receiver was slow, and they waited. Called when they are written."""


def frames_only(observers: tuple[SessionObserver, ...]) -> bool:
    """Whether a session with ``observers`` may watch rather than observe (see
    ``SessionObserver``)."""
    return bool(observers) and all(getattr(o, "frames_only", False) is True for o in observers)


def coalesce_observers(observers: tuple[SessionObserver, ...]) -> tuple[CoalesceObserver, ...]:
    """The observers of a session that want its merges."""
    return tuple(cast(CoalesceObserver, o) for o in observers if hasattr(o, "on_coalesced"))


def coalesced(
    observers: tuple[CoalesceObserver, ...], direction: Direction, merge: Coalesced
) -> None:
    """Tell ``observers`` about one merge written toward ``direction``'s receiver."""
    now = time.monotonic()
    for observer in observers:
        observer.on_coalesced(direction, merge, now)


class ProcessObserver(Protocol):
    def session_observer(self, session: Any) -> SessionObserver | None:
        """A session (a ``session.PumpSession``, about to run) starts: its observer, if any."""

    def agent_exited(self, returncode: int) -> None:
        """A spawned agent exited (``Popen`` return code: negative for a signal)."""

    def listening(self, accepting: bool) -> None:
        """``--listen``: the listener accepts clients (True) or stopped accepting (False)."""


_INSTALLED: list[ProcessObserver] = []
# What re-reads the config file on SIGHUP under ``--listen`` (the budgets' limits).
_RELOADERS: list[Callable[[], None]] = []


def add_reloader(reload: Callable[[], None]) -> None:
    _RELOADERS.append(reload)


def remove_reloader(reload: Callable[[], None]) -> None:
    if reload in _RELOADERS:
        _RELOADERS.remove(reload)


def reloaders() -> tuple[Callable[[], None], ...]:
    """What ``--listen`` runs on SIGHUP instead of shutting down (none: SIGHUP shuts down)."""
    return tuple(_RELOADERS)


def install(observer: ProcessObserver) -> None:
    _INSTALLED.append(observer)


def uninstall(observer: ProcessObserver) -> None:
    if observer in _INSTALLED:
        _INSTALLED.remove(observer)


def process_observers() -> tuple[ProcessObserver, ...]:
    """The installed process observers (the budgets add their metrics to theirs)."""
    return tuple(_INSTALLED)


def session_observers(session: Any) -> tuple[SessionObserver, ...]:
    """The observers the installed process observers want on ``session``."""
    if not _INSTALLED:
        return ()
    found = (p.session_observer(session) for p in _INSTALLED)
    return tuple(o for o in found if o is not None)


def agent_exited(returncode: int) -> None:
    for p in _INSTALLED:
        p.agent_exited(returncode)


def listening(accepting: bool) -> None:
    for p in _INSTALLED:
        p.listening(accepting)


def detach_event(event: str, replayed: int) -> None:
    """``detach_grace``: a client detached, reattached (``replayed`` frames sent it again),
    was refused, took a session over, or its agent's grace time expired. Told to the process
    observers that count them (``detach_event``; the others do not need the method)."""
    for p in _INSTALLED:
        told = getattr(p, "detach_event", None)
        if told is not None:
            told(event, replayed)


# Who reads the agent's stderr lines as they are logged (the live view); empty by default, so
# logging a line costs one check of an empty list. A reader is told the line and the session
# whose agent wrote it (``None`` when no session is known).
StderrReader = Callable[[bytes, Any], None]
STDERR_READERS: list[StderrReader] = []


def install_stderr(reader: StderrReader) -> None:
    STDERR_READERS.append(reader)


def uninstall_stderr(reader: StderrReader) -> None:
    if reader in STDERR_READERS:
        STDERR_READERS.remove(reader)


def agent_stderr(line: bytes, session: Any = None) -> None:
    """One line of the agent's stderr (``agent.stderr: log``), without its newline; ``session``:
    the session (a ``session.PumpSession``) whose agent wrote it (with ``--listen``, each
    connection has an agent of its own)."""
    for reader in STDERR_READERS:
        reader(line, session)
