"""The protocol object of one connection: frames in, frames to forward / reply / log out.

Contract: ``Connection`` owns the state of one client-agent connection and decides what happens
to each frame between the framing and the outbound queues: version negotiation, routing (which
path a frame takes), and JSON-RPC request tracking. It calls, in their own modules, the rewrite
engine (``rewrite``: the chain, the fused v2 path, lossless encoding), ``batches``, the block
path (``blocks``), non-JSON diversion (``divert``) and oversize frames (``oversize``); the byte
tests that decide what is parsed are in ``prefilter``. It is pure (style.md habit 1): no I/O, no
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

from acp_proxy.base.jsontypes import OMITTED, JsonObject, JsonValue
from acp_proxy.wire.chain import Chain, Direction, MessageContext
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.batches import Batches
from acp_proxy.wire.connection.blocks import Blocks
from acp_proxy.wire.connection.divert import (
    FRAME_STARTS,
    KIND_ANSI,
    KIND_TEXT,
    SAMPLE_BYTES,
    Diversion,
)
from acp_proxy.wire.connection.host import UNSET, NotParsedWhy, Unset
from acp_proxy.wire.connection.negotiate import negotiated_version
from acp_proxy.wire.connection.observe import frame_info, method_of, observed, watched
from acp_proxy.wire.connection.oversize import oversize
from acp_proxy.wire.connection.rewrite import Rewriter, encode
from acp_proxy.wire.connection.tracking import RequestTracker, is_id
from acp_proxy.wire.connection.unparsed import ParseBudget
from acp_proxy.wire.core_settings import (
    DEFAULT_MAX_PARSE_BYTES,
    DEFAULT_MAX_PENDING_REQUESTS,
    NonJsonPolicy,
)
from acp_proxy.wire.errors import INTERNAL_ERROR, error_bytes
from acp_proxy.wire.framing import Block, Line, Oversize
from acp_proxy.wire.interest import LinkInterest
from acp_proxy.wire.notes import (
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
from acp_proxy.wire.raw import rawjson, rawscan
from acp_proxy.wire.raw.block_scan import contains
from acp_proxy.wire.raw.prefilter import (
    ID_KEY,
    agent_needs_parse,
    client_needs_parse,
    parse_cost,
)

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
        "_answers",
        "_batches",
        "_bctx_a2c",
        "_bctx_c2a",
        "_blocks",
        "_budget",
        "_chain_on",
        "_ctx_a2c",
        "_ctx_c2a",
        "_diversion",
        "_fused",
        "_fused_interest",
        "_general",
        "_has_links",
        "_inspect_all",
        "_interested",
        "_lane_blockers",
        "_link_interest",
        "_link_needles",
        "_max_parse",
        "_needles_on",
        "_observe",
        "_rewriter",
        "_route",
        "_routed",
        "_tracker",
        "_watch",
        "_watched",
        "_watching",
        "chain",
        "stats",
        "version",
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
        self._observe = observe or watch
        self._watching = watch and not observe
        inspect_all = inspect_all or observe
        self._answers: dict[JsonValue, str] = {}  # responses of the current frame: id -> method
        self._max_parse = max_parse_bytes
        self.version: int | None = None
        self.stats = PipelineStats()
        self._inspect_all = inspect_all
        self._has_links = len(chain) > 0
        self._chain_on = False  # links exist and the version is known: run the chain
        # Which links may act on a frame (``wire.interest``), as this object's own attributes.
        interest = LinkInterest(chain)
        self._link_interest = interest
        self._interested = interest.of
        self._route = interest.route
        self._link_needles = interest.link_needles
        self._routed = interest.routed
        self._general = interest.general
        self._watch = interest.watch
        self._fused = None if self._watching else interest.fused  # (it names no rule it ran)
        self._fused_interest = interest.fused_interest
        self._lane_blockers = interest.lane_blockers
        # Requests awaiting an answer, both ways, bounded (``tracking``); and the watched client
        # requests (``LinkInterest.watch``) waiting, each with its method.
        self._tracker = RequestTracker(max_pending)
        self._watched: dict[JsonValue, str] = {}
        self._set_contexts()
        # The engines this object calls (``acp_proxy.wire.connection.host`` is what they see of it).
        self._budget = ParseBudget(self, max_parse_bytes)
        self._rewriter = Rewriter(self, self._fused)
        self._batches = Batches(self, self._rewriter, self._budget)
        self._diversion = Diversion(self, self._budget, non_json)
        self._blocks = Blocks(
            self, self._rewriter, self._link_needles, interest.escapes, max_parse_bytes
        )

    # --- public API ---------------------------------------------------------------------------

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
        if self._observe:
            return self._observed(direction, event)
        if type(event) is Line:
            if direction is _A2C:
                return self._agent_line(event.raw, UNSET)
            return self._client_line(event.raw, UNSET)
        assert isinstance(event, Oversize)
        return oversize(self, direction, event)

    def _observed(self, direction: Direction, event: Line | Oversize) -> Result:
        """``handle`` plus an ``Observed`` note describing the frame and its fate."""
        self._answers.clear()
        if type(event) is Line:
            raw = event.raw
            if direction is _A2C:
                res = self._agent_line(raw, UNSET)
            else:
                res = self._client_line(raw, UNSET)
        else:
            assert isinstance(event, Oversize)
            raw = event.head
            res = oversize(self, direction, event)
        return (watched if self._watching else observed)(direction, event, raw, res)

    def handle_line(self, direction: Direction, raw: bytes) -> JsonObject | Result:
        """``handle_many(direction, [Line(raw)])`` for one non-empty line, without the event
        loop around it (the round trip: ``LineSplitter.single_line`` gives such lines).

        A request or response no middleware may act on comes back as its parsed message alone:
        tracked, and to be forwarded exactly as it came (``Result((OutFrame(raw, message,
        version),))``, which the shell writes without building it). Anything else comes back
        as the general path's ``Result``. The middleware's interest is looked for once."""
        if self._inspect_all or self._watching:
            return self.handle_many(direction, [Line(raw)])
        interested = self._interested(raw) if self._needles_on else None
        if interested is None and contains(raw, ID_KEY):
            message = self._tracked(direction, raw)
            if message is not None:
                return message
        if direction is _A2C:
            return self._agent_line(raw, interested)
        return self._client_line(raw, interested)

    def _tracked(self, direction: Direction, raw: bytes) -> JsonObject | None:
        """The round trip's frames in one step: a request or a response that no middleware may
        act on (``interested is None``) and that the request tables must see (``"id"`` occurs):
        the parsed message, forwarded as it came. ``None``: anything else, for the general path
        (``_client_line`` / ``_agent_line``), which gives the same result for every frame this
        one answers (its dozen small calls were a large part of the proxy's CPU per request:
        docs/performance.md, "Figures behind the code"; ``test_roundtrip_lane.py`` compares the
        two on generated frames).

        Answered here only: a frame that starts like one (``{"``, ``{ ``...), within the parse
        budget even by the cheap estimate, that orjson parses to an object. A request (a valid
        ``id``, a string ``method``) is admitted to its table, or left to the general path's
        refusal when the table is full, or left to it when a link is handed it by its method or
        its response is watched (``LinkInterest.general``: ``initialize``, ``session/new`` with
        a policy); a response (a valid ``id``, ``result`` or ``error``) takes its request out
        of the table, except a watched one's (the version negotiation, a link told of it: the
        general path); any other object is forwarded untracked, as the general path does. Not
        inspecting (``_inspect_all``), as the caller checks.
        """
        # ``{`` first: an object with nothing before its opener (what ``FRAME_STARTS`` admits
        # of objects, once orjson parsed it), so what parses is a ``dict``.
        if raw[0] != _OBJECT_OPENER or len(raw) * 33 > self._max_parse:
            return None
        try:
            message: JsonObject = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        rid = message.get("id", OMITTED)
        if type(rid) is int or type(rid) is str or type(rid) is float or rid is None:  # ``is_id``
            method = message.get("method", OMITTED)
            if method is not OMITTED:
                if type(method) is not str or method in self._general:
                    return None  # the general path routes it or keeps its id for its response
                # A JSON integer has one spelling, ``-?(0|[1-9][0-9]*)`` (RFC 8259 section 6),
                # and orjson returns an ``int`` only for one, so a non-zero ``int`` id's bytes
                # are its decimal form; ``0`` may have been ``-0``, and every other id is read
                # from ``raw``.
                id_bytes = b"%d" % rid if type(rid) is int and rid else rawscan.id_bytes(raw)
                if id_bytes is None or not self._tracker.admit(direction, rid, method, id_bytes):
                    return None  # the general path refuses it (table full) or says why
            elif "result" in message or "error" in message:
                if direction is _A2C:
                    if rid in self._watched:
                        return None  # the version negotiation, or a link is told of it
                    self._tracker.answer(_C2A, rid)
                else:
                    self._tracker.answer(_A2C, rid)
        # (else: no id, an ``"id"`` deeper down, or not a valid one: forwarded untracked)
        self._count_passed(direction, 1)
        return message

    def handle_many(
        self,
        direction: Direction,
        events: Iterable[Line | Oversize | Block],
        *,
        join: bool = False,
    ) -> Result:
        """``handle`` each event in order and concatenate the results: one call per read,
        cheaper than one ``handle`` per event (``acp_proxy.wire.connection.blocks``). With
        ``join=True``,
        each run of untouched frames becomes ONE ``OutFrame`` (the frames joined with
        ``b"\\n"``); stats still count every frame."""
        return self._blocks.many(direction, events, join)

    def _count_passed(self, direction: Direction, n: int) -> None:
        """``n`` frames read and forwarded untouched."""
        if direction is _A2C:
            self.stats.agent_to_client_in += n
            self.stats.agent_to_client_out += n
        else:
            self.stats.client_to_agent_in += n
            self.stats.client_to_agent_out += n

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
        return _frames(chunks, self.version, self.stats)

    # --- agent -> client ----------------------------------------------------------------------

    def _agent_line(
        self, raw: bytes, interested: tuple[bool, ...] | Unset | None = UNSET
    ) -> Result:
        self.stats.agent_to_client_in += 1
        if not raw:
            return EMPTY
        if raw[:2] not in FRAME_STARTS and not rawjson.could_be_frame(raw):
            return self._diversion.odd_line(raw)
        if isinstance(interested, Unset):
            interested = self._interested(raw) if self._needles_on else None
        if interested is None and not self._inspect_all and not agent_needs_parse(raw):
            # Nothing may act on this frame and the tracker does not need it: forward its bytes
            # unparsed.
            self.stats.agent_to_client_out += 1
            return Result((OutFrame(raw, None, self.version),))
        parsed = self._budget.parse(raw)
        if type(parsed) is NotParsedWhy:
            return self._budget.forward(_A2C, raw, parsed)
        return self._parsed(_A2C, raw, parsed, interested, ())

    def _client_line(
        self, raw: bytes, interested: tuple[bool, ...] | Unset | None = UNSET
    ) -> Result:
        self.stats.client_to_agent_in += 1
        if isinstance(interested, Unset):
            interested = self._interested(raw) if self._needles_on else None
        if interested is None and not self._inspect_all and not client_needs_parse(raw):
            self.stats.client_to_agent_out += 1
            return Result((OutFrame(raw, None, self.version),))
        parsed = self._budget.parse(raw)
        if type(parsed) is NotParsedWhy:
            # Malformed or unreadable: forwarded as is, the agent answers it (-32700).
            return self._budget.forward(_C2A, raw, parsed)
        return self._parsed(_C2A, raw, parsed, interested, ())

    # --- shared -------------------------------------------------------------------------------

    def _count_out(self, direction: Direction, n: int) -> None:
        if direction is _A2C:
            self.stats.agent_to_client_out += n
        else:
            self.stats.client_to_agent_out += n

    def _parsed(
        self,
        direction: Direction,
        raw: bytes,
        parsed: object,
        interested: tuple[bool, ...] | None,
        notes: tuple[Note, ...],
    ) -> Result:
        """A frame that was parsed."""
        if isinstance(parsed, dict):
            return self._single(direction, raw, parsed, interested, notes)
        if isinstance(parsed, list) and parsed:
            return self._batches.handle(direction, raw, parsed, interested, notes)
        # A scalar, or an empty array: forwarded, the peer answers it (JSON-RPC -32600).
        self._count_out(direction, 1)
        return Result((OutFrame(raw, None, self.version),), (), notes)

    def _single(
        self,
        direction: Direction,
        raw: bytes,
        message: JsonObject,
        interested: tuple[bool, ...] | None,
        notes: tuple[Note, ...],
    ) -> Result:
        version = self.version
        if "id" in message and "method" in message:
            refused = self._refuse_if_full(direction, raw, message)
            if refused is not None:
                return Result((), (refused,), (*notes, self._full_note(direction, message)))
            if self._routed and self._chain_on:
                interested = self._route(direction, message, interested)
        if interested is None:  # parsed only for tracking / inspection
            if "id" in message or self._inspect_all:
                acc_notes = list(notes)
                self._track(direction, message, acc_notes, raw)
                if self._inspect_all:
                    acc_notes.append(frame_info(direction, message, len(raw), (), self._answers))
                notes = tuple(acc_notes)
            self._count_out(direction, 1)
            return Result((OutFrame(raw, message, version),), (), notes)
        return self._rewriter.single(direction, raw, message, interested, notes)

    # --- tracking -----------------------------------------------------------------------------

    def _track(
        self, direction: Direction, message: JsonObject, notes: list[Note], raw: bytes | None
    ) -> None:
        """Update the request tables for a message that is being forwarded.

        ``raw``: the message's own bytes when ``message`` is their parse (unchanged), so an
        error answered for it later echoes its id's bytes exactly.
        """
        if "id" not in message:
            return  # a notification
        rid = message["id"]
        if not is_id(rid):
            return  # invalid request id: the receiver answers it; nothing to track
        if "method" in message:
            method = message["method"]
            if not isinstance(method, str):
                return
            id_bytes = None
            if raw is not None:
                try:
                    id_bytes = rawscan.id_bytes(raw)
                except rawjson.Unparseable:  # pragma: no cover - ``raw`` parsed as ``message``
                    id_bytes = None
            if id_bytes is None:
                id_bytes = encode(rid) or b"null"
            self._admit(direction, rid, method, id_bytes)
            if direction is _C2A and method in self._watch:
                self._watched[rid] = method
                if len(self._watched) > self._tracker.max_pending:
                    del self._watched[next(iter(self._watched))]
                if method == "initialize":
                    self.chain.initialize_requested(message)
            return
        if "result" not in message and "error" not in message:
            return  # not a response either
        self._answered(direction, rid)
        if direction is _A2C and rid in self._watched:
            watched = self._watched.pop(rid)
            if watched == "initialize":
                self._negotiate(message, notes)
                self.chain.initialized(message)
            else:
                self.chain.answered(watched, message)

    def _admit(
        self, direction: Direction, rid: JsonValue, method: str, id_bytes: bytes
    ) -> OutFrame | None:
        """Track a request being forwarded; when its table is full, an error reply instead."""
        if self._tracker.admit(direction, rid, method, id_bytes):
            return None
        return self._full_reply(id_bytes)

    def _answered(self, direction: Direction, rid: JsonValue) -> tuple[str, bytes] | None:
        """A response travelling ``direction`` answers the request with id ``rid``."""
        entry = self._tracker.answer(direction.reverse, rid)
        if entry is not None and self._inspect_all:
            self._answers[rid] = entry[0]
        return entry

    def _full_reply(self, id_bytes: bytes) -> OutFrame:
        self.stats.pending_refused += 1
        self.stats.replies += 1
        self.stats.errors_replied += 1
        data = error_bytes(
            id_bytes,
            INTERNAL_ERROR,
            f"acp-proxy: too many requests awaiting an answer (limit {self._tracker.max_pending}); "
            "not forwarded",
        )
        return OutFrame(data, None, self.version)

    def _full_note(self, direction: Direction, message: JsonObject | str) -> PendingFull:
        method = message if isinstance(message, str) else method_of(message) or "?"
        return PendingFull(direction, method, self._tracker.max_pending)

    def _refuse_if_full(
        self, direction: Direction, raw: bytes, message: JsonObject
    ) -> OutFrame | None:
        """An error reply for the request ``message`` if its table has no room, else ``None``."""
        if not self._tracker.full(direction):
            return None
        rid = message["id"]
        if not is_id(rid):  # a repeated id needs room too: it waits beside the first
            return None
        try:
            id_bytes = rawscan.id_bytes(raw) or b"null"
        except rawjson.Unparseable:  # pragma: no cover - ``raw`` parsed as ``message``
            id_bytes = encode(rid) or b"null"
        return self._full_reply(id_bytes)

    def _negotiate(self, response: JsonObject, notes: list[Note]) -> None:
        version = negotiated_version(response, notes, self.version)
        if version is not None and version != self.version:
            self.version = version
            self._set_contexts()
            notes.append(VersionNegotiated(version))

    def _set_contexts(self) -> None:
        self._chain_on = self._has_links and self.version is not None
        self._needles_on = self._link_interest.on = (
            self._chain_on and self._link_interest.any_needles
        )
        self._ctx_a2c = MessageContext(_A2C, self.version, False, self._observe)
        self._ctx_c2a = MessageContext(_C2A, self.version, False, self._observe)
        self._bctx_a2c = MessageContext(_A2C, self.version, True, self._observe)
        self._bctx_c2a = MessageContext(_C2A, self.version, True, self._observe)


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
