"""The protocol object of one connection: frames in, frames to forward / reply / log out.

Contract: ``Connection`` owns one client-agent connection and decides what happens to each frame
between the framing and the outbound queues. It makes the connection's state (``state.ConnState``:
the negotiated version, whether the chain runs, the flags and contexts) and its request tables
(``tables.Requests``), and hands both to its engines, which never see the connection itself: the
line path (``lines``: diversion, the parse budget, tracking, then ``batches`` or the rewrite
engine ``rewrite``), the block path (``blocks``, over the line path) and oversize frames
(``oversize``). Whether a frame passes as it came, unparsed, is one test (``prefilter.
passes_unparsed``) that every path asks. The round trip's step (``handle_line``) stays here. It
is pure (style.md habit 1): no I/O, no
clock, no logging; everything the shell must do is in the returned ``Result`` (frames and
``Note`` values), mitmproxy-style commands out of a sans-IO core.

Rules:

1. Byte-exact pass-through. A frame that no middleware changed leaves as the exact bytes that came
   in (``OutFrame.raw is Line.raw``); a changed message is re-encoded once, and only its changed
   members are encoded (``rewrite``; orjson turns integers above 2**64 into floats, so
   re-encoding untouched bytes would corrupt them; style.md habit 4).
2. Parse only what is needed (``prefilter``). From the agent, a line whose first non-whitespace
   byte is not ``{`` or ``[`` is certainly not a message and is diverted (``divert``); a line
   that starts like JSON but is invalid, and that nothing parses, is forwarded (the client's
   parser reports it), exactly as a transparent relay would. Malformed client frames are
   forwarded as they are (the agent answers them with -32700, ACP digest §1.2).
3. Version. Before the ``initialize`` response fixes ``protocolVersion`` (ACP digest §2.3: "the
   negotiated version is ``result.protocolVersion`` in the ``initialize`` response") the chain is
   not run and frames pass untouched, pipelined ones included.
4. Batches: see ``batches`` (one array in, one array out, only changed entries re-encoded).
5. Tracking. Client requests awaiting the agent's response, and agent requests awaiting the
   client's, are kept by ``tracking.RequestTracker`` (bounded; a request past the bound is
   answered with an error instead of forwarded); a response removes its id.
   ``abort_pending`` answers the client's open requests when the agent dies, lazily, echoing each
   id's bytes. A frame over the parse budget is forwarded unparsed, its request tracked from
   what its head says.
6. The round trip (``handle_line`` / ``_tracked``) is the hottest path: a request or response no
   middleware may act on is parsed once and tracked in one step, with no call it can avoid.
7. Observing: ``observe`` parses every frame and describes each (``Observed``); ``watch`` (the
   live view; ``observe`` wins) keeps the fast paths and reports what they forwarded as it came
   as ``Passed`` runs, every other frame as ``Observed`` (``observe.watched``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import orjson

from acp_proxy.base.jsontypes import OMITTED, JsonObject
from acp_proxy.wire.chain import Chain, Direction
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.blocks import Blocks
from acp_proxy.wire.connection.connstate import ConnState
from acp_proxy.wire.connection.divert import KIND_ANSI, KIND_TEXT, SAMPLE_BYTES
from acp_proxy.wire.connection.lines import Lines
from acp_proxy.wire.connection.rewrite import Rewriter
from acp_proxy.wire.connection.tables import Requests
from acp_proxy.wire.connection.unparsed import ParseBudget
from acp_proxy.wire.core_settings import (
    DEFAULT_MAX_PARSE_BYTES,
    DEFAULT_MAX_PENDING_REQUESTS,
    NonJsonPolicy,
)
from acp_proxy.wire.framing import Block, Line, Oversize
from acp_proxy.wire.notes import (
    AS_CAME,
    EMPTY,
    Dropped,
    FrameInfo,
    MiddlewareFailed,
    NonJson,
    Note,
    NotParsed,
    Observed,
    OversizeFrame,
    PendingFull,
    PipelineStats,
    Result,
    Rewritten,
    SkippedV1,
    UnusualVersion,
    VersionNegotiated,
)
from acp_proxy.wire.raw import rawscan
from acp_proxy.wire.raw.block_scan import contains
from acp_proxy.wire.raw.prefilter import ID_KEY, parse_cost

# Bounded memory (docs/bounds.md): the parse budget and the pending-request tables
# (``DEFAULT_MAX_PARSE_BYTES``, ``DEFAULT_MAX_PENDING`` from config) and the bytes of their ids.
DEFAULT_MAX_PENDING = DEFAULT_MAX_PENDING_REQUESTS

_A2C = Direction.AGENT_TO_CLIENT
_C2A = Direction.CLIENT_TO_AGENT
_OBJECT_OPENER = ord("{")


class Connection:
    """Protocol state of one client-agent connection; ``handle`` one event at a time.

    Not thread-safe: one task (or one lock) calls it for both directions, in the order read.
    """

    __slots__ = (
        "_blocks",
        "_general",
        "_lines",
        "_max_parse",
        "_state",
        "_stats",
        "_tracker",
        "_watched",
        "chain",
        "stats",
    )

    def __init__(
        self,
        chain: Chain,
        *,
        non_json: NonJsonPolicy = NonJsonPolicy.LOG,
        inspect_all: bool = False,
        max_parse_bytes: int = DEFAULT_MAX_PARSE_BYTES,
        max_pending: int = DEFAULT_MAX_PENDING,
        observe: bool = False,
        watch: bool = False,
    ) -> None:
        self.chain = chain
        # Observing needs every frame on its own and parsed: it implies ``inspect_all``.
        state = ConnState(
            chain,
            inspect_all=inspect_all or observe,
            observe=observe or watch,
            watching=watch and not observe,
            max_parse=max_parse_bytes,
        )
        self._state = state
        self.stats = self._stats = state.stats
        # The request tables, and the engines, each given the state and the tables (never this
        # object: ``state`` says what they see).
        requests = Requests(state, max_pending)
        budget = ParseBudget(state, requests, max_parse_bytes)
        rewriter = Rewriter(state, requests)
        self._lines = Lines(state, requests, rewriter, budget, non_json)
        self._blocks = Blocks(state, self._lines, rewriter)
        # What the round trip (``_tracked``) reads, as this object's own attributes (hot path).
        self._max_parse = max_parse_bytes
        self._general = state.general
        self._tracker = requests.tracker
        self._watched = requests.watched

    # --- public API ---------------------------------------------------------------------------

    @property
    def version(self) -> int | None:
        """The negotiated protocol version; ``None`` until the ``initialize`` response."""
        return self._state.version

    @property
    def pending_client_requests(self) -> int:
        """Client requests forwarded to the agent and not answered yet."""
        return self._tracker.waiting(_C2A)

    @property
    def pending_agent_requests(self) -> int:
        """Agent requests forwarded to the client and not answered yet."""
        return self._tracker.waiting(_A2C)

    def handle(self, direction: Direction, event: Line | Oversize) -> Result:
        """Process one event read from the side ``direction`` starts at."""
        return self._lines.event(direction, event)

    def handle_line(self, direction: Direction, raw: bytes) -> Result:
        """``handle_many(direction, [Line(raw)])`` for one non-empty line, without the event
        loop around it (the round trip: ``LineSplitter.single_line`` gives such lines).

        A request or response no middleware may act on comes back as ``AS_CAME``: tracked, and
        to be forwarded exactly as it came (what ``Result((OutFrame(raw, None, version),))``
        says, which the shell writes without building it). Anything else comes back as the
        general path's ``Result``. The middleware's interest is looked for once."""
        state = self._state
        if state.inspect_all or state.watching:
            return self._blocks.many(direction, [Line(raw)], False)
        interested = state.interested(raw) if state.needles_on else None
        if interested is None and contains(raw, ID_KEY) and self._tracked(direction, raw):
            return AS_CAME
        if direction is _A2C:
            return self._lines.agent(raw, interested)
        return self._lines.client(raw, interested)

    def _tracked(self, direction: Direction, raw: bytes) -> bool:
        """The round trip's frames in one step: a request or a response that no middleware may
        act on (``interested is None``) and that the request tables must see (``"id"`` occurs),
        tracked and forwarded as it came. ``False``: anything else, for the line path
        (``lines.Lines``), which gives the same result for every frame this one answers (its
        dozen small calls were a large part of the proxy's CPU per request:
        docs/performance.md, "Figures behind the code"; ``test_roundtrip_lane.py`` compares the
        two on generated frames).

        Answered here only: a frame that starts like one (``{"``, ``{ ``...), within the parse
        budget even by the cheap estimate, that orjson parses to an object. A request (a valid
        ``id``, a string ``method``) is admitted to its table, or left to the line path's
        refusal when the table is full, or left to it when a link is handed it by its method or
        its response is watched (``LinkInterest.general``: ``initialize``, ``session/new`` with
        a policy); a response (a valid ``id``, ``result`` or ``error``) takes its request out
        of the table, except a watched one's (the version negotiation, a link told of it: the
        line path); any other object is forwarded untracked, as the line path does. Not
        inspecting (``ConnState.inspect_all``), as the caller checks.
        """
        # ``{`` first: an object with nothing before its opener (what ``FRAME_STARTS`` admits
        # of objects, once orjson parsed it), so what parses is a ``dict``.
        if raw[0] != _OBJECT_OPENER or len(raw) * 33 > self._max_parse:
            return False
        try:
            message: JsonObject = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return False
        rid = message.get("id", OMITTED)
        if type(rid) is int or type(rid) is str or type(rid) is float or rid is None:  # ``is_id``
            method = message.get("method", OMITTED)
            if method is not OMITTED:
                if type(method) is not str or method in self._general:
                    return False  # the line path routes it or keeps its id for its response
                # A JSON integer has one spelling, ``-?(0|[1-9][0-9]*)`` (RFC 8259 section 6),
                # and orjson returns an ``int`` only for one, so a non-zero ``int`` id's bytes
                # are its decimal form; ``0`` may have been ``-0``, and every other id is read
                # from ``raw``.
                id_bytes = b"%d" % rid if type(rid) is int and rid else rawscan.id_bytes(raw)
                if id_bytes is None or not self._tracker.admit(direction, rid, method, id_bytes):
                    return False  # the line path refuses it (table full) or says why
            elif "result" in message or "error" in message:
                if direction is _A2C:
                    if rid in self._watched:
                        return False  # the version negotiation, or a link is told of it
                    self._tracker.answer(_C2A, rid)
                else:
                    self._tracker.answer(_A2C, rid)
        # (else: no id, an ``"id"`` deeper down, or not a valid one: forwarded untracked)
        stats = self._stats
        if direction is _A2C:
            stats.agent_to_client_in += 1
            stats.agent_to_client_out += 1
        else:
            stats.client_to_agent_in += 1
            stats.client_to_agent_out += 1
        return True

    def handle_many(
        self,
        direction: Direction,
        events: Iterable[Line | Oversize | Block],
        *,
        join: bool = False,
    ) -> Result:
        """``handle`` each event in order and concatenate the results: one call per read,
        cheaper than one ``handle`` per event (``acp_proxy.wire.connection.blocks``). With
        ``join=True``, each run of untouched frames becomes ONE ``OutFrame`` (the frames joined
        with ``b"\\n"``); stats still count every frame."""
        return self._blocks.many(direction, events, join)

    def abort_pending(
        self, message: str, data: bytes | None = None, detail: str | None = None
    ) -> Iterator[tuple[OutFrame, ...]]:
        """One -32603 error response (``message`` " during " the request's method [": " detail],
        ``data`` as its ``error.data``) per client request still awaiting the agent.

        For when the agent is gone: every client request still awaiting a response gets a
        JSON-RPC error response (code -32603, ``message`` naming the exit status, e.g. "agent
        exited with status 1 during initialize"). The requests are no longer tracked from the
        call on; their responses are built lazily, in chunks of ``ABORT_CHUNK`` in arrival
        order, as the caller iterates (bounded memory), so the shell writes each before the next.
        """
        return self._abort(_C2A, message, data, detail=detail)

    def abort_agent_requests(self, message: str) -> Iterator[tuple[OutFrame, ...]]:
        """One -32603 error response per agent request still awaiting the client (client gone),
        lazily in chunks like ``abort_pending``."""
        return self._abort(_A2C, message, name_method=False)

    def _abort(
        self,
        direction: Direction,
        message: str,
        data: bytes | None = None,
        *,
        name_method: bool = True,
        detail: str | None = None,
    ) -> Iterator[tuple[OutFrame, ...]]:
        chunks = self._tracker.abort(  # detached now, built lazily
            direction, message, data, name_method=name_method, detail=detail
        )
        return _frames(chunks, self._state.version, self._stats)


def _frames(
    chunks: Iterator[tuple[tuple[bytes, ...], int]], version: int | None, stats: PipelineStats
) -> Iterator[tuple[OutFrame, ...]]:
    """The error frames of ``chunks`` (``RequestTracker.abort``), counted as they are built."""
    for chunk, n in chunks:
        stats.errors_replied += n
        # Only the bytes (no decoded message): an error response is a barrier for the outbound
        # queue, which never needs to parse it.
        yield tuple(OutFrame(data, None, version) for data in chunk)


# The notes live in ``acp_proxy.wire.notes``; importing them from here keeps working.
__all__ = [
    "AS_CAME",
    "DEFAULT_MAX_PENDING",
    "EMPTY",
    "KIND_ANSI",
    "KIND_TEXT",
    "SAMPLE_BYTES",
    "Connection",
    "Dropped",
    "FrameInfo",
    "MiddlewareFailed",
    "NonJson",
    "NotParsed",
    "Note",
    "Observed",
    "OversizeFrame",
    "PendingFull",
    "PipelineStats",
    "Result",
    "Rewritten",
    "SkippedV1",
    "UnusualVersion",
    "VersionNegotiated",
    "parse_cost",
]
