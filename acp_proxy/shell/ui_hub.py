"""The live view's hub: the session tap, the event history and the observers' bounded queues.

Contract: owns what the ``--ui`` server publishes. ``UiHub`` is a ``hooks.ProcessObserver``:
each session gets a ``UiTap`` (a ``SessionObserver``), which only copies references to the
frames it is told about into the hub's ingest queue (bounded by ``INGEST_BYTES``; past it frames
are counted as lost, never waited for) and returns: the session never waits for the view. The
hub's own task turns them into record lines (``acp_proxy.record.format``, redaction included),
stream events (``acp_proxy.ui.events``) and entity views (``acp_proxy.ui.entities``), keeps the
last ``history_bytes`` of events for replay, and fans each event out to every observer's queue.

An observer's queue holds at most ``observer_bytes``: an observer that falls that far behind is
cut off (its queue dropped, a last ``cutoff`` event saying why, its connection closed). A stuck
observer therefore costs at most its bound, and the session and the other observers never wait
for it. All of it runs on the proxy's event loop.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Final

import anyio
import orjson

from acp_proxy import __version__
from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.base.values import value
from acp_proxy.record.format import (
    AGENT_TO_CLIENT,
    CLIENT_TO_AGENT,
    Redactor,
    event_line,
    frame_line,
)
from acp_proxy.ui.entities import EntityView
from acp_proxy.ui.events import StreamBuilder
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.notes import Observed, VersionNegotiated

# Bounds (docs/live-view.md, "Bounds"); the settings of ``ui:`` override the first three.
HISTORY_BYTES: Final = 64 * 1024 * 1024  # events kept for replay (oldest dropped first)
OBSERVER_BYTES: Final = 8 * 1024 * 1024  # one observer's queue: past it, cut off
MAX_OBSERVERS: Final = 64  # subscriptions at once; more are refused (503)
INGEST_BYTES: Final = 16 * 1024 * 1024  # frames tapped, not yet turned into events
MAX_SESSIONS: Final = 256  # sessions whose entity view is kept (the oldest ended go first)
PUBLISH_INTERVAL_S: Final = 0.02  # the hub publishes in batches, at most this often

_DIR: Final = {
    Direction.CLIENT_TO_AGENT: CLIENT_TO_AGENT,
    Direction.AGENT_TO_CLIENT: AGENT_TO_CLIENT,
}
_OTHER: Final = {
    Direction.CLIENT_TO_AGENT: AGENT_TO_CLIENT,
    Direction.AGENT_TO_CLIENT: CLIENT_TO_AGENT,
}


@value
class HubLimits:
    """The hub's bounds (the ``ui:`` settings)."""

    history_bytes: int = HISTORY_BYTES
    observer_bytes: int = OBSERVER_BYTES
    max_observers: int = MAX_OBSERVERS


def sse_chunk(seq: int | None, data: bytes) -> bytes:
    """One Server-Sent Events message (``id:`` lets a reconnecting EventSource resume)."""
    head = b"id: %d\n" % seq if seq is not None else b""
    return head + b"data: " + data + b"\n\n"


class Observer:
    """One subscription's queue (see the module docstring)."""

    __slots__ = ("bound", "cut", "queue", "queued", "scope", "wake")

    def __init__(self, bound: int) -> None:
        self.bound = bound
        # The scope of the subscription's writes: a cut-off cancels a write the observer is
        # not reading, so its connection ends now rather than when the write times out.
        self.scope: anyio.CancelScope | None = None
        self.queue: deque[bytes] = deque()
        self.queued = 0
        self.cut: str | None = None
        self.wake = anyio.Event()

    def put(self, chunk: bytes) -> None:
        if self.cut is not None:
            return
        if self.queued + len(chunk) > self.bound:
            self.cut_off(
                f"this observer fell more than {self.bound} bytes behind the session "
                "(it reads too slowly); reconnect to resume from the last event it received"
            )
            return
        self.queue.append(chunk)
        self.queued += len(chunk)
        if not self.wake.is_set():
            self.wake.set()

    def cut_off(self, reason: str) -> None:
        if self.cut is None:
            self.cut = reason
            self.queue.clear()
            self.queued = 0
            if self.scope is not None:
                self.scope.cancel()
        self.wake.set()

    def take(self) -> bytes:
        data = b"".join(self.queue)
        self.queue.clear()
        self.queued = 0
        if self.wake.is_set():
            self.wake = anyio.Event()
        return data


