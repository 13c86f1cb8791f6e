"""The live view's hub: the frames tapped, the event history and the observers' cursors.

Contract: owns what the ``--ui`` server publishes. ``UiHub`` is a ``hooks.ProcessObserver``:
each session gets a ``UiTap`` (``acp_proxy.shell.ui.tap``), which hands the hub references to
the frames it is told about (a frame's first ``FRAME_SHOWN`` bytes only), never waits and
returns: the session never waits for the view. The hub keeps them raw in a ring
(``acp_proxy.ui.pending``) and describes them only when someone looks: it turns them into
record lines (``acp_proxy.record.format``, redaction included), stream events
(``acp_proxy.ui.events``) and entity views (``acp_proxy.ui.entities``, within ``VIEWS_BYTES``
together) as they come while an observer is subscribed, and all of them before it answers a
request (``catch_up``), in slices that take at most ``WATCHED_SHARE`` of the loop's time. While
nobody looks, nothing is described: the ring and the events held share ``history_bytes``, the
oldest going first (events block by block, then frames, counted as lost where they were),
and the ring holds at most ``INGEST_BYTES`` (its oldest frames go); while an observer is
subscribed, the ring holds at most ``INGEST_BYTES`` too, and a frame past it is counted as lost
where it was dropped, never waited for. The last ``history_bytes`` of events
are kept for replay and for every observer. A frame the hub fails on is logged and skipped: no
exception of the view reaches the session.

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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import anyio
import orjson

from acp_proxy import __version__
from acp_proxy.base.jsontypes import OMITTED, Field, JsonObject, JsonValue
from acp_proxy.base.values import value
from acp_proxy.config import DEFAULT_MAX_PARSE_BYTES
from acp_proxy.record.format import Redactor, event_line, frame_entry
from acp_proxy.shell.log.logsetup import get_logger
from acp_proxy.shell.ui.tap import FRAME_SHOWN, ITEM_BYTES, UiTap, cut
from acp_proxy.ui.display import shown
from acp_proxy.ui.events import StreamBuilder, passed, policy_marks
from acp_proxy.ui.history import History
from acp_proxy.ui.pending import Pending

if TYPE_CHECKING:
    from acp_proxy.ui.entities import EntityView

# Bounds (docs/live-view.md, "Bounds"); the settings of ``ui:`` override the first three.
HISTORY_BYTES: Final = 64 * 1024 * 1024  # events kept for replay (oldest dropped first)
OBSERVER_BYTES: Final = 8 * 1024 * 1024  # one observer's queue: past it, cut off
MAX_OBSERVERS: Final = 64  # subscriptions at once; more are refused (503)
INGEST_BYTES: Final = 16 * 1024 * 1024  # frames tapped, not yet described (the ring)
VIEWS_BYTES: Final = 32 * 1024 * 1024  # the entity views' parsed values, all sessions together
WATCHED_SHARE: Final = 0.5  # of the loop's time the hub's describing takes at most
MAX_SESSIONS: Final = 256  # sessions whose entity view is kept (the oldest ended go first)
PUBLISH_INTERVAL_S: Final = 0.02  # the hub publishes in batches, at most this often
DRAIN_SLICE: Final = 256  # frames turned into events between two yields to the loop
LAG_CHECK_EVERY: Final = 64  # events between two checks of the observers' backlogs
# What is shown of a frame larger than FRAME_SHOWN whose kept part may hold a secret.
TOO_LARGE: Final = b'"[REDACTED: a frame too large to redact key by key]"'


@value
class HubLimits:
    """The hub's bounds (the ``ui:`` settings)."""

    history_bytes: int = HISTORY_BYTES
    observer_bytes: int = OBSERVER_BYTES
    max_observers: int = MAX_OBSERVERS


def _rule_keys(rules: Any) -> JsonObject:
    """The entity keys each of ``rules`` writes (the rules' module is loaded only when there
    are rules: it is then already)."""
    if not rules:
        return {}
    from acp_proxy.rules.engine import entity_keys_by_rule

    return {name: list[JsonValue](keys) for name, keys in entity_keys_by_rule(rules).items()}


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
    __slots__ = ("_view", "conn", "ended", "header", "max_parse")

    def __init__(self, conn: int, header: JsonObject, max_parse: int) -> None:
        self.conn = conn
        self.header = header
        self.max_parse = max_parse  # its parse budget (what a frame that passed as it came is)
        self._view: EntityView | None = None
        self.ended = False

    @property
    def view(self) -> EntityView:
        """Its entity view (made, and its module loaded, when first asked for: a view that
        describes nothing never needs one)."""
        if self._view is None:
            from acp_proxy.ui.entities import EntityView

            self._view = EntityView.for_header(self.header)
        return self._view

    @view.setter
    def view(self, view: EntityView) -> None:
        self._view = view


