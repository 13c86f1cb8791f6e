"""Prometheus metrics of the proxy, from the pipeline's ``Observed`` notes.

Contract: owns the request- and frame-level metric names and the accounting behind them (the
turn-level ones are ``turn_metrics``'s, fed from here): ``Metrics`` (process-wide counters and
the live sessions) and ``SessionMetrics`` (a ``SessionObserver`` per session: joins each request
with its response to time it). Pure: the clock is the ``now`` the shell passes in, nothing here
reads a socket or logs; ``collect`` hands ``prometheus_client`` metric families to the shell's
HTTP responder at scrape time.

Why plain dicts and a collector instead of ``prometheus_client.Counter`` objects: the observer
runs on the session's task for every frame, and a client-library counter takes a lock per
increment; a dict increment does not, and all sessions share one event loop (one thread), so
nothing else touches the dicts while an observer runs. Gauges (pending requests, queue bytes,
sessions) are read from the live sessions at scrape time only: they cost nothing per frame.

Label values are bounded (Prometheus: "do not use labels to store dimensions with high
cardinality"; the sets are ``labels``'s): methods outside the ACP schema, error codes outside
the JSON-RPC and ACP ones and protocol versions other than 1 and 2 are ``other``; rule names
come from the config file (a fixed set per process); agent exit statuses are an exit code
(0-255) or a signal name.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import orjson

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.policy.middleware import AuditEntry
from acp_proxy.telemetry import turns
from acp_proxy.telemetry.families import (
    Histogram,
    bump,
    counter_family,
    gauge_family,
    histogram_family,
)
from acp_proxy.telemetry.labels import (
    code_label,
    exit_status_label,
    method_label,
    not_parsed_label,
    version_label,
)
from acp_proxy.telemetry.policy_metrics import PERMISSION, PolicyStats
from acp_proxy.telemetry.turn_metrics import TurnStats
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.pipeline import (
    Dropped,
    MiddlewareFailed,
    NonJson,
    Note,
    NotParsed,
    Observed,
    OversizeFrame,
    PendingFull,
    VersionNegotiated,
)

RESULT: Final = "result"
ERROR: Final = "error"
NO_ANSWER: Final = "no_answer"

_C2A = Direction.CLIENT_TO_AGENT
_A2C = Direction.AGENT_TO_CLIENT
_DIRECTIONS: Final = (_C2A, _A2C)
# A frame whose messages name one of these is decoded for the turn tracker.
_TURN_METHODS: Final = frozenset({*turns.METHODS})


class SessionView(Protocol):
    """What the metrics read of a live session at scrape time (``shell.session.PumpSession``)."""

    @property
    def connection(self) -> Any: ...  # .pending_client_requests / .pending_agent_requests

    @property
    def to_client(self) -> Any: ...  # .held(), .queue.stats.merged

    @property
    def to_agent(self) -> Any: ...

    @property
    def stats(self) -> Any: ...  # .to_client / .to_agent: SideStats (bytes, discarded)


def _counter() -> dict[tuple[str, ...], int]:
    return {}


@dataclass(slots=True)
class _Totals:
    """What finished sessions left behind, for counters read from session stats."""

    coalesced: int = 0
    written: dict[Direction, int] = field(default_factory=lambda: dict.fromkeys(_DIRECTIONS, 0))
    discarded: dict[Direction, int] = field(default_factory=lambda: dict.fromkeys(_DIRECTIONS, 0))


class Metrics:
    """The process's metrics: counters fed by the sessions' observers, and the live sessions.

    ``ready_on_initialize``: readiness flips to true when an agent answers ``initialize``
    (stdio, ``--connect``); otherwise the shell sets ``ready`` (``--listen``: the listener
    accepts). Not thread-safe: one event loop feeds it, and the scrape runs on that loop too.
    """

    def __init__(self, *, max_pending: int, ready_on_initialize: bool = True) -> None:
        self.max_pending = max_pending
        self.ready_on_initialize = ready_on_initialize
        self.ready = False
        self.live: dict[int, SessionView] = {}
        self.frames = _counter()  # (direction,)
        self.frame_bytes = _counter()  # (direction,)
        self.messages = _counter()  # (direction, type, method)
        self.rewritten = _counter()  # (rule,)
        self.dropped = _counter()  # (reason, rule)
        self.diverted = _counter()  # (kind,)
        self.oversize = _counter()  # (direction,)
        self.not_parsed = _counter()  # (direction, reason)
        self.middleware_failures = _counter()  # (middleware,)
        self.generated = _counter()  # (direction,)
        self.untracked = _counter()  # (direction,): requests not timed (table full)
        self.sessions_started = 0
        self.observer_errors = 0  # bugs of ours, caught (see SessionMetrics.on_notes)
        self.agent_exits = _counter()  # (status,)
        self.detach = _counter()  # (event,): detach, reattach, refused, takeover, expired
        self.replayed = 0  # frames sent again to reattached clients
        self.versions = _counter()  # (version,): negotiated protocol versions
        self.durations: dict[tuple[str, ...], Histogram] = {}  # (direction, method, outcome)
        self.errors = _counter()  # (direction, method, error_code)
        self.turns = TurnStats()
        self.policy = PolicyStats()
        self.totals = _Totals()

    # -- fed by the observers and the shell -----------------------------------------------------

    def session(self, session: SessionView) -> SessionMetrics:
        """A new session starts: its observer."""
        self.sessions_started += 1
        self.live[id(session)] = session
        return SessionMetrics(self, session)

    def agent_exited(self, returncode: int) -> None:
        key = (exit_status_label(returncode),)
        self.agent_exits[key] = self.agent_exits.get(key, 0) + 1

    def detach_event(self, event: str, replayed: int) -> None:
        bump(self.detach, (event,))
        self.replayed += replayed

    def observe_duration(
        self, direction: Direction, method: str, outcome: str, code: str, seconds: float
    ) -> None:
        key = (str(direction), method, outcome)
        hist = self.durations.get(key)
        if hist is None:
            hist = self.durations[key] = Histogram()
        hist.observe(seconds)
        if outcome == ERROR:
            bump(self.errors, (str(direction), method, code))

    def ended(self, session: SessionView) -> None:
        """Fold a finished session's stats into the totals and forget it."""
        if self.live.pop(id(session), None) is None:
            return
        totals = self.totals
        totals.coalesced += session.to_client.queue.stats.merged
        # Bytes written toward a side count under the direction that ends there.
        totals.written[_A2C] += session.stats.to_client.bytes
        totals.written[_C2A] += session.stats.to_agent.bytes
        totals.discarded[_A2C] += session.stats.to_client.discarded
        totals.discarded[_C2A] += session.stats.to_agent.discarded

    # -- exposition -----------------------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        """The metric families (``prometheus_client`` collector protocol)."""
        counter, gauge = counter_family, gauge_family

        def per_direction(values: dict[Direction, int]) -> dict[tuple[str, ...], int]:
            return {(str(d),): v for d, v in values.items()}

        live = list(self.live.values())
        yield counter(
            "frames_total",
            "Frames (lines) read, by the direction they travel.",
            ["direction"],
            self._all_directions(self.frames),
        )
        yield counter(
            "frame_bytes_total",
            "Bytes of the frames read (newline excluded), by direction.",
            ["direction"],
            self._all_directions(self.frame_bytes),
        )
        yield counter(
            "messages_total",
            "JSON-RPC messages read, by direction, type (request, notification, response) and "
            "method (a response counts under the method it answers; other: outside ACP).",
            ["direction", "type", "method"],
            self.messages,
        )
        yield counter(
            "rewritten_total",
            "Messages changed, by the rule or middleware that changed them.",
            ["rule"],
            self.rewritten,
        )
        yield counter(
            "dropped_total",
            "Messages not forwarded, by reason (rule: dropped or answered by a middleware, "
            "named in `rule`; oversize; pending_full; fail_closed).",
            ["reason", "rule"],
            self.dropped,
        )
        yield counter(
            "diverted_total",
            "Agent stdout lines that were not JSON-RPC, diverted to the log, by kind.",
            ["kind"],
            self.diverted,
        )
        yield counter(
            "oversize_total",
            "Frames over max_frame_bytes, discarded, by direction.",
            ["direction"],
            self._all_directions(self.oversize),
        )
        yield counter(
            "not_parsed_total",
            "Frames forwarded untouched because they could not be parsed, by direction and "
            "reason (parse_budget, invalid_json, batch).",
            ["direction", "reason"],
            self.not_parsed,
        )
        yield counter(
            "middleware_failures_total",
            "Middleware calls that raised, by middleware.",
            ["middleware"],
            self.middleware_failures,
        )
        yield counter(
            "generated_frames_total",
            "Frames the proxy wrote on its own (errors for requests left in flight), by direction.",
            ["direction"],
            self.generated,
        )
        yield counter(
            "untimed_requests_total",
            "Requests not timed because as many were already waiting (max_pending_requests).",
            ["direction"],
            self.untracked,
        )
        coalesced = self.totals.coalesced + sum(s.to_client.queue.stats.merged for s in live)
        yield counter(
            "coalesced_total",
            "Session updates merged into a later one under backpressure.",
            [],
            {(): coalesced},
        )
        written = dict(self.totals.written)
        discarded = dict(self.totals.discarded)
        for s in live:
            written[_A2C] += s.stats.to_client.bytes
            written[_C2A] += s.stats.to_agent.bytes
            discarded[_A2C] += s.stats.to_client.discarded
            discarded[_C2A] += s.stats.to_agent.discarded
        yield counter(
            "written_bytes_total",
            "Bytes written toward the receiver of each direction (newlines included).",
            ["direction"],
            per_direction(written),
        )
        yield counter(
            "discarded_frames_total",
            "Frames discarded because their receiver was gone, by direction.",
            ["direction"],
            per_direction(discarded),
        )
        yield counter("sessions_total", "Sessions started.", [], {(): self.sessions_started})
        yield counter(
            "agent_exits_total",
            "Agent processes that exited, by status (exit_N or signal_NAME).",
            ["status"],
            self.agent_exits,
        )
        yield counter(
            "detach_events_total",
            "detach_grace: client connections that ended with their agent kept (detach), "
            "reattached, were refused a reattach, took a session over, or whose agent's grace "
            "time ended (expired).",
            ["event"],
            self.detach,
        )
        yield counter(
            "replayed_frames_total",
            "Frames sent to a reattached client that the agent sent while it was away.",
            [],
            {(): self.replayed},
        )
        yield counter(
            "protocol_versions_total",
            "Sessions by negotiated ACP protocol version (1, 2; other: any other value).",
            ["version"],
            self.versions,
        )
        yield counter(
            "request_errors_total",
            "Requests answered with a JSON-RPC error, by the request's direction, method and "
            "error code (other: a code outside JSON-RPC's and ACP's).",
            ["direction", "method", "error_code"],
            self.errors,
        )
        yield histogram_family(
            "request_duration_seconds",
            "Time from a request crossing the proxy to its response crossing back, by the "
            "request's direction, method and outcome (result, error, no_answer: the peer went "
            "away or the session ended first).",
            ["direction", "method", "outcome"],
            self.durations,
        )
        yield from self.turns.collect()
        yield from self.policy.collect()

        yield gauge("open_sessions", "Sessions (connections) open now.", [], {(): len(live)})
        yield gauge(
            "pending_requests",
            "Requests forwarded and not answered yet, by the request's direction.",
            ["direction"],
            {
                (str(_C2A),): sum(s.connection.pending_client_requests for s in live),
                (str(_A2C),): sum(s.connection.pending_agent_requests for s in live),
            },
        )
        yield gauge(
            "outbound_queue_bytes",
            "Bytes waiting to be written toward the receiver of each direction.",
            ["direction"],
            {
                (str(_A2C),): sum(s.to_client.held() for s in live),
                (str(_C2A),): sum(s.to_agent.held() for s in live),
            },
        )
        yield gauge("ready", "1 when /readyz answers 200.", [], {(): 1 if self.ready else 0})

    @staticmethod
    def _all_directions(values: dict[tuple[str, ...], int]) -> dict[tuple[str, ...], int]:
        # Both directions always appear (a rate over a series that does not exist yet is empty,
        # not zero).
        out: dict[tuple[str, ...], int] = {(str(d),): 0 for d in _DIRECTIONS}
        out.update(values)
        return out