class _Session:
    __slots__ = ("conn", "ended", "header", "view")

    def __init__(self, conn: int, header: JsonObject) -> None:
        self.conn = conn
        self.header = header
        self.view = EntityView()
        self.ended = False


class UiHub:
    """Events in, observers out (see the module docstring)."""

    def __init__(
        self,
        *,
        mode: str = "live",
        redactor: Redactor | None = None,
        limits: HubLimits | None = None,
    ) -> None:
        limits = limits if limits is not None else HubLimits()
        self.mode = mode
        self.redactor = redactor if redactor is not None else Redactor.build()
        self.history_bytes = limits.history_bytes
        self.observer_bytes = limits.observer_bytes
        self.max_observers = limits.max_observers
        self.builder = StreamBuilder()
        # (seq, conn, chunk, offset of the JSON in the chunk)
        self.history: deque[tuple[int, int, bytes, int]] = deque()
        self.history_held = 0
        self.history_dropped = 0  # events no longer held (the oldest)
        self.observers: set[Observer] = set()
        self.sessions: dict[int, _Session] = {}
        self._next_conn = 0
        self._ingest: deque[tuple[Any, ...]] = deque()
        self.ingest_held = 0
        self.ingest_lost = 0
        self._ingest_ready = anyio.Event()

    # -- accounting -----------------------------------------------------------------------------

    def bound_bytes(self) -> int:
        """The most the hub holds: history, ingest and every observer's queue at its bound."""
        return self.history_bytes + INGEST_BYTES + self.max_observers * self.observer_bytes

    def held_bytes(self) -> int:
        """What the hub holds now (each queued event counted once per queue holding it)."""
        return self.history_held + self.ingest_held + sum(o.queued for o in self.observers)

    # -- hooks.ProcessObserver ------------------------------------------------------------------

    def session_observer(self, session: Any) -> UiTap:
        config = session.config
        header: JsonObject = {
            "acp-proxy-record": 1,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": __version__,
            "config": config.source,
            "rules": list(config.rule_names),
            "middleware": [spec.name for spec in config.middleware],
        }
        conn = self.open_session(header)
        return UiTap(self, conn)

    def agent_exited(self, returncode: int) -> None:
        pass

    def listening(self, accepting: bool) -> None:
        pass

    # -- sessions and events --------------------------------------------------------------------

    def open_session(self, header: JsonObject) -> int:
        self._next_conn += 1
        conn = self._next_conn
        header.setdefault("conn", conn)
        self.sessions[conn] = _Session(conn, header)
        if len(self.sessions) > MAX_SESSIONS:
            for old in list(self.sessions.values()):
                if old.ended:
                    del self.sessions[old.conn]
                    break
        self.publish(self.builder.session(conn, header))
        return conn

    def add_line(self, conn: int, line: JsonObject) -> None:
        """One record line of session ``conn`` (a frame or a record event)."""
        event = self.builder.line(conn, line)
        session = self.sessions.get(conn)
        if session is not None:
            session.view.feed(event)
            if line.get("event") == "end":
                session.ended = True
        self.publish(event)

    def publish(self, event: JsonObject) -> None:
        data = orjson.dumps(event)
        seq = event.get("seq")
        assert isinstance(seq, int)
        chunk = sse_chunk(seq, data)
        conn = event.get("conn")
        self.history.append(
            (seq, conn if isinstance(conn, int) else 0, chunk, len(chunk) - len(data) - 2)
        )
        self.history_held += len(chunk)
        while self.history_held > self.history_bytes and len(self.history) > 1:
            self.history_held -= len(self.history.popleft()[2])
            self.history_dropped += 1
        for observer in self.observers:
            observer.put(chunk)

    def events(self, conn: int | None = None) -> Iterator[JsonObject]:
        """The events held, oldest first (``conn``: of one session only)."""
        for _seq, c, chunk, offset in list(self.history):
            if conn is None or c == conn:
                yield orjson.loads(chunk[offset:-2])

    def replay(self, since: int) -> tuple[list[bytes], int]:
        """The chunks of the events after ``since`` still held, and how many were not."""
        chunks = [chunk for seq, _c, chunk, _o in list(self.history) if seq > since]
        first_held = self.history[0][0] if self.history else self.builder.head + 1
        missing = max(0, first_held - since - 1)
        return chunks, missing

    # -- observers ------------------------------------------------------------------------------

    def subscribe(self) -> Observer | None:
        if len(self.observers) >= self.max_observers:
            return None
        observer = Observer(self.observer_bytes)
        self.observers.add(observer)
        return observer

    def unsubscribe(self, observer: Observer) -> None:
        self.observers.discard(observer)

    def close(self, reason: str) -> None:
        for observer in self.observers:
            observer.cut_off(reason)

    # -- the live tap -----------------------------------------------------------------------------

    def ingest(self, item: tuple[Any, ...], size: int) -> None:
        if self.ingest_held + size > INGEST_BYTES and self._ingest:
            self.ingest_lost += 1
            return
        self._ingest.append(item)
        self.ingest_held += size
        if not self._ingest_ready.is_set():
            self._ingest_ready.set()

    async def run(self) -> None:
        """Turn tapped frames into events, in batches, until cancelled."""
        while True:
            await self._ingest_ready.wait()
            self._ingest_ready = anyio.Event()
            self.drain()
            await anyio.sleep(PUBLISH_INTERVAL_S)

    def drain(self) -> None:
        """Publish everything tapped so far."""
        redactor = self.redactor
        while self._ingest:
            item = self._ingest.popleft()
            self.ingest_held -= item[-1]
            if self.ingest_lost:
                lost, self.ingest_lost = self.ingest_lost, 0
                self.add_line(item[0], orjson.loads(event_line(item[1], "lost", frames=lost)))
            conn, t, what = item[0], item[1], item[2]
            if what == "frame":
                _, _, _, direction, raw, sent, changed_by, kind, generated, _ = item
                line = frame_line(
                    t,
                    direction,
                    raw,
                    redactor,
                    sent=sent,
                    changed_by=changed_by,
                    kind=kind,
                    generated=generated,
                )
                self.add_line(conn, orjson.loads(line))
            else:
                self.add_line(conn, orjson.loads(event_line(t, what, **item[3])))


