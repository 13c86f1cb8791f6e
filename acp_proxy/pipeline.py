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
   client's, keyed by id (str, int, float or null); a response removes its id. ``abort_pending``
   answers the client's open requests when the agent dies (issue 3, "The agent process").
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

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import TypeAlias

import orjson

from acp_proxy.chain import (
    INTERNAL_ERROR,
    Chain,
    Direction,
    MessageContext,
    MiddlewareFailure,
    Outcome,
    error_response,
    needle_escapes,
)
from acp_proxy.coalesce import OutFrame
from acp_proxy.config import NonJsonPolicy
from acp_proxy.framing import (
    HEAD_BYTES,
    Block,
    Line,
    Oversize,
    read_request_id,
    read_response_id,
)
from acp_proxy.jsontypes import JsonObject, JsonValue

INVALID_REQUEST = -32600

# How much of a diverted non-JSON line a note carries for the log.
SAMPLE_BYTES = 200

# Kinds of non-JSON agent output (``NonJson.kind``).
KIND_ANSI = "ansi-escape"  # contains a terminal escape sequence (ESC, 0x1b)
KIND_TEXT = "text"  # plain text: a banner, a log line
KIND_INVALID_JSON = "invalid-json"  # starts like a JSON object/array but does not parse
KIND_JSON_SCALAR = "json-scalar"  # valid JSON, but a string/number/literal, not a message

_A2C = Direction.AGENT_TO_CLIENT
_C2A = Direction.CLIENT_TO_AGENT
_OPENERS = (ord("{"), ord("["))  # the first byte of every JSON-RPC frame (object or batch)

# A leading run of terminal escape sequences (CSI, OSC, two-byte ESC) and whitespace.
_ANSI_PREFIX = re.compile(
    rb"(?:\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|[ \t\r])+"
)


# --- Notes: what the shell logs ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VersionNegotiated:
    """The ``initialize`` response fixed the connection's protocol version."""

    version: int


@dataclass(frozen=True, slots=True)
class NonJson:
    """An agent stdout line that is not a JSON-RPC message (or an escape prefix before one)."""

    kind: str  # KIND_ANSI, KIND_TEXT, KIND_INVALID_JSON or KIND_JSON_SCALAR
    size: int  # bytes of the diverted (or forwarded) part
    sample: bytes  # its first SAMPLE_BYTES bytes
    first_of_kind: bool  # the first line of this kind on this connection: warn; later ones: count
    forwarded: bool = False  # NonJsonPolicy.FORWARD: it was forwarded, not diverted


@dataclass(frozen=True, slots=True)
class OversizeFrame:
    """A frame over the size limit was discarded."""

    size: int
    request_id: JsonValue  # the id of the request (or of the answered request); None if unknown
    replied: bool = False  # the sender got a JSON-RPC error for ``request_id``
    answered: bool = False  # it was a response: the receiver got an error for ``request_id``
    limit: int = 0


@dataclass(frozen=True, slots=True)
class MiddlewareFailed:
    """A middleware raised; the chain isolated it (fail-open or fail-closed)."""

    failure: MiddlewareFailure


@dataclass(frozen=True, slots=True)
class Rewritten:
    """Middleware changed a message (``method`` is ``None`` for a response); with
    ``inspect_all`` only (it feeds debug logging; ``stats.rewritten`` always counts)."""

    method: str | None
    changed_by: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Dropped:
    """A middleware dropped a message (or answered it with a ``Reply``)."""

    method: str | None
    dropped_by: str


@dataclass(frozen=True, slots=True)
class FrameInfo:
    """Per-message debug information (only with ``inspect_all``); one per batch entry."""

    direction: Direction
    method: str | None
    id: JsonValue  # None also when the message has no id
    update_kind: str | None  # ``params.update.sessionUpdate`` of a ``session/update``
    size: int  # bytes of the frame it came in
    changed_by: tuple[str, ...]


Note: TypeAlias = (
    VersionNegotiated | NonJson | OversizeFrame | MiddlewareFailed | Rewritten | Dropped | FrameInfo
)


@dataclass(frozen=True, slots=True)
class Result:
    """What to do with one input frame."""

    forward: tuple[OutFrame, ...] = ()  # toward the other side, in order
    reply: tuple[OutFrame, ...] = ()  # back to the sender, in order
    notes: tuple[Note, ...] = ()  # for the shell to log


