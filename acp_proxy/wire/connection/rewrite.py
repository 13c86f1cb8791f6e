"""The rewrite engine: one parsed message through the middleware chain, and the bytes it leaves as.

Contract: owns what happens to a message some middleware may act on: running the chain, the
fused v2 annotation path (one fusable middleware answers a v2 update without building a
message), and encoding the outcome losslessly (only the members that changed are encoded; the
rest keeps the frame's bytes, ``rawsplice.splice``). Never re-encodes bytes nothing changed, never
does I/O; request tracking and counters of frames in and out stay with the connection that
calls it: the engine reads the connection's ``state.ConnState`` and updates its request tables
(``tables.Requests``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from acp_proxy.base.jsontypes import OMITTED, JsonObject, JsonValue
from acp_proxy.wire.chain import (
    Direction,
    MiddlewareFailure,
    Outcome,
)
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.connstate import Acc, ConnState
from acp_proxy.wire.connection.observe import frame_info, method_of, update_kind
from acp_proxy.wire.connection.tables import Requests
from acp_proxy.wire.errors import INTERNAL_ERROR, error_object
from acp_proxy.wire.notes import (
    Dropped,
    FrameInfo,
    MiddlewareFailed,
    Note,
    Result,
    Rewritten,
    SkippedV1,
)
from acp_proxy.wire.raw import block_scan, rawjson, rawsplice

_UPDATE_PATH = ("params", "update")
_PARAMS_PATH = ("params",)
# With the C accelerator the fused path splices (``rawsplice.splice_member`` locates the member
# in C); without it, it encodes canonical frames whole (see ``Rewriter.fused_bytes``).
SPLICE_IN_C = getattr(block_scan.ACCELERATOR, "member_span", None)
# Frames up to this size that are already exactly what orjson writes are re-encoded whole (one
# C call); bigger ones are spliced, which costs about the same and skips the canonical check.
_CANONICAL_CHECK_MAX = 64 * 1024
_A2C = Direction.AGENT_TO_CLIENT


def encode(value: JsonValue) -> bytes | None:
    """Encode a value the proxy built; ``None`` when it is not JSON-serializable."""
    try:
        return rawjson.encode_value(value)
    except rawjson.Unencodable:
        return None


def _no_fused(message: JsonObject, direction: Direction) -> None:
    """No middleware answers v2 upserts on the fused path: the general path runs."""
    return None


class Rewriter:
    """The chain and the fused path of one connection (``state``, ``requests``), applied to
    parsed messages."""

    __slots__ = ("_fused", "_requests", "_state", "chain", "stats")

    def __init__(self, state: ConnState, requests: Requests) -> None:
        self._state = state
        self._requests = requests
        self.chain = state.chain
        self.stats = state.stats
        # One middleware that can answer v2 upserts without building a message (the rules
        # middleware's ``fused_v2``, when its rules allow it): the annotation hot path. Whether
        # to take it is the caller's decision (``state.fused is not None``); without one,
        # ``fused_bytes`` answers "take the general path".
        fused = state.fused
        self._fused: Callable[[JsonObject, Direction], Any] = (
            fused if fused is not None else _no_fused
        )

    def single(
        self,
        direction: Direction,
        raw: bytes,
        message: JsonObject,
        interested: tuple[bool, ...],
        notes: tuple[Note, ...],
    ) -> Result:
        """A message on its own (not in a batch) that some link may act on; its request, if it
        is one, has room in its table (the caller checked)."""
        state = self._state
        requests = self._requests
        version = state.version
        inspect_all = state.inspect_all
        if state.fused is not None and version == 2 and "id" not in message and not inspect_all:
            if interested == state.fused_interest:
                fused = self.fused_frame(direction, raw, message, notes)
                if fused is not None:
                    return fused
            elif True in interested:
                beside = self.beside_fused(direction, raw, message, interested, notes)
                if beside is not None:
                    return beside
        ctx = state.ctx_a2c if direction is _A2C else state.ctx_c2a
        outcome = self.chain.run(message, ctx, interested)
        if (
            outcome.changed
            and len(outcome.messages) == 1
            and not outcome.failures
            and not outcome.replies
            and not inspect_all
        ):
            # The annotation hot path: one message in, one changed message out.
            out = outcome.messages[0]
            try:
                data = rewrite_bytes(raw, message, out)
            except (rawjson.Unencodable, rawjson.Unparseable):
                data = None
            if data is not None:
                self.stats.rewritten += 1
                state.count_out(direction, 1)
                if "id" in out:
                    acc_notes = list(notes)
                    requests.track(direction, out, acc_notes, raw if out is message else None)
                    notes = tuple(acc_notes)
                # (No ``Rewritten`` note: only debug logging shows it, and debug means
                # ``inspect_all``, which takes the general path below. Watching, who changed
                # the frame is said.)
                if state.watching:
                    info = self.info(direction, raw, message, outcome)
                    notes = (*notes, info)
                return Result((OutFrame(data, out, version),), (), notes)
        acc = Acc()
        acc.notes.extend(notes)
        self.report(message, outcome, acc.notes, inspect_all)
        encoded = self.encode_outcome(raw, message, outcome, acc.notes) if outcome.changed else None
        if encoded is None:  # unchanged (or unencodable: fail open)
            acc.forward.append(OutFrame(raw, message, version))
            requests.track(direction, message, acc.notes, raw)
        else:
            for out, data in zip(outcome.messages, encoded, strict=True):
                acc.forward.append(OutFrame(data, out, version))
                requests.track(direction, out, acc.notes, None)
        if inspect_all or state.watching:
            acc.notes.append(self.info(direction, raw, message, outcome))
        for reply in outcome.replies:
            # A response keeps the request's id bytes; a notification is encoded on its own.
            acc.reply.append(
                self.reply_frame(reply, raw, message) if "id" in reply else self.reply_frame(reply)
            )
        state.count_out(direction, len(acc.forward))
        return acc.result()

    def info(
        self, direction: Direction, raw: bytes, message: JsonObject, outcome: Outcome
    ) -> FrameInfo:
        """What observers are told of a message the chain ran on (``FrameInfo``)."""
        changed_by = outcome.changed_by
        return frame_info(
            direction, message, len(raw), changed_by, self._requests.answers, marks=outcome.marks
        )

    # --- the fused v2 path --------------------------------------------------------------------

    def beside_fused(
        self,
        direction: Direction,
        raw: bytes,
        message: JsonObject,
        interested: tuple[bool, ...],
        notes: tuple[Note, ...],
        *,
        side: tuple[bool, ...] | None = None,
    ) -> Result | None:
        """A v2 notification that links beside the fusable one want too: they only read a
        notification (``wire.chain.Concerns``), so they run first, on their own, and the fused
        path then does what the chain would have done (the policy reads a tool call update
        the annotation rule marks). A failure of theirs is reported and the message goes on,
        as in the chain (fail-open). ``None``: one of them changed it after all (or dropped it,
        failing closed): the general path starts over."""
        state = self._state
        fused_interest = state.fused_interest
        if side is None:  # ``interested`` without the fused path's link
            side = tuple(a and not f for a, f in zip(interested, fused_interest, strict=True))
        ctx = state.ctx_a2c if direction is _A2C else state.ctx_c2a
        before = self.chain.run(message, ctx, side)
        if before.changed:
            return None
        if before.failures:
            acc = list(notes)
            self.report(message, before, acc, False)
            notes = tuple(acc)
        if state.watching:  # (as the per-line path says what the chain ran on; no fused path)
            notes = (*notes, self.info(direction, raw, message, before))
        replies = tuple(self.reply_frame(r) for r in before.replies)
        data = None
        if side != interested:  # the fusable link is interested too
            data = self.fused_bytes(direction, raw, message)
            if data is None:  # the fused path declines: the chain, that link alone
                after = self.single(direction, raw, message, fused_interest, notes)
                return Result(after.forward, (*after.reply, *replies), after.notes)
        state.count_out(direction, 1)
        frame = OutFrame(raw if data is None else data, message, state.version)
        return Result((frame,), replies, notes)

    def read_lane(self, direction: Direction, raw: bytes, max_parse: int) -> Result | None:
        """The read lane of a block (``acp_proxy.wire.connection.blocks``): ``raw``, a line of a
        block
        that starts with ``{"`` and holds no ``"id"``, that only links that read notifications
        (``wire.chain.Concerns``) and the fused path may want: handled by ``beside_fused``
        without the per-line path around it (the same steps the fused lane leaves out).
        ``None``: not such a frame (not an object, an ``id``, a link that may change it, the
        fused path on a v1 connection): the caller takes the per-line path."""
        if len(raw) * 33 > max_parse:
            return None
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if type(message) is not dict or "id" in message:
            return None
        state = self._state
        interested = state.interested(raw)
        links = state.links
        lane = links.read_v2 if state.fused is not None and state.version == 2 else links.read_v1
        side = None if interested is None else lane.get(interested)
        if interested is None or side is None:  # nobody after all, or a link that may change it
            return None
        done = self.beside_fused(direction, raw, message, interested, (), side=side)
        if done is not None:
            stats = self.stats
            if direction is _A2C:
                stats.agent_to_client_in += 1
            else:
                stats.client_to_agent_in += 1
        return done

    def lane(self, direction: Direction, raw: bytes, max_parse: int) -> OutFrame | None:
        """The fused lane of a block (``acp_proxy.wire.connection.blocks``): ``raw``, a line of a
        block
        that starts with ``{"`` and holds no ``"id"`` nor a needle of another link
        (``LinkInterest.lane_blockers``), on a v2 connection with one fusable middleware,
        handled as the per-line path would (``Connection._single``,
        ``single``, ``fused_frame``) with its steps that cannot change the outcome here left
        out: the prefilter (without a needle of its rules, ``fused_v2`` leaves a message as it
        is, which is what the per-line path does without parsing it), the parse budget check
        (the frame is far below it), the tracker and the request bound (a notification).
        ``None``: not such a frame after all (not parseable by orjson, not an object, an ``id``
        behind an escape, or a case ``fused_v2`` leaves to the general path): the caller takes
        the per-line path, which parses it again."""
        if len(raw) * 33 > max_parse:
            return None
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if type(message) is not dict or "id" in message:
            return None
        data = self.fused_bytes(direction, raw, message)
        if data is None:
            return None
        stats = self.stats  # ``ConnState.count_passed(direction, 1)`` inline: once per frame
        if direction is _A2C:
            stats.agent_to_client_in += 1
            stats.agent_to_client_out += 1
        else:
            stats.client_to_agent_in += 1
            stats.client_to_agent_out += 1
        return OutFrame(data, message, self._state.version)

    def fused_frame(
        self, direction: Direction, raw: bytes, message: JsonObject, notes: tuple[Note, ...]
    ) -> Result | None:
        """``fused_bytes`` as the per-line path's ``Result``; ``None``: take the general path
        (the message is as it was)."""
        data = self.fused_bytes(direction, raw, message)
        if data is None:
            return None
        state = self._state
        state.count_out(direction, 1)
        return Result((OutFrame(data, message, state.version),), (), notes)

    def fused_bytes(self, direction: Direction, raw: bytes, message: JsonObject) -> bytes | None:
        """The annotation hot path: a v2 `session/update` notification and a middleware with
        ``fused_v2``. Only the new `_meta` members are built (the update's, for entity rules;
        ``params._meta``, for message-target rules); they are set on the parsed message (which
        no one else holds) and only their bytes are encoded into the frame: the whole message
        when the frame is exactly what orjson writes (one C call), else spliced into ``raw``
        (``rawsplice.splice_member``, one member after the other), the same bytes
        ``rewrite_bytes`` gives. Returns the frame to forward (``raw`` itself when the rules
        leave the message as it is); ``None``: take the general path (the message is as it
        was)."""
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
        whole = SPLICE_IN_C is None or any(_reorders(holder, new) for _, holder, new in edits)
        if whole and canonical(raw, message):
            # Without the C accelerator, encoding a canonical frame whole (one C call) beats the
            # splice's Python scan; with it, the splice (one C call per member) is cheaper still:
            # it encodes only the new members and compares nothing. Except when a new `_meta`
            # does not keep the old one's members first and in order (a key removed by one rule
            # and set again by a later one moves to the end): the general path encodes such a
            # canonical frame whole, in the new order, where a splice keeps the old order.
            for _, holder, new in edits:
                holder["_meta"] = new
            # ``orjson.dumps`` directly, not ``rawjson.encode_value`` (which walks the whole
            # message for NaN whenever the output holds a ``null``), and it cannot fail: orjson
            # just wrote the message as ``raw`` (``canonical``), so it holds nothing orjson
            # refuses and no NaN, and the fused table only takes rule values that orjson writes
            # back exactly (``rules._writes_back``).
            data = orjson.dumps(message)
        else:
            data = raw
            try:
                for path, holder, new in edits:
                    present = "_meta" in holder
                    old_value = holder.get("_meta")
                    data = rawsplice.splice_member(
                        data, path, "_meta", old_value, new, present=present
                    )
            except (rawjson.Unparseable, rawjson.Unencodable):
                return None
            for _, holder, new in edits:
                holder["_meta"] = new
        self.stats.rewritten += 1
        return data

    # --- outcomes -----------------------------------------------------------------------------

    def encode_outcome(
        self, raw: bytes, message: JsonObject, outcome: Outcome, notes: list[Note]
    ) -> list[bytes] | None:
        """The bytes of each message of a changed outcome, each spliced into the original's bytes
        (only what changed is encoded); ``None`` (and a failure note) when one is not JSON, in
        which case the original goes on (fail-open)."""
        encoded = []
        for out in outcome.messages:
            try:
                encoded.append(rewrite_bytes(raw, message, out))
            except (rawjson.Unencodable, rawjson.Unparseable):
                culprit = outcome.changed_by[-1] if outcome.changed_by else "middleware"
                notes.append(MiddlewareFailed(_unencodable(culprit)))
                self.stats.middleware_failures += 1
                return None
        return encoded

    def report(
        self, message: JsonObject, outcome: Outcome, notes: list[Note], inspect_all: bool
    ) -> None:
        """The notes and counters of an outcome: failures, a drop, a rewrite; with
        ``inspect_all``, the debug notes (``Rewritten``, ``SkippedV1``)."""
        stats = self.stats
        for failure in outcome.failures:
            notes.append(MiddlewareFailed(failure))
        stats.middleware_failures += len(outcome.failures)
        if outcome.dropped_by is not None:
            notes.append(Dropped(method_of(message), outcome.dropped_by))
            stats.dropped += 1
        if outcome.changed and outcome.changed_by and outcome.messages:
            if inspect_all:  # a debug-log note: built only when debug logging is on
                notes.append(
                    Rewritten(method_of(message), outcome.changed_by, len(outcome.messages))
                )
            stats.rewritten += 1
        if outcome.skipped and inspect_all:
            notes.append(SkippedV1(method_of(message), update_kind(message), outcome.skipped))

    def reply_frame(
        self, message: JsonObject, raw: bytes | None = None, request: JsonObject | None = None
    ) -> OutFrame:
        """A frame back to the sender of ``request`` (whose bytes are ``raw``): what it shares
        with the request (its id) keeps the request's bytes."""
        encoded = reply_bytes(message, raw, request)
        self.stats.replies += 1
        if "error" in message:
            self.stats.errors_replied += 1
        return OutFrame(encoded, message, self._state.version)


def reply_bytes(message: JsonObject, raw: bytes | None, request: JsonObject | None) -> bytes:
    """The bytes of a middleware's reply to ``request`` (whose bytes are ``raw``); a -32603
    error for the request when the reply is not JSON."""
    encoded: bytes | None
    try:
        if raw is not None and request is not None:
            encoded = rawsplice.splice(raw, request, message)
        else:
            encoded = rawjson.encode_value(message)
    except (rawjson.Unencodable, rawjson.Unparseable):
        encoded = None
    if encoded is None:  # a middleware's reply that is not JSON: an error for the request
        rid = request.get("id") if request is not None else None
        error = error_object(rid, INTERNAL_ERROR, "acp-proxy: bad reply")
        try:  # the id keeps the request's bytes, as every reply's does
            if raw is not None and request is not None:
                return rawsplice.splice(raw, request, error)
            return rawjson.encode_value(error)
        except (rawjson.Unencodable, rawjson.Unparseable):
            encoded = orjson.dumps(error_object(None, INTERNAL_ERROR, "bad reply"))
    return encoded


def rewrite_bytes(raw: bytes, original: JsonObject, out: JsonObject) -> bytes:
    """The bytes of ``out``, a middleware's version of ``original`` (the parse of ``raw``).

    Lossless rewriting: only the members that changed are encoded; everything else keeps
    ``raw``'s bytes (``rawsplice.splice``). Fast path: a frame that is already exactly what orjson
    writes for its value (compact, no escapes, every number in orjson's own spelling) is encoded
    whole, at a fraction of the splice's cost: the same bytes, except that a changed object's
    members come in ``out``'s order (the splice keeps the old order of the members it keeps).
    Raises ``rawjson.Unencodable`` for a changed value that is not JSON.
    """
    if out is original:
        # The middleware changed the message in place (the interface forbids it) and returned
        # it: compare against a fresh parse, so the change is not mistaken for "unchanged".
        fresh = rawjson.loads(raw)
        assert isinstance(fresh, dict)
        original = fresh
    if canonical(raw, original):
        return rawjson.encode_value(out)
    return rawsplice.splice(raw, original, out)


def _reorders(holder: JsonObject, new: JsonValue) -> bool:
    """Whether ``new``, the `_meta` of ``holder`` to be, does not keep the old object's members
    first and in their order (a splice would keep the old order where encoding gives the new)."""
    old = holder.get("_meta")
    return type(old) is dict and type(new) is dict and not rawsplice.appends_only(old, new)


def canonical(raw: bytes, value: JsonObject) -> bool:
    """``raw`` is exactly what orjson writes for ``value`` (compact, no escapes, every number in
    orjson's spelling), so encoding a changed ``value`` whole gives the splice's bytes. Checked
    only up to ``_CANONICAL_CHECK_MAX``: bigger frames are spliced, which costs about the same."""
    if len(raw) > _CANONICAL_CHECK_MAX:
        return False
    try:
        return orjson.dumps(value) == raw
    except TypeError:  # an integer beyond 64 bits or a lone surrogate: not canonical
        return False


def _unencodable(name: str) -> MiddlewareFailure:
    return MiddlewareFailure(
        name, "TypeError: the middleware's message is not JSON-serializable", False
    )