class UiTap:
    """The ``SessionObserver`` of one session for the live view: copies references, returns."""

    __slots__ = ("conn", "hub", "start")

    def __init__(self, hub: UiHub, conn: int) -> None:
        self.hub = hub
        self.conn = conn
        self.start = time.monotonic()

    def on_notes(self, notes: tuple[Any, ...], now: float) -> None:
        t = now - self.start
        hub = self.hub
        for note in notes:
            if type(note) is Observed:
                changed_by: list[str] = []
                for info in note.messages:
                    changed_by.extend(n for n in info.changed_by if n not in changed_by)
                size = len(note.raw) + sum(len(s) for s in note.sent or ())
                hub.ingest(
                    (
                        self.conn,
                        t,
                        "frame",
                        _DIR[note.direction],
                        note.raw,
                        note.sent,
                        changed_by,
                        note.kind,
                        False,
                        size,
                    ),
                    size,
                )
                for reply in note.replies:
                    item = (
                        self.conn,
                        t,
                        "frame",
                        _OTHER[note.direction],
                        reply,
                        None,
                        (),
                        "message",
                        True,
                        len(reply),
                    )
                    hub.ingest(item, len(reply))
            elif type(note) is VersionNegotiated:
                hub.ingest((self.conn, t, "version", {"protocolVersion": note.version}, 0), 0)

    def on_generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        t = now - self.start
        for frame in frames:
            item = (
                self.conn,
                t,
                "frame",
                _DIR[direction],
                frame,
                None,
                (),
                "message",
                True,
                len(frame),
            )
            self.hub.ingest(item, len(frame))

    def on_end(self, session: Any, now: float) -> None:
        summary = dict(session.summary())
        version = summary.pop("version", None)
        fields = {"exit": None, "protocolVersion": version, "summary": summary}
        self.hub.ingest((self.conn, now - self.start, "end", fields, 0), 0)
