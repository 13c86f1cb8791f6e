"""Prometheus metrics of the proxy (issue 12.1), from the pipeline's ``Observed`` notes.

Contract: owns the metric names, their labels and the bounds on label values, and the accounting
behind them: ``Metrics`` (process-wide counters and the live sessions) and ``SessionMetrics`` (a
``SessionObserver`` per session: joins each request with its response to time it). Pure: the
clock is the ``now`` the shell passes in, nothing here reads a socket or logs; ``collect`` hands
``prometheus_client`` metric families to the shell's HTTP responder at scrape time.

Why plain dicts and a collector instead of ``prometheus_client.Counter`` objects: the observer
runs on the session's task for every frame, and a client-library counter takes a lock per
increment; a dict increment does not, and all sessions share one event loop (one thread), so
nothing else touches the dicts while an observer runs. Gauges (pending requests, queue bytes,
sessions) are read from the live sessions at scrape time only: they cost nothing per frame.

Label values are bounded (Prometheus: "do not use labels to store dimensions with high
cardinality"): methods outside the ACP schema are ``other``; error codes outside the JSON-RPC
and ACP ones are ``other``; rule names come from the config file (a fixed set per process);
agent exit statuses are an exit code (0-255) or a signal name.
"""

from __future__ import annotations

import signal
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import orjson

from acp_proxy.jsontypes import JsonValue
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

PREFIX: Final = "acp_proxy"

# Every method the ACP schemas name (v1 and v2, stable and unstable: the ``x-method`` values of
# tests/schemas; a test keeps this list equal to them). Anything else is counted as ``other``.
ACP_METHODS: Final = frozenset(
    {
        "$/cancel_request",
        "auth/login",
        "auth/logout",
        "auth/status",
        "auth/status_update",
        "authenticate",
        "elicitation/complete",
        "elicitation/create",
        "fs/read_text_file",
        "fs/write_text_file",
        "initialize",
        "logout",
        "mcp/message",
        "providers/disable",
        "providers/list",
        "providers/set",
        "proxy/initialize",
        "proxy/successor",
        "session/archive",
        "session/cancel",
        "session/close",
        "session/delete",
        "session/fork",
        "session/list",
        "session/load",
        "session/new",
        "session/prompt",
        "session/request_permission",
        "session/resume",
        "session/set_config_option",
        "session/set_mode",
        "session/set_title",
        "session/status",
        "session/unarchive",
        "session/update",
        "terminal/cancel",
        "terminal/create",
        "terminal/kill",
        "terminal/output",
        "terminal/release",
        "terminal/wait_for_exit",
        "tool_call/cancel",
    }
)
OTHER: Final = "other"

# JSON-RPC 2.0's codes (-32700, -32600..-32603), its implementation-defined server range
# (-32000..-32099, where ACP puts auth_required -32000 and resource_not_found -32002) and ACP's
# request_cancelled (-32800). Any other code is ``other``.
_KNOWN_CODES: Final = frozenset(
    {-32700, -32600, -32601, -32602, -32603, -32800, *range(-32099, -31999)}
)

# Request durations: ACP requests go from milliseconds (initialize, fs/read_text_file) to many
# minutes (a session/prompt turn, a permission request waiting for a human).
DURATION_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)

RESULT: Final = "result"
ERROR: Final = "error"
NO_ANSWER: Final = "no_answer"

_C2A = Direction.CLIENT_TO_AGENT
_A2C = Direction.AGENT_TO_CLIENT
_DIRECTIONS: Final = (_C2A, _A2C)


def method_label(method: str | None) -> str:
    """The bounded label value of a method: itself when ACP defines it, else ``other``."""
    return method if method in ACP_METHODS else OTHER


def code_label(code: object) -> str:
    """The bounded label value of a JSON-RPC error code."""
    if type(code) is int and code in _KNOWN_CODES:
        return str(code)
    return OTHER


def exit_status_label(returncode: int) -> str:
    """``exit_N`` for an exit code, ``signal_NAME`` for a signal (``Popen.returncode`` -N)."""
    if returncode >= 0:
        return f"exit_{min(returncode, 255)}"
    try:
        return f"signal_{signal.Signals(-returncode).name}"
    except ValueError:
        return "signal_other"


def not_parsed_label(reason: str) -> str:
    """``NotParsed.reason`` is free text (it quotes the parser); its bounded kind."""
    if "parse budget" in reason:
        return "parse_budget"
    if "batch" in reason:
        return "batch"
    return "invalid_json"


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


