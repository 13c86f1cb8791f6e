"""The per-connection pipeline: frames in, frames to forward / reply / log out.

Contract: this module owns what happens to one frame between the framing and the outbound queues:
the byte prefilter, the middleware chain, batches, JSON-RPC request tracking, version negotiation,
non-JSON agent output and oversize frames. It is pure (style.md habit 1): no I/O, no clock, no
logging; everything the shell must do is in the returned ``Result`` (frames and ``Note`` values),
mitmproxy-style commands out of a sans-IO core.

Rules (issue 3, "Streaming behaviour"):

1. Byte-exact pass-through. A frame that no middleware changed leaves as the exact bytes that came
   in (``OutFrame.raw is Line.raw``); only changed messages are re-encoded, once, with orjson
   (orjson turns integers above 2**64 into floats, so re-encoding untouched frames would corrupt
   them; style.md habit 4).
2. Parse only what is needed. A frame is parsed when a middleware may act on it
   (the chain's needle prefilter, which also passes every frame with a JSON escape), when the
   tracker needs it (see ``_agent_needs_parse`` / ``_client_needs_parse``), or with
   ``inspect_all``. Everything else is forwarded unparsed. Trade-off: an unparsed frame is not
   validated. From the agent, a line whose first non-whitespace byte is not ``{`` or ``[`` is
   certainly not a message and is diverted; a line that starts like JSON but is invalid, and that
   nothing parses, is forwarded (the client's parser reports it), exactly as a transparent relay
   would.
3. Version. Before the ``initialize`` response fixes ``protocolVersion`` (ACP digest §2.3: "the
   negotiated version is ``result.protocolVersion`` in the ``initialize`` response") the chain is
   not run and frames pass untouched, pipelined ones included.
4. Batches (ACP digest §1.2). Each entry of an array frame passes the chain with
   ``in_batch=True``; the array leaves as one array, entries in their order (a ``Replace``'s first
   message takes the entry's place, its others follow as separate frames right after the array; a
   dropped entry is removed; an array whose entries are all dropped is not sent). No batch is ever
   created: replies go back as one array only when the sender sent an array (JSON-RPC batch reply
   semantics), otherwise one frame each. An array whose entries are unchanged leaves as its
   original bytes; a changed array is re-encoded whole (its unchanged entries included).
5. Tracking. Client requests awaiting the agent's response, and agent requests awaiting the
   client's, are kept by ``acp_proxy.wire.tracking.RequestTracker`` (bounded; a request past the
   bound is answered with an error instead of forwarded); a response removes its id.
   ``abort_pending`` answers the client's open requests when the agent dies (issue 3, "The agent
   process"), lazily, echoing each id's bytes. The notes this module returns are the values of
   ``acp_proxy.wire.notes``.
6. Non-JSON agent output (issue 3): diverted to the log (``NonJson`` note, ``first_of_kind`` so the
   shell warns once per kind and then counts) or forwarded as is, per ``NonJsonPolicy``. A line
   that is an ANSI escape sequence followed by a JSON message is split: the escape prefix is
   diverted and the message goes on. Malformed client frames are forwarded as they are (the agent
   answers them with -32700, ACP digest §1.2).
7. Oversize frames: an ``OversizeFrame`` note; a request whose id can be read from the head is
   answered with a -32600 error to its sender; a response whose id answers a tracked request is
   replaced by a -32603 error toward its receiver, so no request hangs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from acp_proxy.config import DEFAULT_MAX_PARSE_BYTES, DEFAULT_MAX_PENDING_REQUESTS, NonJsonPolicy
from acp_proxy.jsontypes import OMITTED, JsonObject, JsonValue
from acp_proxy.values import value
from acp_proxy.wire import rawjson
from acp_proxy.wire import scan as block_scan
from acp_proxy.wire.chain import (
    INTERNAL_ERROR,
    Chain,
    Direction,
    MessageContext,
    MiddlewareFailure,
    Outcome,
    error_response,
    needle_escapes,
)
from acp_proxy.wire.coalesce import OutFrame
from acp_proxy.wire.framing import (
    HEAD_BYTES,
    Block,
    Line,
    Oversize,
    read_request_id,
    read_response_id,
    scan_head,
)
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
from acp_proxy.wire.tracking import (
    RequestTracker,
    error_frame_bytes,
)

INVALID_REQUEST = -32600
_UPDATE_PATH = ("params", "update")
_PARAMS_PATH = ("params",)
# With the C accelerator the fused path splices (``rawjson.splice_member`` locates the member
# in C); without it, it encodes canonical frames whole (see ``_fused_bytes``).
_SPLICE_IN_C = getattr(block_scan.ACCELERATOR, "member_span", None)

# Issue 10, "bounded memory" (README "Bounds"): the parse budget and the pending-request tables
# (``DEFAULT_MAX_PARSE_BYTES``, ``DEFAULT_MAX_PENDING`` from config) and the bytes of their ids.
DEFAULT_MAX_PENDING = DEFAULT_MAX_PENDING_REQUESTS
# What one parsed container or element costs at least (an empty dict is 64 bytes in CPython).
_CONTAINER_COST = 64
_NESTING_SLACK = 1024  # values not after a comma: at most one per nesting level (see parse_cost)
# Frames up to this size that are already exactly what orjson writes are re-encoded whole (one
# C call); bigger ones are spliced, which costs about the same and skips the canonical check.
_CANONICAL_CHECK_MAX = 64 * 1024

# How much of a diverted non-JSON line a note carries for the log.
SAMPLE_BYTES = 200

# Kinds of non-JSON agent output (``NonJson.kind``).
KIND_ANSI = "ansi-escape"  # contains a terminal escape sequence (ESC, 0x1b)
KIND_TEXT = "text"  # anything else that cannot be a frame: a banner, a log line, a scalar

_A2C = Direction.AGENT_TO_CLIENT
_C2A = Direction.CLIENT_TO_AGENT
_OBJECT_OPENER = ord("{")
_OPENERS = (_OBJECT_OPENER, ord("["))  # the first byte of every JSON-RPC frame (object or batch)
# The first two bytes of a line that can be a frame with nothing before its opener (issue 9,
# "diversion that matches reality"; ``rawjson.could_be_frame`` is the general check).
_FRAME_STARTS = frozenset(
    [b"{" + bytes([c]) for c in b' \t\r"}'] + [b"[" + bytes([c]) for c in b" \t\r]{["]
)

# A leading run of terminal escape sequences (CSI, OSC, two-byte ESC) and whitespace.
_ANSI_PREFIX = re.compile(
    rb"(?:\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|[ \t\r])+"
)


def _is_id(value: object) -> bool:
    # ACP digest §8.1: a RequestId is a string, an integer or null (JSON-RPC: also a number).
    return value is None or type(value) in (str, int, float)


def _encode(value: JsonObject | list[JsonValue]) -> bytes | None:
    """Encode a message the proxy built; ``None`` when it is not JSON-serializable."""
    try:
        return rawjson.encode_value(value)
    except rawjson.Unencodable:
        return None


def parse_cost(raw: bytes, budget: int) -> int:
    """An upper estimate of the memory a parse of ``raw`` takes (issue 10: a 60 MiB frame of
    ``{}`` parses into 20 million dicts, about 2 GB).

    Every value after the first of a container follows a comma, so ``_CONTAINER_COST`` per comma
    bounds what the values cost; the values that follow no comma are the first of each container,
    and a chain of those is as deep as the nesting, which parsers cap near a thousand. Cheap: one
    ``bytes.count`` pass, and only for frames big enough to matter.
    """
    n = len(raw)
    if n * 33 <= budget:  # even ``{},{},...`` (64 bytes per 3 input bytes) fits
        return n
    return n + _CONTAINER_COST * (raw.count(b",") + _NESTING_SLACK)


def _method_of(message: JsonObject) -> str | None:
    method = message.get("method")
    return method if isinstance(method, str) else None


def _update_kind(message: JsonObject) -> str | None:
    if message.get("method") != "session/update":
        return None
    params = message.get("params")
    update = params.get("update") if isinstance(params, dict) else None
    kind = update.get("sessionUpdate") if isinstance(update, dict) else None
    return kind if isinstance(kind, str) else None


def _needles_of(middleware: object) -> tuple[bytes, ...] | None:
    needles = getattr(middleware, "needles", None)
    return None if needles is None else tuple(needles)


class _Unset:
    """The prefilter was not run yet (``interested`` unknown)."""


_UNSET = _Unset()


@value
class _NotParsed:
    reason: str
    budget: bool = False  # over the parse budget (valid JSON, as far as anyone knows)


class _Acc:
    """Accumulates the pieces of one ``Result``."""

    __slots__ = ("forward", "notes", "reply")

    def __init__(self) -> None:
        self.forward: list[OutFrame] = []
        self.reply: list[OutFrame] = []
        self.notes: list[Note] = []

    def result(self) -> Result:
        return Result(tuple(self.forward), tuple(self.reply), tuple(self.notes))

    def extend(self, result: Result) -> None:
        self.forward.extend(result.forward)
        self.reply.extend(result.reply)
        self.notes.extend(result.notes)


class Connection:
    """Protocol state of one client-agent connection; ``handle`` one event at a time.

    Not thread-safe: the shell calls it from one task (or under one lock) for both directions,
    in the order frames were read per direction.
    """

    __slots__ = (
        "_answers",
        "_bctx_a2c",
        "_bctx_c2a",
        "_chain_on",
        "_ctx_a2c",
        "_ctx_c2a",
        "_escapes",
        "_fused",
        "_has_links",
        "_init_ids",
        "_inspect_all",
        "_kinds_seen",
        "_link_needles",
        "_max_parse",
        "_needles_by_state",
        "_non_json",
        "_not_parsed_seen",
        "_observe",
        "_tracker",
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
    ) -> None:
        self.chain = chain
        # Observing needs every frame on its own and parsed: it implies ``inspect_all``.
        self._observe = observe
        inspect_all = inspect_all or observe
        self._answers: dict[JsonValue, str] = {}  # responses of the current frame: id -> method
        self._max_parse = max_parse_bytes
        self._not_parsed_seen = False
        self.version: int | None = None
        self.stats = PipelineStats()
        self._non_json = non_json
        self._inspect_all = inspect_all
        self._has_links = len(chain) > 0
        self._chain_on = False  # links exist and the version is known: run the chain
        # ``_block_needles`` by (direction, chain on): at most four entries.
        self._needles_by_state: dict[tuple[Direction, bool], tuple[bytes, ...] | None] = {}
        self._link_needles = tuple(_needles_of(link.middleware) for link in chain.links)
        self._escapes = needle_escapes(self._link_needles)  # same rule as Chain.interested
        # Requests awaiting an answer, both ways, bounded (``acp_proxy.wire.tracking``).
        self._tracker = RequestTracker(max_pending)
        self._init_ids: set[JsonValue] = set()  # ids of the client's ``initialize`` requests
        self._kinds_seen: set[str] = set()
        # Issue 13: one middleware that can answer v2 upserts without building a message (the
        # rules middleware's ``fused_v2``, when its rules allow it): the annotation hot path.
        self._fused: Any = None
        if len(chain) == 1 and getattr(chain.links[0].middleware, "fusable", False) is True:
            self._fused = getattr(chain.links[0].middleware, "fused_v2", None)
        self._set_contexts()

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
                return self._agent_line(event.raw, _UNSET)
            return self._client_line(event.raw, _UNSET)
        assert isinstance(event, Oversize)
        return self._oversize(direction, event)

    def _observed(self, direction: Direction, event: Line | Oversize) -> Result:
        """``handle`` plus an ``Observed`` note describing the frame and its fate."""
        self._answers.clear()
        if type(event) is Line:
            raw = event.raw
            if direction is _A2C:
                res = self._agent_line(raw, _UNSET)
            else:
                res = self._client_line(raw, _UNSET)
        else:
            assert isinstance(event, Oversize)
            raw = event.head
            res = self._oversize(direction, event)
        infos = tuple(n for n in res.notes if type(n) is FrameInfo)
        notes = tuple(n for n in res.notes if type(n) is not FrameInfo)
        if type(event) is Oversize:
            kind = "oversize"
        elif any(type(n) is NotParsed for n in notes):
            kind = "unparsed"
        elif any(type(n) is NonJson for n in notes) and not infos:
            kind = "non-json"
        elif raw.lstrip()[:1] == b"[":
            kind = "batch"
        else:
            kind = "message"
        sent: tuple[bytes, ...] | None = tuple(f.raw for f in res.forward)
        if type(event) is Line and sent == (raw,):
            sent = None  # untouched (the usual case)
        replies = tuple(f.raw for f in res.reply)
        observed = Observed(direction, raw, sent, replies, infos, kind)
        return Result(res.forward, res.reply, (*notes, *infos, observed))

    def handle_line(self, direction: Direction, raw: bytes) -> JsonObject | Result:
        """``handle_many(direction, [Line(raw)])`` for one non-empty line, without the event
        loop around it (issue 13, round trip: ``LineSplitter.single_line`` gives such lines).

        A request or response no middleware may act on comes back as its parsed message alone:
        tracked, and to be forwarded exactly as it came (``Result((OutFrame(raw, message,
        version),))``, which the shell writes without building it). Anything else comes back
        as the general path's ``Result``. The middleware's interest is looked for once."""
        if self._inspect_all:
            return self.handle_many(direction, [Line(raw)])
        interested = self._interested(raw) if self._chain_on else None
        if interested is None and raw.find(b'"id"') >= 0:
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
        one answers (issue 13, round trip: the general path's dozen small calls were half of
        the proxy's CPU per request; ``test_roundtrip_lane.py`` compares the two on generated
        frames).

        Answered here only: a frame that starts like one (``{"``, ``{ ``...), within the parse
        budget even by the cheap estimate, that orjson parses to an object. A request (a valid
        ``id``, a string ``method``) is admitted to its table, or left to the general path's
        refusal when the table is full; a response (a valid ``id``, ``result`` or ``error``)
        takes its request out of the table, except the response to ``initialize`` (the
        version negotiation, left to the general path); any other object is forwarded
        untracked, as the general path does. Not inspecting (``_inspect_all``), as the caller
        checks.
        """
        # ``{`` first: an object with nothing before its opener (what ``_FRAME_STARTS`` admits
        # of objects, once orjson parsed it), so what parses is a ``dict``.
        if raw[0] != _OBJECT_OPENER or len(raw) * 33 > self._max_parse:
            return None
        try:
            message: JsonObject = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        rid = message.get("id", OMITTED)
        if type(rid) is int or type(rid) is str or type(rid) is float or rid is None:  # ``_is_id``
            method = message.get("method", OMITTED)
            if method is not OMITTED:
                if type(method) is not str:
                    return None
                # A JSON integer has one spelling, ``-?(0|[1-9][0-9]*)`` (RFC 8259 section 6),
                # and orjson returns an ``int`` only for one, so a non-zero ``int`` id's bytes
                # are its decimal form; ``0`` may have been ``-0``, and every other id is read
                # from ``raw``.
                id_bytes = b"%d" % rid if type(rid) is int and rid else rawjson.id_bytes(raw)
                if id_bytes is None or not self._tracker.admit(direction, rid, method, id_bytes):
                    return None  # the general path refuses it (table full) or says why
                if method == "initialize" and direction is _C2A:
                    self._init_ids.add(rid)
            elif "result" in message or "error" in message:
                if direction is _A2C:
                    if rid in self._init_ids:
                        return None  # the version negotiation
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
        """``handle`` each event in order and concatenate the results: one call per read.

        Cheaper than one ``handle`` per event: frames that pass untouched and unparsed (the hot
        path) are collected without a ``Result`` each. With ``join=True``, each run of such
        consecutive frames becomes ONE ``OutFrame`` whose ``raw`` is the frames joined with
        ``b"\\n"`` (``message=None``): writing ``raw + b"\\n"`` still puts the exact input bytes on
        the wire, at a fraction of the per-frame cost. The outbound queue splits such a frame into
        its lines when it has to wait (its merge pass), so coalescing still sees every
        line. Stats still count every frame.
        """
        forward: list[OutFrame] = []
        reply: list[OutFrame] = []
        notes: list[Note] = []
        run: list[bytes] = []  # consecutive untouched, unparsed frames
        a2c = direction is _A2C
        fast = not self._inspect_all
        for item in events:
            event = item
            if type(event) is Block:
                if event.raw.find(b"\n") < 0:
                    # One line (interactive traffic: a request, its response): the per-line
                    # path below without the block's scan and nested call (issue 13, round
                    # trip). ``feed_blocks`` never makes a blank block, so nothing is dropped.
                    event = Line(event.raw)
                else:
                    if run:
                        self._flush_run(direction, run, forward, join)
                        run = []
                    acc = _Acc()
                    acc.forward, acc.reply, acc.notes = forward, reply, notes
                    self._block(direction, event, acc, join=join)
                    continue
            interested: tuple[bool, ...] | _Unset | None = _UNSET
            if fast and type(event) is Line:
                raw = event.raw
                interested = self._interested(raw) if self._chain_on else None
                if a2c:
                    if (
                        interested is None
                        and raw[:2] in _FRAME_STARTS
                        and not _agent_needs_parse(raw)
                    ):
                        run.append(raw)
                        continue
                elif interested is None and not _client_needs_parse(raw):
                    run.append(raw)
                    continue
            if run:
                self._flush_run(direction, run, forward, join)
                run = []
            assert not isinstance(event, Block)
            if not isinstance(interested, _Unset) and type(event) is Line:
                # The prefilter's answer is known: do not compute it twice (hot path).
                if a2c:
                    res = self._agent_line(event.raw, interested)
                else:
                    res = self._client_line(event.raw, interested)
            else:
                res = self.handle(direction, event)
            forward.extend(res.forward)
            if res.reply:
                reply.extend(res.reply)
            if res.notes:
                notes.extend(res.notes)
        if run:
            self._flush_run(direction, run, forward, join)
        return Result(tuple(forward), tuple(reply), tuple(notes))

    def _block(self, direction: Direction, block: Block, acc: _Acc, *, join: bool) -> None:
        """Several complete lines read together (``LineSplitter.feed_blocks``).

        Only the lines that something may need go through the per-line path: those holding a
        needle of an interested link, an ``"id"`` (requests and responses, for the tracker; the
        initialize response), or, when links have needles, a ``\\u`` / ``\\/`` escape that could
        hide one. The runs of lines between them are forwarded as they arrived, without being
        split or parsed, after one check that each starts like a JSON frame (non-JSON agent
        output must still be diverted). Same output and stats as feeding the lines one by one.
        """
        raw = block.raw
        # Until the version is known the chain is off, and the initialize response inside this
        # block may turn it on halfway: take such blocks line by line (once per connection).
        waiting = self._has_links and not self._chain_on
        needles = None if self._inspect_all or waiting else self._block_needles(direction)
        if needles is None:
            acc.extend(self.handle_many(direction, block.lines(), join=join))
            return
        # One pass (``acp_proxy.wire.scan``, C when built): the lines that hold a needle or do
        # not start like ``{"`` (a batch, a blank line, whitespace before a frame, non-JSON
        # output: the per-line path diverts what cannot be a frame). The runs of ``{"`` lines
        # between them are forwarded whole (a stream of updates with the odd batch in it).
        lines, specials = block_scan.scan(raw, needles)
        index = 0  # the line index of ``pos``
        pos = 0
        special: list[Line | Oversize | Block] = []  # consecutive lines for the per-line path
        # The fused lane (issue 13): a v2 notification that the one fusable middleware answers
        # goes straight from here to ``_fused_bytes``, skipping the per-line path's steps that
        # cannot change its outcome there (see ``_lane``).
        lane = self._fused is not None and self.version == 2 and self._chain_on
        for line_index, start, stop in specials:
            if line_index > index:
                if special:  # one call per group (a block of updates that all need a look)
                    acc.extend(self.handle_many(direction, special, join=join))
                    special = []
                self._plain_run(direction, raw[pos : start - 1], line_index - index, acc, join)
            index = line_index + 1
            pos = stop + 1
            line = raw[start:stop]
            if lane and line[:2] == b'{"' and line.find(b'"id"') < 0:
                out = self._lane(direction, line)
                if out is not None:
                    if special:
                        acc.extend(self.handle_many(direction, special, join=join))
                        special = []
                    acc.forward.append(out)
                    continue
            if line and not line.isspace():  # blank lines are dropped, as ``Block.lines`` does
                special.append(Line(line))
        if special:
            acc.extend(self.handle_many(direction, special, join=join))
        if lines > index:
            self._plain_run(direction, raw[pos:], lines - index, acc, join)

    def _block_needles(self, direction: Direction) -> tuple[bytes, ...] | None:
        """What makes a line of a block need the per-line path; None: every line does. Built
        once per direction and state of the chain (it turns on once, with the version)."""
        key = (direction, self._chain_on)
        cached = self._needles_by_state.get(key, _UNSET)
        if not isinstance(cached, _Unset):
            return cached
        made = self._make_block_needles(direction)
        self._needles_by_state[key] = made
        return made

    def _make_block_needles(self, direction: Direction) -> tuple[bytes, ...] | None:
        needles: list[bytes] = [b'"id"']  # requests and responses, for the tracker
        if direction is _C2A:
            needles.extend(_ESCAPES)  # ``_client_needs_parse`` parses escaped client frames too
        if self._chain_on:
            for link_needles in self._link_needles:
                if link_needles is None:
                    return None
                needles.extend(link_needles)
            needles.extend(self._escapes)
        return tuple(needles)

    def _plain_run(self, direction: Direction, run: bytes, n: int, acc: _Acc, join: bool) -> None:
        """``n`` lines that start like ``{"`` and that no middleware and no tracker needs."""
        if join:
            self._count_passed(direction, n)
            acc.forward.append(OutFrame(run, None, self.version))
        else:
            self._flush_run(direction, run.split(b"\n") if n > 1 else [run], acc.forward, False)

    def _flush_run(
        self, direction: Direction, run: list[bytes], forward: list[OutFrame], join: bool
    ) -> None:
        n = len(run)
        self._count_passed(direction, n)
        version = self.version
        if join:
            forward.append(OutFrame(b"\n".join(run) if n > 1 else run[0], None, version))
        else:
            forward.extend([OutFrame(raw, None, version) for raw in run])

    def _count_passed(self, direction: Direction, n: int) -> None:
        """``n`` frames read and forwarded untouched."""
        if direction is _A2C:
            self.stats.agent_to_client_in += n
            self.stats.agent_to_client_out += n
        else:
            self.stats.client_to_agent_in += n
            self.stats.client_to_agent_out += n

    def abort_pending(self, message: str) -> Iterator[tuple[OutFrame, ...]]:
        """One -32603 error response (``message``) per client request still awaiting the agent.

        For when the agent is gone (issue 3: "every client request still awaiting a response gets
        a JSON-RPC error response (code -32603, message naming the exit status)"). The requests
        are no longer tracked from the call on; their responses are built lazily, in chunks of
        ``ABORT_CHUNK`` in arrival order, as the caller iterates (issue 10.2: 400,000 responses
        built at once took 1.9 GB), so the shell can write each chunk before the next is made.
        """
        return self._abort(_C2A, message)

    def abort_agent_requests(self, message: str) -> Iterator[tuple[OutFrame, ...]]:
        """One -32603 error response per agent request still awaiting the client (client gone),
        lazily in chunks like ``abort_pending``."""
        return self._abort(_A2C, message)

    def _abort(self, direction: Direction, message: str) -> Iterator[tuple[OutFrame, ...]]:
        chunks = self._tracker.abort(direction, message)  # detached now, built lazily
        version, stats = self.version, self.stats

        def frames() -> Iterator[tuple[OutFrame, ...]]:
            for chunk, n in chunks:
                stats.errors_replied += n
                # Only the bytes (no decoded message): an error response is a barrier for the
                # outbound queue, which never needs to parse it.
                yield tuple(OutFrame(data, None, version) for data in chunk)

        return frames()

    # --- agent -> client ----------------------------------------------------------------------

    def _agent_line(
        self, raw: bytes, interested: tuple[bool, ...] | _Unset | None = _UNSET
    ) -> Result:
        self.stats.agent_to_client_in += 1
        if not raw:
            return EMPTY
        if raw[:2] not in _FRAME_STARTS and not rawjson.could_be_frame(raw):
            return self._agent_odd(raw)
        if isinstance(interested, _Unset):
            interested = self._interested(raw) if self._chain_on else None
        if interested is None and not self._inspect_all and not _agent_needs_parse(raw):
            # Nothing may act on this frame and the tracker does not need it: forward its bytes
            # unparsed.
            self.stats.agent_to_client_out += 1
            return Result((OutFrame(raw, None, self.version),))
        parsed = self._parse(raw)
        if type(parsed) is _NotParsed:
            return self._unparsed(_A2C, raw, parsed)
        return self._parsed(_A2C, raw, parsed, interested, ())

    def _agent_odd(self, raw: bytes) -> Result:
        """An agent line that cannot be a frame (``rawjson.could_be_frame``): diverted, no parse.

        One exception: terminal escape sequences followed by a frame (a coloured logger that
        wrapped a message); the escapes are diverted and the message goes on.
        """
        if b"\x1b" in raw:
            if self._non_json is NonJsonPolicy.LOG:
                match = _ANSI_PREFIX.match(raw)
                rest = raw[match.end() :] if match else b""
                if rawjson.could_be_frame(rest):
                    parsed = self._parse(rest)
                    if isinstance(parsed, (dict, list)):
                        # An escape sequence before the JSON: divert it, keep the message.
                        prefix = raw[: len(raw) - len(rest)]
                        note = self._non_json_note(KIND_ANSI, prefix, forwarded=False)
                        self.stats.diverted += 1
                        return self._parsed(_A2C, rest, parsed, self._interested(rest), (note,))
            return self._agent_non_json(raw, KIND_ANSI, ())
        return self._agent_non_json(raw, KIND_TEXT, ())

    def _agent_non_json(self, raw: bytes, kind: str, notes: tuple[Note, ...]) -> Result:
        forwarded = self._non_json is NonJsonPolicy.FORWARD
        note = self._non_json_note(kind, raw, forwarded=forwarded)
        if forwarded:
            self.stats.agent_to_client_out += 1
            return Result((OutFrame(raw, None, self.version),), (), (*notes, note))
        self.stats.diverted += 1
        return Result((), (), (*notes, note))

    def _non_json_note(self, kind: str, raw: bytes, *, forwarded: bool) -> NonJson:
        first = kind not in self._kinds_seen
        if first:
            self._kinds_seen.add(kind)
        return NonJson(kind, len(raw), raw[:SAMPLE_BYTES], first, forwarded)

    # --- client -> agent ----------------------------------------------------------------------

    def _client_line(
        self, raw: bytes, interested: tuple[bool, ...] | _Unset | None = _UNSET
    ) -> Result:
        self.stats.client_to_agent_in += 1
        if isinstance(interested, _Unset):
            interested = self._interested(raw) if self._chain_on else None
        if interested is None and not self._inspect_all and not _client_needs_parse(raw):
            self.stats.client_to_agent_out += 1
            return Result((OutFrame(raw, None, self.version),))
        parsed = self._parse(raw)
        if type(parsed) is _NotParsed:
            # Malformed or unreadable: forwarded as is, the agent answers it (-32700).
            return self._unparsed(_C2A, raw, parsed)
        return self._parsed(_C2A, raw, parsed, interested, ())

    # --- shared -------------------------------------------------------------------------------

    def _interested(self, raw: bytes) -> tuple[bool, ...] | None:
        """Per link, whether it may act on ``raw``; ``None`` when no link may.

        The same answer as ``Chain.interested`` (a link without needles always; otherwise one of
        its needles occurs, or the frame has a JSON escape that could hide one), computed with
        ``bytes.find`` (``in`` on bytes costs an internal exception per call on CPython 3.11)
        and the escape scan done once, only when needed.
        """
        if not self._chain_on:
            return None
        escaped: bool | None = None
        flags: list[bool] = []
        for needles in self._link_needles:
            if needles is None:
                flags.append(True)
                continue
            hit = False
            for needle in needles:
                if raw.find(needle) >= 0:
                    hit = True
                    break
            if not hit:
                if escaped is None:
                    escaped = _has_any(raw, self._escapes)
                hit = escaped
            flags.append(hit)
        return tuple(flags) if True in flags else None

    def _count_out(self, direction: Direction, n: int) -> None:
        if direction is _A2C:
            self.stats.agent_to_client_out += n
        else:
            self.stats.client_to_agent_out += n

    def _parse(self, raw: bytes) -> JsonValue | _NotParsed:
        """The frame's value, exactly (``rawjson.loads``), or why it was not parsed."""
        if parse_cost(raw, self._max_parse) > self._max_parse:
            return _NotParsed(f"over the parse budget of {self._max_parse} bytes", budget=True)
        try:
            return rawjson.loads(raw)
        except rawjson.Unparseable as exc:
            return _NotParsed(f"not parseable JSON: {exc}")

    def _unparsed(self, direction: Direction, raw: bytes, why: _NotParsed) -> Result:
        """Forward a frame that could not be parsed as it came (issue 9: never drop it), keeping
        the request tables right from what its head says: a response answers its request; a
        request over the parse budget is tracked (its receiver can read it; one that is not
        JSON cannot be answered with its id, so it is not)."""
        self.stats.not_parsed += 1
        note = NotParsed(direction, len(raw), why.reason, not self._not_parsed_seen)
        self._not_parsed_seen = True
        head = raw[:HEAD_BYTES]
        if raw.find(b'"id"') >= 0:
            info = scan_head(head)
            if "method" in info.keys:
                if why.budget and info.has_id and _is_id(info.id):
                    method = info.method if info.method is not None else "?"
                    refused = self._admit(direction, info.id, method, info.id_bytes)
                    if refused is not None:
                        full = self._full_note(direction, method)
                        return Result((), (refused,), (note, full))
            else:
                is_response, rid = read_response_id(head)
                if is_response:
                    self._answered(direction, rid)
        self._count_out(direction, 1)
        return Result((OutFrame(raw, None, self.version),), (), (note,))

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
            return self._batch(direction, raw, parsed, interested, notes)
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
        if interested is None:  # parsed only for tracking / inspection
            if "id" in message or self._inspect_all:
                acc_notes = list(notes)
                self._track(direction, message, acc_notes, raw)
                if self._inspect_all:
                    acc_notes.append(self._info(direction, message, len(raw), ()))
                notes = tuple(acc_notes)
            self._count_out(direction, 1)
            return Result((OutFrame(raw, message, version),), (), notes)
        if (
            self._fused is not None
            and version == 2
            and "id" not in message
            and not self._inspect_all
        ):
            fused = self._fused_frame(direction, raw, message, notes)
            if fused is not None:
                return fused
        ctx = self._ctx_a2c if direction is _A2C else self._ctx_c2a
        outcome = self.chain.run(message, ctx, interested)
        if (
            outcome.changed
            and len(outcome.messages) == 1
            and not outcome.failures
            and not outcome.replies
            and not self._inspect_all
        ):
            # The annotation hot path: one message in, one changed message out.
            out = outcome.messages[0]
            try:
                data = _rewrite(raw, message, out)
            except (rawjson.Unencodable, rawjson.Unparseable):
                data = None
            if data is not None:
                self.stats.rewritten += 1
                self._count_out(direction, 1)
                if "id" in out:
                    acc_notes = list(notes)
                    self._track(direction, out, acc_notes, raw if out is message else None)
                    notes = tuple(acc_notes)
                # (No ``Rewritten`` note: only debug logging shows it, and debug means
                # ``inspect_all``, which takes the general path below.)
                return Result((OutFrame(data, out, version),), (), notes)
        acc = _Acc()
        acc.notes.extend(notes)
        self._report(message, outcome, acc.notes)
        encoded = (
            self._encode_outcome(raw, message, outcome, acc.notes) if outcome.changed else None
        )
        if encoded is None:  # unchanged (or unencodable: fail open)
            acc.forward.append(OutFrame(raw, message, version))
            self._track(direction, message, acc.notes, raw)
        else:
            for out, data in zip(outcome.messages, encoded, strict=True):
                acc.forward.append(OutFrame(data, out, version))
                self._track(direction, out, acc.notes, None)
        if self._inspect_all:
            acc.notes.append(self._info(direction, message, len(raw), outcome.changed_by))
        for reply in outcome.replies:
            acc.reply.append(self._reply_frame(reply, raw, message))
        self._count_out(direction, len(acc.forward))
        return acc.result()

    def _lane(self, direction: Direction, raw: bytes) -> OutFrame | None:
        """The fused lane of ``_block``: ``raw``, a line of a block that starts with ``{"`` and
        holds no ``"id"``, on a v2 connection whose chain is one fusable middleware, handled as
        the per-line path would (``_agent_line`` / ``_client_line``, ``_single``,
        ``_fused_frame``) with its steps that cannot change the outcome here left out: the
        prefilter (without a needle of its rules, ``fused_v2`` leaves a message as it is, which
        is what the per-line path does without parsing it), the parse budget check (the frame
        is far below it), the tracker and the request bound (a notification). ``None``: not
        such a frame after all (not parseable by orjson, not an object, an ``id`` behind an
        escape, or a case ``fused_v2`` leaves to the general path): the caller takes the
        per-line path, which parses it again."""
        if len(raw) * 33 > self._max_parse:
            return None
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if type(message) is not dict or "id" in message:
            return None
        data = self._fused_bytes(direction, raw, message)
        if data is None:
            return None
        stats = self.stats  # ``_count_passed(direction, 1)``, inline: once per annotated frame
        if direction is _A2C:
            stats.agent_to_client_in += 1
            stats.agent_to_client_out += 1
        else:
            stats.client_to_agent_in += 1
            stats.client_to_agent_out += 1
        return OutFrame(data, message, self.version)

    def _fused_frame(
        self, direction: Direction, raw: bytes, message: JsonObject, notes: tuple[Note, ...]
    ) -> Result | None:
        """``_fused_bytes`` as the per-line path's ``Result``; ``None``: take the general path
        (the message is as it was)."""
        data = self._fused_bytes(direction, raw, message)
        if data is None:
            return None
        self._count_out(direction, 1)
        return Result((OutFrame(data, message, self.version),), (), notes)

    def _fused_bytes(self, direction: Direction, raw: bytes, message: JsonObject) -> bytes | None:
        """The annotation hot path (issue 13): a v2 `session/update` notification and a
        middleware with ``fused_v2``. Only the new `_meta` members are built (the update's, for
        entity rules; ``params._meta``, for message-target rules); they are set on the parsed
        message (which no one else holds) and only their bytes are encoded into the frame: the
        whole message when the frame is exactly what orjson writes (one C call), else spliced
        into ``raw`` (``rawjson.splice_member``, one member after the other), the same bytes
        ``_rewrite`` gives. Returns the frame to forward (``raw`` itself when the rules leave
        the message as it is); ``None``: take the general path (the message is as it was)."""
        try:
            got = self._fused(message, direction)
        except Exception:  # the general path runs the middleware and reports the failure
            return None
        if got is None:
            return None
        if got is OMITTED:
            return raw
        # (path to the object, the object, the new value of its ``_meta``)
        edits: list[tuple[tuple[str, ...], JsonObject, JsonValue]] = []
        if got.update_meta is not OMITTED:
            edits.append((_UPDATE_PATH, got.update, got.update_meta))
        if got.params_meta is not OMITTED:
            edits.append((_PARAMS_PATH, got.params, got.params_meta))
        if _SPLICE_IN_C is None and _canonical(raw, message):
            # Without the C accelerator, encoding a canonical frame whole (one C call) beats the
            # splice's Python scan; with it, the splice (one C call per member) is cheaper still:
            # it encodes only the new members and compares nothing.
            for _, holder, new in edits:
                holder["_meta"] = new
            # ``orjson.dumps`` directly, not ``rawjson.encode_value`` (which walks the whole
            # message for NaN whenever the output holds a ``null``), and it cannot fail: orjson
            # just wrote the message as ``raw`` (``_canonical``), so it holds nothing orjson
            # refuses and no NaN, and the fused table only takes rule values that orjson writes
            # back exactly (``rules._writes_back``).
            data = orjson.dumps(message)
        else:
            data = raw
            try:
                for path, holder, new in edits:
                    present = "_meta" in holder
                    old_value = holder.get("_meta")
                    data = rawjson.splice_member(
                        data, path, "_meta", old_value, new, present=present
                    )
            except (rawjson.Unparseable, rawjson.Unencodable):
                return None
            for _, holder, new in edits:
                holder["_meta"] = new
        self.stats.rewritten += 1
        return data

    def _batch(
        self,
        direction: Direction,
        raw: bytes,
        entries: list[JsonValue],
        interested: tuple[bool, ...] | None,
        notes: tuple[Note, ...],
    ) -> Result:
        acc = _Acc()
        acc.notes.extend(notes)
        version = self.version
        full = self._would_overflow(direction, entries)
        if interested is None and not full:
            for entry in entries:
                if isinstance(entry, dict):
                    self._track(direction, entry, acc.notes, None)
                    if self._inspect_all:
                        acc.notes.append(self._info(direction, entry, len(raw), ()))
            acc.forward.append(OutFrame(raw, None, version))
            self._count_out(direction, 1)
            return acc.result()
        if interested is None:
            interested = tuple(False for _ in self.chain.links)
        ctx = self._bctx_a2c if direction is _A2C else self._bctx_c2a
        try:
            # Where the array opens (after any whitespace), then one scan of its elements, which
            # also gives where it closes: the batch is walked once, not three times.
            opens = rawjson.value_start(raw)
            spans, closes = rawjson.array_elements(raw, opens)
        except rawjson.Unparseable:  # pragma: no cover - ``raw`` parsed as this array
            return self._unparsed(direction, raw, _NotParsed("batch could not be scanned"))
        # Per entry: its bytes in the array (None: dropped), then the frames that follow it.
        kept: list[bytes | None] = []
        fused = self._fused is not None and version == 2 and not self._inspect_all
        follow: list[OutFrame] = []
        replies: list[bytes] = []
        changed = False
        for entry, (es, ee) in zip(entries, spans, strict=True):
            if not isinstance(entry, dict):  # invalid entry: the receiver answers it (-32600)
                kept.append(raw[es:ee])
                continue
            entry_raw = raw[es:ee]
            if full and "id" in entry and "method" in entry:
                refused = self._refuse_if_full(direction, entry_raw, entry)
                if refused is not None:
                    acc.notes.append(self._full_note(direction, entry))
                    replies.append(refused.raw)
                    self.stats.errors_replied += 1
                    kept.append(None)
                    changed = True
                    continue
            if fused and "id" not in entry:
                # A v2 notification in a batch: the fused path, as for a frame on its own.
                data = self._fused_bytes(direction, entry_raw, entry)
                if data is not None:
                    kept.append(data)
                    changed = changed or data is not entry_raw
                    continue
            outcome = self.chain.run(entry, ctx, interested)
            self._report(entry, outcome, acc.notes)
            for r in outcome.replies:
                replies.append(self._reply_bytes(r, entry_raw, entry))
                self.stats.errors_replied += "error" in r
            if self._inspect_all:
                acc.notes.append(self._info(direction, entry, len(raw), outcome.changed_by))
            encoded = (
                self._encode_outcome(entry_raw, entry, outcome, acc.notes)
                if outcome.changed
                else None
            )
            if encoded is None:  # unchanged (or unencodable: fail open)
                kept.append(entry_raw)
                self._track(direction, entry, acc.notes, entry_raw)
                continue
            changed = True
            if not outcome.messages:
                kept.append(None)
            for i, (out, data) in enumerate(zip(outcome.messages, encoded, strict=True)):
                self._track(direction, out, acc.notes, None)
                if i == 0:
                    kept.append(data)  # takes the entry's place inside the array
                else:
                    follow.append(OutFrame(data, out, version))  # never batched
        if not changed:
            acc.forward.append(OutFrame(raw, None, version))
        elif any(k is not None for k in kept):
            joined = _join_array(raw, (opens, closes + 1), spans, kept)
            acc.forward.append(OutFrame(joined, None, version))
        acc.forward.extend(follow)
        if replies:
            # JSON-RPC: the answers to a batch are one array (ACP digest §1.2).
            self.stats.replies += 1
            acc.reply.append(OutFrame(b"[" + b",".join(replies) + b"]", None, version))
        self._count_out(direction, len(acc.forward))
        return acc.result()

    def _encode_outcome(
        self, raw: bytes, message: JsonObject, outcome: Outcome, notes: list[Note]
    ) -> list[bytes] | None:
        """The bytes of each message of a changed outcome, each spliced into the original's bytes
        (only what changed is encoded); ``None`` (and a failure note) when one is not JSON, in
        which case the original goes on (fail-open)."""
        encoded = []
        for out in outcome.messages:
            try:
                encoded.append(_rewrite(raw, message, out))
            except (rawjson.Unencodable, rawjson.Unparseable):
                culprit = outcome.changed_by[-1] if outcome.changed_by else "middleware"
                notes.append(MiddlewareFailed(_unencodable(culprit)))
                self.stats.middleware_failures += 1
                return None
        return encoded

    def _reply_frame(
        self, message: JsonObject, raw: bytes | None = None, request: JsonObject | None = None
    ) -> OutFrame:
        """A frame back to the sender of ``request`` (whose bytes are ``raw``): what it shares
        with the request (its id) keeps the request's bytes."""
        encoded = self._reply_bytes(message, raw, request)
        self.stats.replies += 1
        if "error" in message:
            self.stats.errors_replied += 1
        return OutFrame(encoded, message, self.version)

    @staticmethod
    def _reply_bytes(message: JsonObject, raw: bytes | None, request: JsonObject | None) -> bytes:
        encoded: bytes | None
        try:
            if raw is not None and request is not None:
                encoded = rawjson.splice(raw, request, message)
            else:
                encoded = rawjson.encode_value(message)
        except (rawjson.Unencodable, rawjson.Unparseable):
            encoded = None
        if encoded is None:  # a middleware's reply that is not JSON: an error for the request
            rid = request.get("id") if request is not None else None
            error = error_response(rid, INTERNAL_ERROR, "acp-proxy: bad reply")
            try:  # the id keeps the request's bytes, as every reply's does
                if raw is not None and request is not None:
                    return rawjson.splice(raw, request, error)
                return rawjson.encode_value(error)
            except (rawjson.Unencodable, rawjson.Unparseable):
                encoded = orjson.dumps(error_response(None, INTERNAL_ERROR, "bad reply"))
        return encoded

    def _report(self, message: JsonObject, outcome: Outcome, notes: list[Note]) -> None:
        for failure in outcome.failures:
            notes.append(MiddlewareFailed(failure))
        self.stats.middleware_failures += len(outcome.failures)
        if outcome.dropped_by is not None:
            notes.append(Dropped(_method_of(message), outcome.dropped_by))
            self.stats.dropped += 1
        if outcome.changed and outcome.changed_by and outcome.messages:
            if self._inspect_all:  # a debug-log note: built only when debug logging is on
                notes.append(
                    Rewritten(_method_of(message), outcome.changed_by, len(outcome.messages))
                )
            self.stats.rewritten += 1
        if outcome.skipped and self._inspect_all:
            notes.append(SkippedV1(_method_of(message), _update_kind(message), outcome.skipped))

    def _info(
        self, direction: Direction, message: JsonObject, size: int, changed_by: tuple[str, ...]
    ) -> FrameInfo:
        rid = message.get("id")
        rid = rid if _is_id(rid) else None
        method = _method_of(message)
        answers = None
        if method is None and ("result" in message or "error" in message):
            answers = self._answers.get(rid)
        return FrameInfo(direction, method, rid, _update_kind(message), size, changed_by, answers)

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
        if not _is_id(rid):
            return  # invalid request id: the receiver answers it; nothing to track
        if "method" in message:
            method = message["method"]
            if not isinstance(method, str):
                return
            id_bytes = None
            if raw is not None:
                try:
                    id_bytes = rawjson.id_bytes(raw)
                except rawjson.Unparseable:  # pragma: no cover - ``raw`` parsed as ``message``
                    id_bytes = None
            if id_bytes is None:
                id_bytes = _encode(rid) or b"null"  # type: ignore[arg-type]
            self._admit(direction, rid, method, id_bytes)
            if direction is _C2A and method == "initialize":
                self._init_ids.add(rid)
            return
        if "result" not in message and "error" not in message:
            return  # not a response either
        self._answered(direction, rid)
        if direction is _A2C and rid in self._init_ids:
            self._init_ids.discard(rid)
            self._negotiate(message, notes)

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
        data = error_frame_bytes(
            id_bytes,
            INTERNAL_ERROR,
            f"acp-proxy: too many requests awaiting an answer (limit {self._tracker.max_pending}); "
            "not forwarded",
        )
        return OutFrame(data, None, self.version)

    def _full_note(self, direction: Direction, message: JsonObject | str) -> PendingFull:
        method = message if isinstance(message, str) else _method_of(message) or "?"
        return PendingFull(direction, method, self._tracker.max_pending)

    def _refuse_if_full(
        self, direction: Direction, raw: bytes, message: JsonObject
    ) -> OutFrame | None:
        """An error reply for the request ``message`` if its table has no room, else ``None``."""
        if not self._tracker.full(direction):
            return None
        rid = message["id"]
        if not _is_id(rid) or self._tracker.knows(direction, rid):
            return None
        try:
            id_bytes = rawjson.id_bytes(raw) or b"null"
        except rawjson.Unparseable:  # pragma: no cover - ``raw`` parsed as ``message``
            id_bytes = _encode(rid) or b"null"  # type: ignore[arg-type]
        return self._full_reply(id_bytes)

    def _would_overflow(self, direction: Direction, entries: list[JsonValue]) -> bool:
        """Whether the requests of a batch may not all fit in their table."""
        room = self._tracker.room(direction)
        requests = 0
        for entry in entries:
            if isinstance(entry, dict) and "id" in entry and "method" in entry:
                requests += 1
        return requests > room

    def _negotiate(self, response: JsonObject, notes: list[Note]) -> None:
        # ACP digest §2.3: the negotiated version is ``result.protocolVersion`` of the
        # ``initialize`` response, a JSON integer (an error response negotiates nothing).
        result = response.get("result")
        if not isinstance(result, dict) or "protocolVersion" not in result:
            return
        version = result["protocolVersion"]
        if type(version) is float and version.is_integer() and version >= 1:
            # Issue 9, "version robustness": ``2.0`` means 2 to every JSON reader that has one
            # number type (JavaScript's included); treat it as 2 rather than disable every rule.
            notes.append(UnusualVersion(_json_text(version), f"treated as {int(version)}"))
            version = int(version)
        if type(version) is not int or version < 1:
            # A string, a fraction, zero, a boolean: no version the proxy knows. The rules stay
            # off for the session (frames pass untouched), and the log says so.
            notes.append(
                UnusualVersion(
                    _json_text(version),
                    "not a positive integer: no rule runs on this session, frames pass untouched",
                )
            )
            return
        if version != self.version:
            self.version = version
            self._set_contexts()
            notes.append(VersionNegotiated(version))

    def _set_contexts(self) -> None:
        self._chain_on = self._has_links and self.version is not None
        self._ctx_a2c = MessageContext(_A2C, self.version, False)
        self._ctx_c2a = MessageContext(_C2A, self.version, False)
        self._bctx_a2c = MessageContext(_A2C, self.version, True)
        self._bctx_c2a = MessageContext(_C2A, self.version, True)

    # --- oversize -----------------------------------------------------------------------------

    def _oversize(self, direction: Direction, event: Oversize) -> Result:
        stats = self.stats
        stats.oversize += 1
        if direction is _A2C:
            stats.agent_to_client_in += 1
        else:
            stats.client_to_agent_in += 1
        limit = f"the {event.limit}-byte limit" if event.limit else "the frame size limit"
        head = event.head[:HEAD_BYTES]
        is_request, rid = read_request_id(head)
        if is_request:
            # The sender would otherwise wait forever for an answer that cannot come.
            text = f"acp-proxy: message of {event.size} bytes exceeds {limit}; not forwarded"
            response = error_response(rid, INVALID_REQUEST, text)
            id_bytes = scan_head(head).id_bytes
            data = error_frame_bytes(id_bytes, INVALID_REQUEST, text)
            stats.replies += 1
            stats.errors_replied += 1
            note = OversizeFrame(event.size, rid, replied=True, limit=event.limit)
            return Result((), (OutFrame(data, response, self.version),), (note,))
        is_response, rid = read_response_id(head)
        # The sender of a response is the receiver of its request: the request's sender is on the
        # other side, and it only gets an error if we know it is waiting for this id.
        entry = self._answered(direction, rid) if is_response else None
        if entry is not None:
            id_bytes = entry[1]
            text = f"acp-proxy: the response was {event.size} bytes, over {limit}; dropped"
            response = error_response(rid, INTERNAL_ERROR, text)
            stats.errors_replied += 1
            self._count_out(direction, 1)
            note = OversizeFrame(event.size, rid, answered=True, limit=event.limit)
            frame = OutFrame(
                error_frame_bytes(id_bytes, INTERNAL_ERROR, text), response, self.version
            )
            return Result((frame,), (), (note,))
        return Result((), (), (OversizeFrame(event.size, None, limit=event.limit),))