class UiHub:
    """Events in, observers out (see the module docstring)."""

    def __init__(
        self,
        *,
        mode: str = "live",
        redactor: Redactor | Callable[[], Redactor] | None = None,
        limits: HubLimits | None = None,
    ) -> None:
        limits = limits if limits is not None else HubLimits()
        self.mode = mode
        # Built when first needed (a callable: built then), by a view that describes something.
        self._redactor = redactor if redactor is not None else Redactor.build
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
        self.pending = Pending()  # what the taps gave, not described yet
        self.views_held = 0  # the entity views' ``held``, summed
        self.failed = 0  # tapped items the view failed to turn into events (logged, skipped)
        self.described = 0  # frames described (turned into events), in all
        self._ingest_ready = anyio.Event()  # set when an observer waits for what was tapped
        self._ingest_ready_set = False  # mirrors it
        self._resume_at = 0.0  # describing goes on from then (``perf_counter``), not before
        self._newest: UiTap | None = None
        # Each live session's tap, for its agent's stderr (held no longer than the session).
        self._taps: weakref.WeakKeyDictionary[Any, UiTap] = weakref.WeakKeyDictionary()

    @property
    def redactor(self) -> Redactor:
        """What removes the secrets from what the view shows (built on first use)."""
        if not isinstance(self._redactor, Redactor):
            self._redactor = self._redactor()
        return self._redactor

    # -- accounting -----------------------------------------------------------------------------

    def bound_bytes(self) -> int:
        """The most the hub holds: its history and the frames not described yet (together
        ``history_bytes``, plus ``INGEST_BYTES`` of frames while an observer is subscribed),
        and the entity views. Observers add no copy: each one's backlog is part of the history
        (and at most ``observer_bytes``)."""
        return self.history_bytes + INGEST_BYTES + VIEWS_BYTES

    def held_bytes(self) -> int:
        """What the hub holds now: the history (which holds every observer's backlog), the
        frames tapped, not yet described (with what each item costs), and what the entity views
        keep."""
        return self.history.held + self.pending.held + self.views_held

    @property
    def ingest_lost(self) -> int:
        """Tapped frames dropped before they were described, in all."""
        return self.pending.lost

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
        config = session.config
        header: JsonObject = {
            "acp-proxy-record": 1,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": __version__,
            "config": config.source,
            "rules": list(config.rule_names),
            "rule_keys": _rule_keys(config.rules),
            "middleware": [spec.name for spec in config.middleware],
        }
        conn = self.open_session(header, config.max_parse_bytes, queued=True)
        self._newest = self._taps[session] = UiTap(self, conn, config.max_parse_bytes)
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
                line = cut(line, FRAME_SHOWN)
            size = len(line) + ITEM_BYTES
            self.ingest((tap.conn, t, "stderr", line, size), size)

    def agent_exited(self, returncode: int) -> None:
        pass

    def listening(self, accepting: bool) -> None:
        pass

    # -- sessions and events --------------------------------------------------------------------

    def open_session(
        self, header: JsonObject, max_parse: int = DEFAULT_MAX_PARSE_BYTES, queued: bool = False
    ) -> int:
        """A new session (``header``: its record header; ``max_parse``: its parse budget); its
        event is published now, or with ``queued`` (a live session) in its place among the
        frames tapped."""
        self._next_conn += 1
        conn = self._next_conn
        header.setdefault("conn", conn)
        self.sessions[conn] = _Session(conn, header, max_parse)
        if len(self.sessions) > MAX_SESSIONS:
            self._forget_ended(1)
        if queued:
            self.ingest((conn, 0.0, "session", None, ITEM_BYTES), ITEM_BYTES)
        else:
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
                from acp_proxy.ui.entities import EntityView

                old.view = EntityView()
                old.view.stop(0)

    def add_line(
        self, conn: int, line: JsonObject, raw: bytes | None = None, frame: Field = OMITTED
    ) -> None:
        """One record line of session ``conn`` (a frame or a record event; ``raw``: the
        frame's bytes as the line holds them, when the caller has them; ``frame``: their
        ``parse_frame``, when the caller parsed them)."""
        builder = self.builder
        event = builder.line(conn, line, raw, frame)
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
        """A new observer whose cursor is the newest event (the replay is sent before it; the
        caller caught up first: ``catch_up``). From now on, what is tapped is described as it
        comes."""
        if len(self.observers) >= self.max_observers:
            return None
        observer = Observer(self.observer_bytes, self.history.end)
        self.observers.add(observer)
        if self.pending:
            self._wake()
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
        """Queue one tapped item (``size``: what it costs, its last field). While an observer
        is subscribed, past ``INGEST_BYTES`` it is dropped and counted where it would have been,
        in its session (one ``lost`` marker for a run of drops). While nobody looks, the oldest
        items go past ``INGEST_BYTES`` (counted as lost at the head), and the items and the
        events held share ``history_bytes``: the oldest events go first, then the oldest
        items."""
        pending = self.pending
        if self.observers:
            if pending.held + size > INGEST_BYTES and pending.items:
                pending.refuse(item)
                return
            pending.add(item)
            if not self._ingest_ready_set:
                self._wake()
            return
        history = self.history
        if pending.held + size > INGEST_BYTES:  # (the ring's own bound)
            pending.drop_oldest(INGEST_BYTES - size)
        if pending.held + size + history.held > self.history_bytes:
            history.outside = pending.held + size
            history.trim()
            room = self.history_bytes - history.held - size
            if pending.held > room:
                pending.drop_oldest(room)
        history.outside = pending.held + size
        pending.add(item)

    def _wake(self) -> None:
        self._ingest_ready_set = True
        self._ingest_ready.set()

    async def run(self) -> None:
        """Describe what is tapped while an observer is subscribed, in batches, until
        cancelled (``describe_slice``: at most ``WATCHED_SHARE`` of the loop's time). The
        session never waits for the view for longer than a slice, and a view that cannot keep
        up drops frames at the queue (counted as ``lost``), it does not slow the session
        down."""
        while True:
            await self._ingest_ready.wait()
            self._ingest_ready = anyio.Event()
            self._ingest_ready_set = False
            while self.observers and await self.describe_slice():
                pass
            await anyio.sleep(PUBLISH_INTERVAL_S)

    async def catch_up(self) -> None:
        """Return once everything tapped before the call is described (a request answers from
        what the hub holds: it waits for this first), in slices (``describe_slice``)."""
        pending = self.pending
        target = pending.added
        while pending.left < target and await self.describe_slice():
            pass

    async def describe_slice(self) -> bool:
        """Describe a slice of ``DRAIN_SLICE`` frames; whether more is left. Between slices,
        whoever describes waits long enough that describing takes at most ``WATCHED_SHARE``
        of the loop's time: the sessions and the observers run in between."""
        while (wait := self._resume_at - time.perf_counter()) > 0:
            await anyio.sleep(wait)
        start = time.perf_counter()
        more = self.drain(DRAIN_SLICE)
        now = time.perf_counter()
        self._resume_at = now + (now - start) * (1 / WATCHED_SHARE - 1)
        return more

    def drain(self, limit: int | None = None) -> bool:
        """Describe what was tapped so far (at most ``limit`` frames): publish its events;
        whether more is left."""
        pending = self.pending
        items = pending.take(limit)
        self.history.outside = pending.held
        # Runs as frames, and one redaction screen for the whole slice (most slices hold
        # nothing to redact).
        work: list[tuple[Any, ...]] = []
        frames: list[bytes] = []
        for item in items:
            what = item[2]
            if what == "run":
                conn, t, _, direction, runs, _, _ = item
                for run in runs:
                    parts = run.split(b"\n")
                    frames += parts
                    for raw in parts:
                        work.append(
                            (conn, t, "frame", direction, raw, None, (), None, False, 0, ())
                        )
                continue
            if what == "frame":
                frames.append(item[4])
                if item[5]:
                    frames.extend(item[5])
            work.append(item)
        redactor = self.redactor
        screened = None if redactor.clean(frames) else redactor
        for item in work:
            try:
                self._publish_item(item, screened)
            except Exception as exc:  # the view's own failure: the session never sees it
                self.failed += 1
                get_logger().error(
                    "the live view failed to show a frame", error=f"{type(exc).__name__}: {exc}"
                )
        self.published()
        return bool(pending)

    def _publish_item(self, item: tuple[Any, ...], screened: Redactor | None) -> None:
        conn, t, what = item[0], item[1], item[2]
        if what == "frame":
            self._publish_frame(item, screened)
        elif what == "stderr":
            cleaned, _ = self.redactor.frame(item[3])
            text = shown(cleaned.rstrip(b"\r").decode("utf-8", "replace"))
            self.add_line(conn, orjson.loads(event_line(t, "stderr", line=text)))
        elif what == "lost":
            for lost_conn, frames in item[3].items():
                self.add_line(lost_conn, orjson.loads(event_line(t, "lost", frames=frames)))
        elif what == "session":
            session = self.sessions.get(conn)
            if session is not None:  # (else forgotten: MAX_SESSIONS)
                self.publish(self.builder.session(conn, session.header))
        else:
            self.add_line(conn, orjson.loads(event_line(t, what, **item[3])))

    def _publish_frame(self, item: tuple[Any, ...], screened: Redactor | None) -> None:
        conn, t, _, direction, raw, sent, changed_by, kind, generated, cut, marks = item[:11]
        self.described += 1
        value: Field = OMITTED
        if kind is None:  # it passed as it came: what it is is found now, in one parse
            session = self.sessions.get(conn)
            budget = session.max_parse if session is not None else DEFAULT_MAX_PARSE_BYTES
            kind, value = passed(raw, budget)
        if cut:
            # Only the first FRAME_SHOWN bytes are kept: not JSON, so not redactable key by
            # key. A part that may hold anything to redact is not shown at all.
            raw = TOO_LARGE if self.redactor.needs_work(raw) else raw
            if sent:
                sent = [TOO_LARGE if self.redactor.needs_work(f) else f for f in sent]
            value = OMITTED
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
        if marks and (policy := policy_marks(marks)):
            line["policy"] = list[JsonValue](policy)
        self.add_line(conn, line, cleaned, value if cleaned is raw else OMITTED)

    def published(self) -> None:
        """End of a batch: its events become one block of the history, the observers' backlogs
        are checked."""
        self.history.seal()
        if self.observers:
            self.check_lag()