@dataclass(slots=True)
class _Histogram:
    buckets: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        self.buckets[bisect_left(DURATION_BUCKETS, value)] += 1
        self.total += value
        self.count += 1


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
        self.versions = _counter()  # (version,): negotiated protocol versions
        self.durations: dict[tuple[str, str, str, str], _Histogram] = {}
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

    def observe_duration(
        self, direction: Direction, method: str, outcome: str, code: str, seconds: float
    ) -> None:
        key = (str(direction), method, outcome, code)
        hist = self.durations.get(key)
        if hist is None:
            hist = self.durations[key] = _Histogram()
        hist.observe(max(seconds, 0.0))

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
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        def counter(
            name: str, doc: str, labels: Sequence[str], values: dict[tuple[str, ...], int]
        ) -> Any:
            family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))
            for key, value in sorted(values.items()):
                family.add_metric(list(key), value)
            return family

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
            "protocol_versions_total",
            "Sessions by negotiated ACP protocol version.",
            ["version"],
            self.versions,
        )

        hist = HistogramMetricFamily(
            f"{PREFIX}_request_duration_seconds",
            "Time from a request crossing the proxy to its response crossing back, by the "
            "request's direction, method and outcome (result, error with error_code, "
            "no_answer: the peer went away or the session ended first).",
            labels=["direction", "method", "outcome", "error_code"],
        )
        for key, h in sorted(self.durations.items()):
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, n in zip((*DURATION_BUCKETS, float("inf")), h.buckets, strict=True):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            hist.add_metric(list(key), buckets, h.total)
        yield hist

        def gauge(name: str, doc: str, labels: Sequence[str], values: dict[Any, float]) -> Any:
            family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))
            for key, value in values.items():
                family.add_metric(list(key), value)
            return family

        yield gauge("sessions", "Sessions (connections) open now.", [], {(): len(live)})
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


def _bump(counter: dict[tuple[str, ...], int], key: tuple[str, ...], n: int = 1) -> None:
    counter[key] = counter.get(key, 0) + n


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

    __slots__ = ("_metrics", "_oversize_size", "_session", "_starts")

    def __init__(self, metrics: Metrics, session: SessionView) -> None:
        self._metrics = metrics
        self._session = session
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
                _bump(m.dropped, ("rule", note.dropped_by))
            elif kind is NonJson:
                assert isinstance(note, NonJson)
                if not note.forwarded:
                    _bump(m.diverted, (note.kind,))
            elif kind is OversizeFrame:
                assert isinstance(note, OversizeFrame)
                self._oversize_size = note.size
            elif kind is NotParsed:
                assert isinstance(note, NotParsed)
                _bump(m.not_parsed, (str(note.direction), not_parsed_label(note.reason)))
            elif kind is PendingFull:
                _bump(m.dropped, ("pending_full", ""))
            elif kind is MiddlewareFailed:
                assert isinstance(note, MiddlewareFailed)
                _bump(m.middleware_failures, (note.failure.middleware,))
                if note.failure.fail_closed:
                    _bump(m.dropped, ("fail_closed", note.failure.middleware))
            elif kind is VersionNegotiated:
                assert isinstance(note, VersionNegotiated)
                _bump(m.versions, (str(note.version),))

    def _observed(self, note: Observed, now: float) -> None:
        m = self._metrics
        direction = note.direction
        dkey = (str(direction),)
        _bump(m.frames, dkey)
        if note.kind == "oversize":
            _bump(m.frame_bytes, dkey, self._oversize_size)
            _bump(m.oversize, dkey)
            _bump(m.dropped, ("oversize", ""))
            return
        _bump(m.frame_bytes, dkey, len(note.raw))
        if not note.messages:
            return
        # A request dropped or answered by the proxy never reached the peer: not timed.
        forwarded = note.sent is None or bool(note.sent)
        codes: dict[Any, object] | None = None
        starts = self._starts[direction]
        for info in note.messages:
            if info.changed_by:
                for rule in info.changed_by:
                    _bump(m.rewritten, (rule,))
            if info.method is not None:
                label = method_label(info.method)
                if _hashable_id(info.id):
                    _bump(m.messages, (dkey[0], "request", label))
                    if forwarded:
                        if len(starts) < m.max_pending:
                            starts[info.id] = (now, label)
                        else:
                            _bump(m.untracked, dkey)
                else:
                    _bump(m.messages, (dkey[0], "notification", label))
                continue
            # A response: it answers a request that went the other way.
            _bump(m.messages, (dkey[0], "response", method_label(info.answers)))
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

    def on_generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        """Errors the proxy wrote for requests left in flight: those requests got no answer."""
        try:
            self._generated(direction, frames, now)
        except Exception:
            self._metrics.observer_errors += 1

    def _generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        m = self._metrics
        _bump(m.generated, (str(direction),), len(frames))
        starts = self._starts[direction.reverse]
        for frame in frames:
            try:
                ident = orjson.loads(frame).get("id")
            except (orjson.JSONDecodeError, AttributeError):
                continue
            started = starts.pop(ident, None) if _hashable_id(ident) else None
            if started is not None:
                m.observe_duration(direction.reverse, started[1], NO_ANSWER, "", now - started[0])

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
        m.ended(self._session)
        if m.ready_on_initialize:
            m.ready = False  # the agent is gone (stdio, --connect: the process ends next)