def _rewrite(raw: bytes, original: JsonObject, out: JsonObject) -> bytes:
    """The bytes of ``out``, a middleware's version of ``original`` (the parse of ``raw``).

    Issue 9, "lossless rewriting": only the members that changed are encoded; everything else
    keeps ``raw``'s bytes (``rawjson.splice``). Fast path: a frame that is already exactly what
    orjson writes for its value (compact, no escapes, every number in orjson's own spelling) gives
    the same bytes as the splice when ``out`` is encoded whole, at a fraction of the cost.
    Raises ``rawjson.Unencodable`` for a changed value that is not JSON.
    """
    if out is original:
        # The middleware changed the message in place (the interface forbids it) and returned
        # it: compare against a fresh parse, so the change is not mistaken for "unchanged".
        fresh = rawjson.loads(raw)
        assert isinstance(fresh, dict)
        original = fresh
    if _canonical(raw, original):
        return rawjson.encode_value(out)
    return rawjson.splice(raw, original, out)


def _canonical(raw: bytes, value: JsonObject) -> bool:
    """``raw`` is exactly what orjson writes for ``value`` (compact, no escapes, every number in
    orjson's spelling), so encoding a changed ``value`` whole gives the splice's bytes. Checked
    only up to ``_CANONICAL_CHECK_MAX``: bigger frames are spliced, which costs about the same."""
    if len(raw) > _CANONICAL_CHECK_MAX:
        return False
    try:
        return orjson.dumps(value) == raw
    except TypeError:  # an integer beyond 64 bits or a lone surrogate: not canonical
        return False