def _hashable_id(value: JsonValue) -> bool:
    return value is not None and type(value) in (str, int, float)


def _error_codes(raw: bytes) -> dict[Any, object]:
    """id -> error code of the error responses in a frame (one message or a batch)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    entries = value if isinstance(value, list) else [value]
    out: dict[Any, object] = {}
    for entry in entries:
        if isinstance(entry, dict):
            error = entry.get("error")
            ident = entry.get("id")
            if isinstance(error, dict) and _hashable_id(ident):
                out[ident] = error.get("code")
    return out


class SessionMetrics:
    """The ``SessionObserver`` of one session: counts its frames and times its requests.

    A request is timed from the read of the frame that carried it to the read of its response
    (both as the proxy sees them), keyed by (direction, id) in a table bounded like the
    pipeline's pending table (``max_pending_requests`` per direction).
    """

    __slots__ = ("_metrics", "_oversize_size", "_session", "_starts", "_turns")

    def __init__(self, metrics: Metrics, session: SessionView) -> None:
        self._metrics = metrics
        self._session = session
        self._turns = turns.TurnTracker()
        self._starts: dict[Direction, dict[Any, tuple[float, str]]] = {_C2A: {}, _A2C: {}}
        self._oversize_size = 0

    def on_notes(self, notes: tuple[Note, ...], now: float) -> None:
        # An observer must never raise (it would stop the session): a bug here is counted in
        # ``acp_proxy_observer_errors_total`` instead. A try block costs nothing until it fires.
        try:
            self._notes(notes, now)
        except Exception:
            self._metrics.observer_errors += 1

    def _notes(self, notes: tuple[Note, ...], now: float) -> None:
        m = self._metrics
        for note in notes:
            kind = type(note)
            if kind is Observed:
                assert isinstance(note, Observed)
                self._observed(note, now)
            elif kind is Dropped:
                assert isinstance(note, Dropped)
                bump(m.dropped, ("rule", note.dropped_by))
            elif kind is NonJson:
                assert isinstance(note, NonJson)
                if not note.forwarded:
                    bump(m.diverted, (note.kind,))
            elif kind is OversizeFrame:
                assert isinstance(note, OversizeFrame)
                self._oversize_size = note.size
            elif kind is NotParsed:
                assert isinstance(note, NotParsed)
                bump(m.not_parsed, (str(note.direction), not_parsed_label(note.reason)))
            elif kind is PendingFull:
                bump(m.dropped, ("pending_full", ""))
            elif kind is MiddlewareFailed:
                assert isinstance(note, MiddlewareFailed)
                bump(m.middleware_failures, (note.failure.middleware,))
                if note.failure.fail_closed:
                    bump(m.dropped, ("fail_closed", note.failure.middleware))
            elif kind is VersionNegotiated:
                assert isinstance(note, VersionNegotiated)
                bump(m.versions, (version_label(note.version),))
                self._turns.version = note.version

    def _observed(self, note: Observed, now: float) -> None:
        m = self._metrics
        direction = note.direction
        dkey = (str(direction),)
        bump(m.frames, dkey)
        if note.kind == "oversize":
            bump(m.frame_bytes, dkey, self._oversize_size)
            bump(m.oversize, dkey)
            bump(m.dropped, ("oversize", ""))
            return
        bump(m.frame_bytes, dkey, len(note.raw))
        if not note.messages:
            return
        if (note.sent is None or note.sent) and any(
            info.update_kind in turns.UPDATE_KINDS
            or info.method in _TURN_METHODS
            or info.answers in _TURN_METHODS
            for info in note.messages
        ):
            self._feed_turns(direction, note.raw, now)
        # A request dropped or answered by the proxy never reached the peer: not timed.
        forwarded = note.sent is None or bool(note.sent)
        codes: dict[Any, object] | None = None
        starts = self._starts[direction]
        for info in note.messages:
            if info.marks:
                self._marks(info.marks, info.id, now)
            if info.changed_by:
                for rule in info.changed_by:
                    bump(m.rewritten, (rule,))
            if info.method is not None:
                label = method_label(info.method)
                if _hashable_id(info.id):
                    bump(m.messages, (dkey[0], "request", label))
                    if forwarded:
                        if len(starts) < m.max_pending:
                            starts[info.id] = (now, label)
                        else:
                            bump(m.untracked, dkey)
                else:
                    bump(m.messages, (dkey[0], "notification", label))
                continue
            # A response: it answers a request that went the other way.
            bump(m.messages, (dkey[0], "response", method_label(info.answers)))
            if not _hashable_id(info.id):
                continue
            other = direction.reverse
            started = self._starts[other].pop(info.id, None)
            if started is None:
                continue
            if codes is None:
                codes = _error_codes(note.raw) if b'"error"' in note.raw else {}
            if info.id in codes:
                outcome, code = ERROR, code_label(codes[info.id])
            else:
                outcome, code = RESULT, ""
            m.observe_duration(other, started[1], outcome, code, now - started[0])
            if info.answers == "initialize" and other is _C2A and m.ready_on_initialize:
                m.ready = True

    def _marks(self, marks: tuple[object, ...], rid: JsonValue, now: float) -> None:
        """The policy's decisions on a message; a permission request it answered is no user's
        wait (``permission_wait_seconds``, outcome ``policy``)."""
        m = self._metrics
        for mark in marks:
            if type(mark) is AuditEntry:
                m.policy.record(mark)
                if mark.method == PERMISSION and not mark.forwarded and mark.session is not None:
                    m.turns.record(self._turns.answered_by_policy(mark.session, rid, now))

    def _feed_turns(self, direction: Direction, raw: bytes, now: float) -> None:
        """Decode a frame that matters to the turns (few do) and record what it ends."""
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        for message in value if isinstance(value, list) else [value]:
            if isinstance(message, dict):
                self._metrics.turns.record(self._turns.feed(direction, message, now))

    def on_generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        """Errors the proxy wrote for requests left in flight: those requests got no answer."""
        try:
            self._generated(direction, frames, now)
        except Exception:
            self._metrics.observer_errors += 1

    def _generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        m = self._metrics
        bump(m.generated, (str(direction),), len(frames))
        starts = self._starts[direction.reverse]
        for frame in frames:
            try:
                ident = orjson.loads(frame).get("id")
            except (orjson.JSONDecodeError, AttributeError):
                continue
            started = starts.pop(ident, None) if _hashable_id(ident) else None
            if started is not None:
                m.observe_duration(direction.reverse, started[1], NO_ANSWER, "", now - started[0])
                m.turns.record(self._turns.answered_by_proxy(direction.reverse, ident, now))

    def on_end(self, session: Any, now: float) -> None:
        try:
            self._ended(now)
        except Exception:
            self._metrics.observer_errors += 1

    def _ended(self, now: float) -> None:
        m = self._metrics
        for direction, starts in self._starts.items():
            for started, label in starts.values():
                m.observe_duration(direction, label, NO_ANSWER, "", now - started)
            starts.clear()
        m.turns.record(self._turns.end(now))
        m.ended(self._session)
        if m.ready_on_initialize:
            m.ready = False  # the agent is gone (stdio, --connect: the process ends next)
