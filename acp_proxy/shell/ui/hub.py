"""The live view's hub: the session tap, the event history and the observers' cursors.

Contract: owns what the ``--ui`` server publishes. ``UiHub`` is a ``hooks.ProcessObserver``:
each session gets a ``UiTap`` (a ``SessionObserver``), which only copies references to the
frames it is told about into the hub's ingest queue (bounded by ``INGEST_BYTES``, each item
counted with its own cost; a frame's first ``FRAME_SHOWN`` bytes only; past the bound frames
are counted as lost where they were dropped, never waited for) and returns: the session never
waits for the view. The hub's own task turns them into record lines (``acp_proxy.record.format``,
redaction included), stream events (``acp_proxy.ui.events``) and entity views
(``acp_proxy.ui.entities``, within ``VIEWS_BYTES`` together), in slices that take at most a
share of the loop's time, and keeps the last ``history_bytes`` of events for replay and for
every observer. A frame it fails on is logged and skipped: no exception of the view reaches
the session.

An observer is a cursor into that one shared history (a byte offset into the stream it holds
in blocks, ``acp_proxy.ui.history``), not a copy: publishing an event costs the same with 50
observers as with none, and each observer's writer takes its backlog from the history in
batches, a slice per block. Its queue is that backlog, at most ``observer_bytes``: an observer that
falls that far behind is cut off (its write cancelled, a last ``cutoff`` event saying why, its
connection closed). A stuck observer therefore pins nothing the history does not already hold,
and the session and the other observers never wait for it. All of it runs on the proxy's event
loop.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any, Final

import anyio
import orjson

from acp_proxy import __version__
from acp_proxy.base.jsontypes import OMITTED, JsonObject, JsonValue
from acp_proxy.base.values import value
from acp_proxy.record.format import (
    AGENT_TO_CLIENT,
    CLIENT_TO_AGENT,
    Redactor,
    event_line,
    frame_entry,
)
from acp_proxy.shell.log.logsetup import get_logger
from acp_proxy.ui.display import shown
from acp_proxy.ui.entities import EntityView
from acp_proxy.ui.events import StreamBuilder, policy_marks
from acp_proxy.ui.history import History
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.take import Coalesced
from acp_proxy.wire.notes import Observed, VersionNegotiated

# Bounds (docs/live-view.md, "Bounds"); the settings of ``ui:`` override the first three.
HISTORY_BYTES: Final = 64 * 1024 * 1024  # events kept for replay (oldest dropped first)
OBSERVER_BYTES: Final = 8 * 1024 * 1024  # one observer's queue: past it, cut off
MAX_OBSERVERS: Final = 64  # subscriptions at once; more are refused (503)
INGEST_BYTES: Final = 16 * 1024 * 1024  # frames tapped, not yet turned into events
VIEWS_BYTES: Final = 32 * 1024 * 1024  # the entity views' parsed values, all sessions together
FRAME_SHOWN: Final = 256 * 1024  # the bytes of a frame the view keeps (the rest is counted)
ITEM_BYTES: Final = 256  # what a tapped item costs beside its frames' bytes (counted)
IDLE_SHARE: Final = 0.1  # of the loop's time the hub's publishing takes at most, unwatched...
WATCHED_SHARE: Final = 0.5  # ... and with an observer, or a request in the last WATCHED_S
WATCHED_S: Final = 5.0
MAX_SESSIONS: Final = 256  # sessions whose entity view is kept (the oldest ended go first)
PUBLISH_INTERVAL_S: Final = 0.02  # the hub publishes in batches, at most this often
DRAIN_SLICE: Final = 256  # frames turned into events between two yields to the loop
LAG_CHECK_EVERY: Final = 64  # events between two checks of the observers' backlogs
# What is shown of a frame larger than FRAME_SHOWN whose kept part may hold a secret.
TOO_LARGE: Final = b'"[REDACTED: a frame too large to redact key by key]"'
NOTE_BYTES: Final = 512  # what a tapped merge note holds (counted in INGEST_BYTES)

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
    """One subscription: how far it has read of the hub's history (see the module docstring).

    It holds no copy of anything: what it has not yet received is the part of the shared
    history after its cursor, and its lag (``hub.end - offset``) is what its queue would hold.
    """

    __slots__ = ("bound", "cut", "gzip", "offset", "scope", "writing")

    def __init__(self, bound: int, offset: int) -> None:
        self.bound = bound
        self.offset = offset  # the stream offset after the last event it was given
        self.gzip = False  # it is sent the history's compressed blocks
        self.writing = False  # inside a write (cut short, it leaves part of a segment)
        # The scope of the subscription's writes: a cut-off cancels a write the observer is
        # not reading, so its connection ends now rather than when the write times out.
        self.scope: anyio.CancelScope | None = None
        self.cut: str | None = None

    def cut_off(self, reason: str) -> None:
        if self.cut is None:
            self.cut = reason
            if self.scope is not None:
                self.scope.cancel()


class _Session:
    __slots__ = ("conn", "ended", "header", "view")

    def __init__(self, conn: int, header: JsonObject) -> None:
        self.conn = conn
        self.header = header
        self.view = EntityView.for_header(header)
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
        # The published stream; an observer's lag is ``history.end - its offset``.
        self.history = History(self.history_bytes)
        self._published = anyio.Event()  # set when events were published since the last wait
        self._published_set = False  # mirrors it (a plain attribute is cheaper to test)
        self.observers: set[Observer] = set()
        self.sessions: dict[int, _Session] = {}
        self._next_conn = 0
        self._ingest: deque[tuple[Any, ...]] = deque()
        self.ingest_held = 0
        self.ingest_lost = 0  # tapped frames dropped (the ingest queue was full), in all
        self.views_held = 0  # the entity views' ``held``, summed
        self.asked = -WATCHED_S  # when a request last asked for what the hub holds
        self.failed = 0  # tapped items the view failed to turn into events (logged, skipped)
        self._ingest_ready = anyio.Event()
        self._ingest_ready_set = False  # mirrors it
        self._newest: UiTap | None = None
        # Each live session's tap, for its agent's stderr (held no longer than the session).
        self._taps: weakref.WeakKeyDictionary[Any, UiTap] = weakref.WeakKeyDictionary()

    # -- accounting -----------------------------------------------------------------------------

    def bound_bytes(self) -> int:
        """The most the hub holds: its history, the ingest queue and the entity views. Observers
        add no copy: each one's backlog is part of the history (and at most
        ``observer_bytes``)."""
        return self.history_bytes + INGEST_BYTES + VIEWS_BYTES

    def held_bytes(self) -> int:
        """What the hub holds now: the history (which holds every observer's backlog), the
        frames tapped, not yet published (with what each item costs), and what the entity views
        keep."""
        return self.history.held + self.ingest_held + self.views_held

    @property
    def end(self) -> int:
        """Bytes published so far (the stream offset after the last event)."""
        return self.history.end

    def lag_bytes(self) -> int:
        """The largest backlog of an observer still served (at most its bound after a batch)."""
        end = self.history.end
        return max((end - o.offset for o in self.observers if o.cut is None), default=0)

    def caught_up(self, observer: Observer) -> bool:
        """Whether ``observer`` was given every event published so far."""
        return observer.offset >= self.history.end

    # -- hooks.ProcessObserver ------------------------------------------------------------------

    def session_observer(self, session: Any) -> UiTap:
        from acp_proxy.rules.engine import entity_keys_by_rule

        config = session.config
        header: JsonObject = {
            "acp-proxy-record": 1,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": __version__,
            "config": config.source,
            "rules": list(config.rule_names),
            "rule_keys": {
                name: list[JsonValue](keys)
                for name, keys in entity_keys_by_rule(config.rules).items()
            },
            "middleware": [spec.name for spec in config.middleware],
        }
        conn = self.open_session(header)
        self._newest = self._taps[session] = UiTap(self, conn)
        return self._newest

    def agent_stderr(self, line: bytes, session: Any = None) -> None:
        """A line of an agent's stderr: shown in the session whose agent wrote it (with
        ``--listen`` each connection has its own), else in the newest one."""
        tap = self._taps.get(session) if session is not None else None
        if tap is None:
            tap = self._newest
        if tap is not None:
            t = time.monotonic() - tap.start
            if len(line) > FRAME_SHOWN:
                line = _cut(line, FRAME_SHOWN)
            size = len(line) + ITEM_BYTES
            self.ingest((tap.conn, t, "stderr", line, size), size)

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
            self._forget_ended(1)
        self.publish(self.builder.session(conn, header))
        return conn

    def _forget_ended(self, count: int, need: int = 0) -> None:
        """Forget the oldest ended sessions: ``count`` of them whole; then, until ``need`` more
        bytes fit in ``VIEWS_BYTES``, their entity views only (the session, its events and its
        export stay; its panel says it was not kept: ``stopped_at`` 0)."""
        for old in list(self.sessions.values()):
            if count <= 0 and self.views_held + need <= VIEWS_BYTES:
                return
            if not old.ended:
                continue
            self.views_held -= old.view.held
            if count > 0:
                del self.sessions[old.conn]
                count -= 1
            elif old.view.held:
                old.view = EntityView()
                old.view.stop(0)

    def add_line(self, conn: int, line: JsonObject, raw: bytes | None = None) -> None:
        """One record line of session ``conn`` (a frame or a record event; ``raw``: the
        frame's bytes as the line holds them, when the caller has them)."""
        builder = self.builder
        event = builder.line(conn, line, raw)
        session = self.sessions.get(conn)
        if session is not None:
            if line.get("event") == "end":
                session.ended = True
            view = session.view
            cost = view.cost(event) if view.stopped_at is None else 0
            if cost and self.views_held + cost > VIEWS_BYTES:
                self._forget_ended(0, cost)
                if self.views_held + cost > VIEWS_BYTES:
                    view.stop(builder.head)  # the panel says where it stopped
            held = view.held
            try:
                view.feed(event, builder.frame if "dir" in line else OMITTED)
            except Exception as exc:  # the panel misses this frame; the stream does not
                self.failed += 1
                get_logger().error(
                    "the live view failed to apply a frame to its entities",
                    seq=event["seq"],
                    error=f"{type(exc).__name__}: {exc}",
                )
            self.views_held += view.held - held
        self.publish(event)

    def publish(self, event: JsonObject) -> None:
        """Add one event to the history (observers take it from there: O(1) per event, however
        many observers there are)."""
        seq = event["seq"]
        assert isinstance(seq, int)
        self.history.append(seq, b"id: %d\ndata: %b\n\n" % (seq, orjson.dumps(event)))
        if not self._published_set:
            self._published_set = True
            self._published.set()
        if seq % LAG_CHECK_EVERY == 0 and self.observers:
            self.check_lag()

    def check_lag(self) -> None:
        """Cut off every observer more than its bound behind (run after each batch)."""
        end = self.history.end
        for observer in self.observers:
            if observer.cut is None and end - observer.offset > observer.bound:
                observer.cut_off(
                    f"this observer fell more than {observer.bound} bytes behind the session "
                    "(it reads too slowly); reconnect to resume from the last event it received"
                )

    async def wait_published(self, observer: Observer) -> None:
        """Return once there is something after ``observer``'s cursor (or it was cut off)."""
        while observer.cut is None and observer.offset >= self.history.end:
            if self._published_set:
                self._published = anyio.Event()
                self._published_set = False
            await self._published.wait()

    def take(self, observer: Observer, max_bytes: int) -> list[bytes | memoryview]:
        """The bytes after ``observer``'s cursor, up to about ``max_bytes`` (slices of the
        shared blocks: no copy, O(blocks) whatever the number of events); moves the cursor. An
        observer whose next event is no longer held is cut off."""
        found = self.history.read(observer.offset, max_bytes, observer.gzip)
        if found is None:
            observer.cut_off(
                "the events after the last one this observer received are no longer held"
            )
            return []
        parts, observer.offset = found
        return parts

    def events(self, conn: int | None = None) -> Iterator[JsonObject]:
        """The events held, oldest first (``conn``: of one session only)."""
        for data in self.history.data():
            event = orjson.loads(data)
            if conn is None or event.get("conn") == conn:
                yield event

    def replay(self, since: int, gzip: bool = False) -> tuple[list[bytes | memoryview], int]:
        """The bytes of the events after ``since`` still held (``gzip``: compressed), and how
        many were not."""
        return self.history.since(since, gzip)

    # -- observers ------------------------------------------------------------------------------

    def subscribe(self) -> Observer | None:
        """A new observer whose cursor is the newest event (the replay is sent before it)."""
        if len(self.observers) >= self.max_observers:
            return None
        observer = Observer(self.observer_bytes, self.history.end)
        self.observers.add(observer)
        return observer

    def unsubscribe(self, observer: Observer) -> None:
        self.observers.discard(observer)

    def close(self, reason: str) -> None:
        for observer in self.observers:
            observer.cut_off(reason)
        self._published_set = True
        self._published.set()

    # -- the live tap -----------------------------------------------------------------------------

    def ingest(self, item: tuple[Any, ...], size: int) -> None:
        """Queue one tapped item (``size``: what it holds); past ``INGEST_BYTES`` it is dropped
        and counted where it would have been, in its session (one ``lost`` marker for a run of
        drops, so the markers too stay within one item of the bound)."""
        ingest = self._ingest
        if self.ingest_held + size > INGEST_BYTES and ingest:
            self.ingest_lost += 1
            last = ingest[-1]
            if last[2] == "lost":
                counts = last[3]
                counts[item[0]] = counts.get(item[0], 0) + 1
            else:
                ingest.append((item[0], item[1], "lost", {item[0]: 1}, ITEM_BYTES))
                self.ingest_held += ITEM_BYTES
            return
        ingest.append(item)
        self.ingest_held += size
        if not self._ingest_ready_set:
            self._ingest_ready_set = True
            self._ingest_ready.set()

    def watched(self) -> bool:
        """Whether someone looks: an observer, or a request in the last ``WATCHED_S``."""
        return bool(self.observers) or time.monotonic() - self.asked < WATCHED_S

    async def run(self) -> None:
        """Turn tapped frames into events, in batches, until cancelled.

        In slices, each followed by a pause long enough that publishing takes at most its share
        of the loop's time (``IDLE_SHARE`` when nobody looks, ``WATCHED_SHARE`` when someone
        does): the session never waits for the view for longer than a slice, and a view that
        cannot keep up drops frames at the ingest queue (counted as ``lost``), it does not slow
        the session down."""
        while True:
            await self._ingest_ready.wait()
            self._ingest_ready = anyio.Event()
            self._ingest_ready_set = False
            while True:
                start = time.perf_counter()
                more = self.drain(DRAIN_SLICE)
                if not more:
                    break
                share = WATCHED_SHARE if self.watched() else IDLE_SHARE
                await anyio.sleep((time.perf_counter() - start) * (1 / share - 1))
            await anyio.sleep(PUBLISH_INTERVAL_S)

    def drain(self, limit: int | None = None) -> bool:
        """Publish what was tapped so far (at most ``limit`` frames); whether more is left."""
        ingest = self._ingest
        count = len(ingest) if limit is None else min(limit, len(ingest))
        items = [ingest.popleft() for _ in range(count)]
        # One redaction screen for the whole slice (most slices hold nothing to redact).
        frames: list[bytes] = []
        for item in items:
            if item[2] == "frame":
                frames.append(item[4])
                if item[5]:
                    frames.extend(item[5])
        redactor = self.redactor
        screened = None if redactor.clean(frames) else redactor
        for item in items:
            self.ingest_held -= item[-1]
            try:
                self._publish_item(item, screened)
            except Exception as exc:  # the view's own failure: the session never sees it
                self.failed += 1
                get_logger().error(
                    "the live view failed to show a frame", error=f"{type(exc).__name__}: {exc}"
                )
        self.published()
        return bool(ingest)

    def _publish_item(self, item: tuple[Any, ...], screened: Redactor | None) -> None:
        conn, t, what = item[0], item[1], item[2]
        if what == "frame":
            _, _, _, direction, raw, sent, changed_by, kind, generated, cut, policy, _ = item
            if cut:
                # Only the first FRAME_SHOWN bytes are kept: not JSON, so not redactable key by
                # key. A part that may hold anything to redact is not shown at all.
                raw = TOO_LARGE if self.redactor.needs_work(raw) else raw
                if sent:
                    sent = [TOO_LARGE if self.redactor.needs_work(f) else f for f in sent]
            line, cleaned = frame_entry(
                t,
                direction,
                raw,
                screened,
                sent=sent,
                changed_by=changed_by,
                kind=kind,
                generated=generated,
            )
            if cut:
                line["truncated"] = cut
            if policy:
                line["policy"] = policy
            self.add_line(conn, line, cleaned)
        elif what == "stderr":
            cleaned, _ = self.redactor.frame(item[3])
            text = shown(cleaned.rstrip(b"\r").decode("utf-8", "replace"))
            self.add_line(conn, orjson.loads(event_line(t, "stderr", line=text)))
        elif what == "lost":
            for lost_conn, frames in item[3].items():
                self.add_line(lost_conn, orjson.loads(event_line(t, "lost", frames=frames)))
        else:
            self.add_line(conn, orjson.loads(event_line(t, what, **item[3])))

    def published(self) -> None:
        """End of a batch: its events become one block of the history, the observers' backlogs
        are checked."""
        self.history.seal()
        if self.observers:
            self.check_lag()


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
                policy: list[JsonObject] | None = None
                for info in note.messages:
                    if info.changed_by:
                        changed_by.extend(n for n in info.changed_by if n not in changed_by)
                    if info.marks:
                        policy = (policy or []) + policy_marks(info.marks)
                raw, sent = note.raw, note.sent
                size = len(raw)
                if sent:
                    size += sum(map(len, sent))
                cut = 0
                if size > FRAME_SHOWN:
                    raw, sent, cut = _shown(raw, sent, size)
                    size -= cut
                size += ITEM_BYTES
                hub.ingest(
                    (
                        self.conn,
                        t,
                        "frame",
                        _DIR[note.direction],
                        raw,
                        sent,
                        changed_by,
                        note.kind,
                        False,
                        cut,
                        policy,
                        size,
                    ),
                    size,
                )
                for reply in note.replies:
                    self._generated(_OTHER[note.direction], reply, t)
            elif type(note) is VersionNegotiated:
                fields = {"protocolVersion": note.version}
                hub.ingest((self.conn, t, "version", fields, ITEM_BYTES), ITEM_BYTES)

    def on_generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        t = now - self.start
        for frame in frames:
            self._generated(_DIR[direction], frame, t)

    def _generated(self, direction: str, frame: bytes, t: float) -> None:
        size, cut = len(frame), 0
        if size > FRAME_SHOWN:
            frame, _, cut = _shown(frame, None, size)
        size += ITEM_BYTES - cut
        item = (self.conn, t, "frame", direction, frame, None, (), "message", True, cut, None, size)
        self.hub.ingest(item, size)

    def on_coalesced(self, direction: Direction, merge: Coalesced, now: float) -> None:
        fields = {
            "direction": _DIR[direction],
            "update": merge.kind,
            "entity": list(merge.entity),
            "frames": merge.merged,
            "written": merge.written,
            "bytes": merge.size,
        }
        item = (self.conn, now - self.start, "coalesced", fields, NOTE_BYTES)
        self.hub.ingest(item, NOTE_BYTES)  # (more than the note and its item hold)

    def event(self, name: str, now: float, **fields: object) -> None:  # as Recorder.event
        self.hub.ingest((self.conn, now - self.start, name, fields, NOTE_BYTES), NOTE_BYTES)

    def on_end(self, session: Any, now: float) -> None:
        summary = dict(session.summary())
        version = summary.pop("version", None)
        fields = {"exit": None, "protocolVersion": version, "summary": summary}
        self.hub.ingest((self.conn, now - self.start, "end", fields, ITEM_BYTES), ITEM_BYTES)


def _cut(frame: bytes, keep: int) -> bytes:
    """The first ``keep`` bytes of ``frame`` at most, not ending inside a UTF-8 sequence."""
    if len(frame) <= keep:
        return frame
    while keep > 0 and frame[keep] & 0xC0 == 0x80:
        keep -= 1
    return frame[:keep]


def _shown(
    raw: bytes, sent: tuple[bytes, ...] | None, size: int
) -> tuple[bytes, tuple[bytes, ...] | None, int]:
    """What the view keeps of a frame and the frames sent instead (``size`` bytes together):
    ``FRAME_SHOWN`` bytes at most, the frame first; and how many bytes it leaves out."""
    kept = _cut(raw, FRAME_SHOWN)
    left = FRAME_SHOWN - len(kept)
    if sent:
        shown_sent = []
        for frame in sent:
            part = _cut(frame, left)
            shown_sent.append(part)
            left -= len(part)
        sent = tuple(shown_sent)
    return kept, sent, size - (FRAME_SHOWN - left)