def _join_array(
    raw: bytes,
    span: tuple[int, int],
    spans: list[tuple[int, int]],
    kept: list[bytes | None],
) -> bytes:
    """The batch ``raw`` (the array at ``raw[span[0]:span[1]]``, its entries at ``spans``) with
    entry ``i`` replaced by ``kept[i]`` (removed when ``None``); the separators and whitespace
    between surviving neighbours are the original bytes."""
    start, end = span
    out = [raw[start : spans[0][0]]]
    prev = -1
    for i, piece in enumerate(kept):
        if piece is None:
            continue
        if prev >= 0:
            out.append(raw[spans[prev][1] : spans[i][0]] if prev == i - 1 else b",")
        out.append(piece)
        prev = i
    out.append(raw[spans[-1][1] : end])
    return b"".join(out)


def _agent_needs_parse(raw: bytes) -> bool:
    """Whether the tracker must see an agent frame that no middleware wants.

    Requests and responses carry a top-level ``"id"``; the bulk of agent traffic is
    ``session/update`` notifications, which have none. The bytes ``"id"`` (quote, i, d, quote)
    cannot occur inside a JSON string (its quotes would be escaped), so a frame without them
    has no ``id`` key at any depth and is forwarded unparsed. A frame with them is parsed (a
    nested ``id`` costs a parse, never a wrong answer). Not caught: an ``id`` key written with a
    ``\\u`` escape; missing one only leaves an entry in ``pending_agent_requests`` or (for a
    response) an extra -32603 answer from ``abort_pending``, which a client ignores. The block
    fast path (``Connection._block``) uses the same test, so both paths agree frame for frame.
    """
    return raw.find(b'"id"') >= 0


