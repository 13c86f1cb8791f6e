"""Process-wide telemetry hooks (issue 12): who gets told about sessions, agent exits, listening.

Contract: owns the list of installed ``ProcessObserver``s and the three calls the runtime and
the listener make into it. With nothing installed (the default) each call is one check of an
empty list: metrics and tracing cost nothing when off. Imports nothing heavy; the observers
themselves (``acp_proxy.shell.telemetry``, ``acp_proxy.shell.tracing``) are imported only when
enabled. All calls happen on the event loop's thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from acp_proxy.shell.runtime import SessionObserver


class ProcessObserver(Protocol):
    def session_observer(self, session: Any) -> SessionObserver | None:
        """A session (a ``runtime.PumpSession``, about to run) starts: its observer, if any."""

    def agent_exited(self, returncode: int) -> None:
        """A spawned agent exited (``Popen`` return code: negative for a signal)."""

    def listening(self, accepting: bool) -> None:
        """``--listen``: the listener accepts clients (True) or stopped accepting (False)."""


_INSTALLED: list[ProcessObserver] = []


def install(observer: ProcessObserver) -> None:
    _INSTALLED.append(observer)


def uninstall(observer: ProcessObserver) -> None:
    if observer in _INSTALLED:
        _INSTALLED.remove(observer)


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