EMPTY = Result()


@dataclass(slots=True)
class PipelineStats:
    """Counters for the exit summary (the shell reads them; only this module writes them)."""

    client_to_agent_in: int = 0  # frames (and oversize lines) received from the client
    client_to_agent_out: int = 0  # frames forwarded to the agent
    agent_to_client_in: int = 0
    agent_to_client_out: int = 0
    rewritten: int = 0  # messages changed by middleware
    dropped: int = 0  # messages dropped or answered by middleware
    diverted: int = 0  # non-JSON agent lines (or prefixes) sent to the log
    oversize: int = 0  # frames over the size limit
    middleware_failures: int = 0
    replies: int = 0  # frames the proxy sent back to a sender
    errors_replied: int = 0  # JSON-RPC error responses the proxy generated (replies and aborts)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# Error responses built per step when answering requests left in flight (``abort_pending``).
ABORT_CHUNK = 1000


def _is_id(value: object) -> bool:
    # ACP digest §8.1: a RequestId is a string, an integer or null (JSON-RPC: also a number).
    return value is None or type(value) in (str, int, float)


def _encode(value: JsonObject | list[JsonValue]) -> bytes | None:
    """Encode a changed message once; ``None`` when it is not JSON-serializable."""
    try:
        return orjson.dumps(value)
    except TypeError:
        pass
    try:  # integers beyond 64 bits (e.g. an id echoed from scan_head): the stdlib keeps them
        return json.dumps(
            value, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
    except (TypeError, ValueError):
        return None


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
        "_bctx_a2c",
        "_bctx_c2a",
        "_chain_on",
        "_ctx_a2c",
        "_ctx_c2a",
        "_escapes",
        "_has_links",
        "_init_ids",
        "_inspect_all",
        "_kinds_seen",
        "_link_needles",
        "_non_json",
        "_pending_agent",
        "_pending_client",
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
    ) -> None:
        self.chain = chain
        self.version: int | None = None
        self.stats = PipelineStats()
        self._non_json = non_json
        self._inspect_all = inspect_all
        self._has_links = len(chain) > 0
        self._chain_on = False  # links exist and the version is known: run the chain
        self._link_needles = tuple(_needles_of(link.middleware) for link in chain.links)
        self._escapes = needle_escapes(self._link_needles)  # same rule as Chain.interested
        # id -> method, in arrival order (abort_pending answers in that order).
        self._pending_client: dict[JsonValue, str] = {}
        self._pending_agent: dict[JsonValue, str] = {}
        self._init_ids: set[JsonValue] = set()  # ids of the client's ``initialize`` requests
        self._kinds_seen: set[str] = set()
        self._set_contexts()

    # --- public API ---------------------------------------------------------------------------

    @property
    def pending_client_requests(self) -> int:
        """Client requests forwarded to the agent and not answered yet."""
        return len(self._pending_client)

    @property
    def pending_agent_requests(self) -> int:
        """Agent requests forwarded to the client and not answered yet."""
        return len(self._pending_agent)

    def handle(self, direction: Direction, event: Line | Oversize) -> Result:
        """Process one event read from the side ``direction`` starts at."""
        if type(event) is Line:
            if direction is _A2C:
                return self._agent_line(event.raw)
            return self._client_line(event.raw)
        assert isinstance(event, Oversize)
        return self._oversize(direction, event)

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
        the wire, at a fraction of the per-frame cost. Such a frame is opaque to the outbound
        queue's coalescing (a barrier), so join only when nothing is waiting in that queue (no
        backpressure, nothing to merge with). Stats still count every frame.
        """
        forward: list[OutFrame] = []
        reply: list[OutFrame] = []
        notes: list[Note] = []
        run: list[bytes] = []  # consecutive untouched, unparsed frames
        a2c = direction is _A2C
        fast = not self._inspect_all
        for event in events:
            if type(event) is Block:
                if run:
                    self._flush_run(direction, run, forward, join)
                    run = []
                acc = _Acc()
                acc.forward, acc.reply, acc.notes = forward, reply, notes
                self._block(direction, event, acc, join=join)
                continue
            if fast and type(event) is Line:
                raw = event.raw
                if a2c:
                    if (
                        raw
                        and raw[0] in _OPENERS
                        and not _agent_needs_parse(raw)
                        and (not self._chain_on or self._interested(raw) is None)
                    ):
                        run.append(raw)
                        continue
                elif (
                    not self._chain_on or self._interested(raw) is None
                ) and not _client_needs_parse(raw):
                    run.append(raw)
                    continue
            if run:
                self._flush_run(direction, run, forward, join)
                run = []
            assert not isinstance(event, Block)
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
        specials = None if self._inspect_all or waiting else self._specials(raw)
        if specials is None:
            acc.extend(self.handle_many(direction, block.lines(), join=join))
            return
        pos = 0
        end = len(raw)
        for hit in specials:
            if hit < pos:
                continue  # another hit on a line already handled
            start = raw.rfind(b"\n", 0, hit) + 1
            stop = raw.find(b"\n", hit)
            if stop < 0:
                stop = end
            if start > pos:
                self._plain_run(direction, raw[pos : start - 1], acc, join=join)
            acc.extend(self.handle_many(direction, [Line(raw[start:stop])], join=join))
            pos = stop + 1
        if pos < end:
            self._plain_run(direction, raw[pos:], acc, join=join)

    def _specials(self, raw: bytes) -> list[int] | None:
        """Sorted offsets of one hit per line needing the per-line path; None: every line."""
        needles: list[bytes] = [b'"id"']
        if self._chain_on:
            for link_needles in self._link_needles:
                if link_needles is None:
                    return None
                needles.extend(link_needles)
            needles.extend(self._escapes)
        hits: list[int] = []
        find = raw.find
        for needle in needles:
            i = find(needle)
            while i >= 0:
                hits.append(i)
                eol = find(b"\n", i)
                if eol < 0:
                    break
                i = find(needle, eol + 1)
        hits.sort()
        return hits

    def _plain_run(self, direction: Direction, run: bytes, acc: _Acc, *, join: bool) -> None:
        """Lines no middleware and no tracker needs: forward them whole if each looks like JSON."""
        newlines = run.count(b"\n")
        objects = run.count(b"\n{")  # batches (``[``) are rare: count them only when needed
        if (
            run
            and run[0] in _OPENERS
            and (newlines == objects or newlines == objects + run.count(b"\n["))
        ):
            lines = run.split(b"\n") if not join and newlines else [run]
            if join:
                n = newlines + 1
                if direction is _A2C:
                    self.stats.agent_to_client_in += n
                    self.stats.agent_to_client_out += n
                else:
                    self.stats.client_to_agent_in += n
                    self.stats.client_to_agent_out += n
                acc.forward.append(OutFrame(run, None, self.version))
            else:
                self._flush_run(direction, lines, acc.forward, False)
            return
        # A blank line, whitespace before a frame, or non-JSON output: the per-line path.
        acc.extend(self.handle_many(direction, Block(run, newlines + 1).lines(), join=join))

    def _flush_run(
        self, direction: Direction, run: list[bytes], forward: list[OutFrame], join: bool
    ) -> None:
        n = len(run)
        if direction is _A2C:
            self.stats.agent_to_client_in += n
            self.stats.agent_to_client_out += n
        else:
            self.stats.client_to_agent_in += n
            self.stats.client_to_agent_out += n
        version = self.version
        if join:
            forward.append(OutFrame(b"\n".join(run) if n > 1 else run[0], None, version))
        else:
            forward.extend([OutFrame(raw, None, version) for raw in run])

    def abort_pending(self, message: str) -> Iterator[tuple[OutFrame, ...]]:
        """One -32603 error response (``message``) per client request still awaiting the agent.

        For when the agent is gone (issue 3: "every client request still awaiting a response gets
        a JSON-RPC error response (code -32603, message naming the exit status)"). The requests
        are no longer tracked from the call on; their responses are built lazily, in chunks of
        ``ABORT_CHUNK`` in arrival order, as the caller iterates (issue 10.2: 400,000 responses
        built at once took 1.9 GB), so the shell can write each chunk before the next is made.
        """
        pending, self._pending_client = self._pending_client, {}
        return self._errors_for(pending, message)

    def abort_agent_requests(self, message: str) -> Iterator[tuple[OutFrame, ...]]:
        """One -32603 error response per agent request still awaiting the client (client gone),
        lazily in chunks like ``abort_pending``."""
        pending, self._pending_agent = self._pending_agent, {}
        return self._errors_for(pending, message)

    # --- agent -> client ----------------------------------------------------------------------

    def _agent_line(self, raw: bytes) -> Result:
        self.stats.agent_to_client_in += 1
        if not raw:
            return EMPTY
        first = raw[0]
        if first not in _OPENERS:
            return self._agent_odd(raw)
        interested = self._interested(raw) if self._chain_on else None
        if interested is None and not self._inspect_all and not _agent_needs_parse(raw):
            # Nothing may act on this frame and the tracker does not need it: forward its bytes
            # unparsed.
            self.stats.agent_to_client_out += 1
            return Result((OutFrame(raw, None, self.version),))
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return self._agent_non_json(raw, KIND_INVALID_JSON, ())
        return self._parsed(_A2C, raw, parsed, interested, ())

    def _agent_odd(self, raw: bytes) -> Result:
        """A line from the agent that does not start with ``{`` or ``[``."""
        stripped = raw.lstrip()
        if stripped[:1] in (b"{", b"["):  # JSON after leading whitespace: an ordinary frame
            interested = self._interested(raw)
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return self._agent_non_json(raw, KIND_INVALID_JSON, ())
            return self._parsed(_A2C, raw, parsed, interested, ())
        if b"\x1b" in raw:
            if self._non_json is NonJsonPolicy.LOG:
                match = _ANSI_PREFIX.match(raw)
                rest = raw[match.end() :] if match else b""
                if rest[:1] in (b"{", b"["):
                    try:
                        parsed = orjson.loads(rest)
                    except orjson.JSONDecodeError:
                        parsed = None
                    if isinstance(parsed, (dict, list)):
                        # An escape sequence before the JSON: divert it, keep the message.
                        prefix = raw[: len(raw) - len(rest)]
                        note = self._non_json_note(KIND_ANSI, prefix, forwarded=False)
                        self.stats.diverted += 1
                        return self._parsed(_A2C, rest, parsed, self._interested(rest), (note,))
            return self._agent_non_json(raw, KIND_ANSI, ())
        try:
            orjson.loads(raw)
        except orjson.JSONDecodeError:
            return self._agent_non_json(raw, KIND_TEXT, ())
        return self._agent_non_json(raw, KIND_JSON_SCALAR, ())

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

    def _client_line(self, raw: bytes) -> Result:
        self.stats.client_to_agent_in += 1
        interested = self._interested(raw) if self._chain_on else None
        if interested is None and not self._inspect_all and not _client_needs_parse(raw):
            self.stats.client_to_agent_out += 1
            return Result((OutFrame(raw, None, self.version),))
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            parsed = None  # malformed: forwarded as is, the agent answers it (-32700)
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

    def _parsed(
        self,
        direction: Direction,
        raw: bytes,
        parsed: object,
        interested: tuple[bool, ...] | None,
        notes: tuple[Note, ...],
    ) -> Result:
        """A frame that was parsed (``parsed``; ``None`` when it did not parse, client side)."""
        if isinstance(parsed, dict):
            return self._single(direction, raw, parsed, interested, notes)
        if isinstance(parsed, list) and parsed:
            return self._batch(direction, raw, parsed, interested, notes)
        if direction is _A2C and not isinstance(parsed, list):
            return self._agent_non_json(raw, KIND_JSON_SCALAR, notes)
        # Client garbage, or an empty array from either side: forwarded, the peer answers it.
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
        if interested is None:  # parsed only for tracking / inspection
            if "id" in message or self._inspect_all:
                acc_notes = list(notes)
                self._track(direction, message, acc_notes)
                if self._inspect_all:
                    acc_notes.append(self._info(direction, message, len(raw), ()))
                notes = tuple(acc_notes)
            self._count_out(direction, 1)
            return Result((OutFrame(raw, message, version),), (), notes)
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
                data = orjson.dumps(out)
            except TypeError:
                data = None
            if data is not None:
                self.stats.rewritten += 1
                self._count_out(direction, 1)
                if "id" in out:
                    acc_notes = list(notes)
                    self._track(direction, out, acc_notes)
                    notes = tuple(acc_notes)
                # (No ``Rewritten`` note: only debug logging shows it, and debug means
                # ``inspect_all``, which takes the general path below.)
                return Result((OutFrame(data, out, version),), (), notes)
        acc = _Acc()
        acc.notes.extend(notes)
        self._report(message, outcome, acc.notes)
        encoded = self._encode_outcome(outcome, acc.notes) if outcome.changed else None
        if encoded is None:  # unchanged (or unencodable: fail open)
            acc.forward.append(OutFrame(raw, message, version))
            self._track(direction, message, acc.notes)
        else:
            for out, data in zip(outcome.messages, encoded, strict=True):
                acc.forward.append(OutFrame(data, out, version))
                self._track(direction, out, acc.notes)
        if self._inspect_all:
            acc.notes.append(self._info(direction, message, len(raw), outcome.changed_by))
        for reply in outcome.replies:
            acc.reply.append(self._reply_frame(reply))
        self._count_out(direction, len(acc.forward))
        return acc.result()

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
        if interested is None:
            for entry in entries:
                if isinstance(entry, dict):
                    self._track(direction, entry, acc.notes)
                    if self._inspect_all:
                        acc.notes.append(self._info(direction, entry, len(raw), ()))
            acc.forward.append(OutFrame(raw, None, version))
            self._count_out(direction, 1)
            return acc.result()
        ctx = self._bctx_a2c if direction is _A2C else self._bctx_c2a
        kept: list[JsonValue] = []
        follow: list[OutFrame] = []
        replies: list[JsonObject] = []
        changed = False
        for entry in entries:
            if not isinstance(entry, dict):  # invalid entry: the receiver answers it (-32600)
                kept.append(entry)
                continue
            outcome = self.chain.run(entry, ctx, interested)
            self._report(entry, outcome, acc.notes)
            replies.extend(outcome.replies)
            if self._inspect_all:
                acc.notes.append(self._info(direction, entry, len(raw), outcome.changed_by))
            encoded = self._encode_outcome(outcome, acc.notes) if outcome.changed else None
            if encoded is None:  # unchanged (or unencodable: fail open)
                kept.append(entry)
                self._track(direction, entry, acc.notes)
                continue
            changed = True
            for i, (out, data) in enumerate(zip(outcome.messages, encoded, strict=True)):
                self._track(direction, out, acc.notes)
                if i == 0:
                    kept.append(out)  # takes the entry's place inside the array
                else:
                    follow.append(OutFrame(data, out, version))  # never batched
        if not changed:
            acc.forward.append(OutFrame(raw, None, version))
        elif kept:
            # Every entry is encodable (checked per outcome), so this cannot fail.
            acc.forward.append(OutFrame(_encode(kept) or raw, None, version))
        acc.forward.extend(follow)
        if replies:
            # JSON-RPC: the answers to a batch are one array (ACP digest §1.2).
            self._add_replies(acc, replies, as_batch=True)
        self._count_out(direction, len(acc.forward))
        return acc.result()

    def _encode_outcome(self, outcome: Outcome, notes: list[Note]) -> list[bytes] | None:
        """The encoding of each message of a changed outcome; ``None`` (and a failure note)
        when one is not JSON-serializable, in which case the original goes on (fail-open)."""
        encoded = []
        for message in outcome.messages:
            data = _encode(message)
            if data is None:
                culprit = outcome.changed_by[-1] if outcome.changed_by else "middleware"
                notes.append(MiddlewareFailed(_unencodable(culprit)))
                self.stats.middleware_failures += 1
                return None
            encoded.append(data)
        return encoded

    def _reply_frame(self, message: JsonObject) -> OutFrame:
        encoded = _encode(message)
        if encoded is None:  # pragma: no cover - chain replies are JSON (error_response)
            encoded = orjson.dumps(error_response(None, INTERNAL_ERROR, "acp-proxy: bad reply"))
        self.stats.replies += 1
        if "error" in message:
            self.stats.errors_replied += 1
        return OutFrame(encoded, message, self.version)

    def _add_replies(self, acc: _Acc, replies: list[JsonObject], *, as_batch: bool) -> None:
        if not as_batch:
            acc.reply.extend(self._reply_frame(r) for r in replies)
            return
        encoded = _encode(list(replies))
        if encoded is None:  # pragma: no cover - chain replies are JSON
            acc.reply.extend(self._reply_frame(r) for r in replies)
            return
        self.stats.replies += 1
        self.stats.errors_replied += sum(1 for r in replies if "error" in r)
        acc.reply.append(OutFrame(encoded, None, self.version))

    def _report(self, message: JsonObject, outcome: Outcome, notes: list[Note]) -> None:
        for failure in outcome.failures:
            notes.append(MiddlewareFailed(failure))
        self.stats.middleware_failures += len(outcome.failures)
        if outcome.dropped_by is not None:
            notes.append(Dropped(_method_of(message), outcome.dropped_by))
            self.stats.dropped += 1
        if outcome.changed and outcome.changed_by and outcome.messages:
            if self._inspect_all:  # a debug-log note: built only when debug logging is on
                notes.append(Rewritten(_method_of(message), outcome.changed_by))
            self.stats.rewritten += 1

    def _info(
        self, direction: Direction, message: JsonObject, size: int, changed_by: tuple[str, ...]
    ) -> FrameInfo:
        rid = message.get("id")
        return FrameInfo(
            direction,
            _method_of(message),
            rid if _is_id(rid) else None,
            _update_kind(message),
            size,
            changed_by,
        )

    # --- tracking -----------------------------------------------------------------------------

    def _track(self, direction: Direction, message: JsonObject, notes: list[Note]) -> None:
        """Update the request tables for a message that is being forwarded."""
        if "id" not in message:
            return  # a notification
        rid = message["id"]
        if not _is_id(rid):
            return  # invalid request id: the receiver answers it; nothing to track
        if "method" in message:
            method = message["method"]
            if not isinstance(method, str):
                return
            if direction is _C2A:
                self._pending_client[rid] = method
                if method == "initialize":
                    self._init_ids.add(rid)
            else:
                self._pending_agent[rid] = method
            return
        if "result" not in message and "error" not in message:
            return  # not a response either
        if direction is _A2C:
            self._pending_client.pop(rid, None)
            if rid in self._init_ids:
                self._init_ids.discard(rid)
                self._negotiate(message, notes)
        else:
            self._pending_agent.pop(rid, None)

    def _negotiate(self, response: JsonObject, notes: list[Note]) -> None:
        # ACP digest §2.3: the negotiated version is ``result.protocolVersion`` of the
        # ``initialize`` response, a JSON integer (an error response negotiates nothing).
        result = response.get("result")
        version = result.get("protocolVersion") if isinstance(result, dict) else None
        if type(version) is not int:
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

    def _errors_for(
        self, pending: dict[JsonValue, str], message: str
    ) -> Iterator[tuple[OutFrame, ...]]:
        version = self.version
        stats = self.stats
        chunk: list[OutFrame] = []
        for rid in pending:
            # Only the bytes are kept (no decoded message): an error response is a barrier for
            # the outbound queue, which never needs to parse it.
            chunk.append(
                OutFrame(
                    _encode(error_response(rid, INTERNAL_ERROR, message)) or b"", None, version
                )
            )
            if len(chunk) == ABORT_CHUNK:
                stats.errors_replied += len(chunk)
                yield tuple(chunk)
                chunk = []
        if chunk:
            stats.errors_replied += len(chunk)
            yield tuple(chunk)

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
            response = error_response(
                rid,
                INVALID_REQUEST,
                f"acp-proxy: message of {event.size} bytes exceeds {limit}; not forwarded",
            )
            note = OversizeFrame(event.size, rid, replied=True, limit=event.limit)
            return Result((), (self._reply_frame(response),), (note,))
        is_response, rid = read_response_id(head)
        # The sender of a response is the receiver of its request: the request's sender is on the
        # other side, and it only gets an error if we know it is waiting for this id.
        pending = self._pending_client if direction is _A2C else self._pending_agent
        if is_response and rid in pending:
            del pending[rid]
            response = error_response(
                rid,
                INTERNAL_ERROR,
                f"acp-proxy: the response was {event.size} bytes, over {limit}; dropped",
            )
            stats.errors_replied += 1
            self._count_out(direction, 1)
            note = OversizeFrame(event.size, rid, answered=True, limit=event.limit)
            frame = OutFrame(_encode(response) or b"", response, self.version)
            return Result((frame,), (), (note,))
        return Result((), (), (OversizeFrame(event.size, None, limit=event.limit),))


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


def _has_escape(raw: bytes) -> bool:
    """A ``\\u`` or ``\\/`` escape (the ones ``Chain.interested`` treats as hiding a needle)."""
    p = raw.find(b"\\")  # memchr: most frames have no backslash at all
    return p >= 0 and (raw.find(b"\\u", p) >= 0 or raw.find(b"\\/", p) >= 0)


def _unencodable(name: str) -> MiddlewareFailure:
    return MiddlewareFailure(
        name, "TypeError: the middleware's message is not JSON-serializable", False
    )