def _client_needs_parse(raw: bytes) -> bool:
    """Client requests and responses carry ``"id"``; notifications (no ``"id"``) are skipped.

    Client traffic is small, so this one is exact: a full scan, and escaped frames are parsed.
    """
    return raw.find(b'"id"') >= 0 or _has_escape(raw)


def _has_any(raw: bytes, escapes: tuple[bytes, ...]) -> bool:
    """One of ``escapes`` occurs in ``raw`` (``escapes`` all start with a backslash)."""
    p = raw.find(b"\\")  # memchr: most frames have no backslash at all
    return p >= 0 and any(raw.find(e, p) >= 0 for e in escapes)


_ESCAPES = (b"\\u", b"\\/")


def _has_escape(raw: bytes) -> bool:
    """A ``\\u`` or ``\\/`` escape (the ones ``Chain.interested`` treats as hiding a needle)."""
    p = raw.find(b"\\")  # memchr: most frames have no backslash at all
    return p >= 0 and (raw.find(b"\\u", p) >= 0 or raw.find(b"\\/", p) >= 0)


def _json_text(value: object) -> str:
    return (_encode(value) or b"?").decode("utf-8", "replace")  # type: ignore[arg-type]


def _unencodable(name: str) -> MiddlewareFailure:
    return MiddlewareFailure(
        name, "TypeError: the middleware's message is not JSON-serializable", False
    )


# The notes live in ``acp_proxy.wire.notes``; importing them from here keeps working.
__all__ = [
    "DEFAULT_MAX_PENDING",
    "EMPTY",
    "INVALID_REQUEST",
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
    "error_frame_bytes",
    "parse_cost",
]
