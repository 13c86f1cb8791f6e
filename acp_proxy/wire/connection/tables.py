"""The request tables as the engines use them: track what is forwarded, refuse what has no room.

Contract: ``Requests`` wraps the bounded tables of one connection (``tracking.RequestTracker``)
with what every path does with them: a request being forwarded is admitted (or refused with a
-32603 error reply when its table is full), a response takes its request out, and the responses
a link is told of (``LinkInterest.watch``: the ``initialize`` response, which fixes the version,
``ConnState.set_version``) are handed to the chain. ``negotiated_version``: the version an
``initialize`` response fixes (ACP digest §2.3: ``result.protocolVersion`` of the response, a JSON
integer; an error response negotiates nothing). Each engine (``rewrite``, ``batches``,
``unparsed``, ``oversize``, the line path) is given the connection's ``Requests`` and its
``ConnState``; none reaches the connection itself. Pure: no I/O.
"""

from __future__ import annotations

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.connstate import ConnState
from acp_proxy.wire.connection.observe import method_of
from acp_proxy.wire.connection.tracking import RequestTracker, is_id
from acp_proxy.wire.errors import INTERNAL_ERROR, error_bytes
from acp_proxy.wire.notes import Note, PendingFull, UnusualVersion, VersionNegotiated
from acp_proxy.wire.raw import rawjson, rawscan

_A2C = Direction.AGENT_TO_CLIENT
_C2A = Direction.CLIENT_TO_AGENT


class Requests:
    """The request tables of one connection (``state``), as every path updates them."""

    __slots__ = ("_state", "answers", "max_pending", "tracker", "watched")

    def __init__(self, state: ConnState, max_pending: int) -> None:
        self._state = state
        self.tracker = RequestTracker(max_pending)
        self.max_pending = max_pending
        # The watched client requests (``LinkInterest.watch``) waiting, each with its method.
        self.watched: dict[JsonValue, str] = {}
        # Inspecting: the responses of the current frame, id -> method (``Observed`` says it).
        self.answers: dict[JsonValue, str] = {}

    def track(
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
                id_bytes = _id_text(rid)
            self.admit(direction, rid, method, id_bytes)
            state = self._state
            if direction is _C2A and method in state.watch:
                self.watched[rid] = method
                if len(self.watched) > self.max_pending:
                    del self.watched[next(iter(self.watched))]
                if method == "initialize":
                    state.chain.initialize_requested(message)
            return
        if "result" not in message and "error" not in message:
            return  # not a response either
        self.answered(direction, rid)
        if direction is _A2C and rid in self.watched:
            watched = self.watched.pop(rid)
            chain = self._state.chain
            if watched == "initialize":
                self._negotiate(message, notes)
                chain.initialized(message)
            else:
                chain.answered(watched, message)

    def admit(
        self, direction: Direction, rid: JsonValue, method: str, id_bytes: bytes
    ) -> OutFrame | None:
        """Track a request being forwarded; when its table is full, an error reply instead."""
        if self.tracker.admit(direction, rid, method, id_bytes):
            return None
        return self._full_reply(id_bytes)

    def answered(self, direction: Direction, rid: JsonValue) -> tuple[str, bytes] | None:
        """A response travelling ``direction`` answers the request with id ``rid``."""
        entry = self.tracker.answer(direction.reverse, rid)
        if entry is not None and self._state.inspect_all:
            self.answers[rid] = entry[0]
        return entry

    def refuse_if_full(
        self, direction: Direction, raw: bytes, message: JsonObject
    ) -> OutFrame | None:
        """An error reply for the request ``message`` if its table has no room, else ``None``."""
        if not self.tracker.full(direction):
            return None
        rid = message["id"]
        if not is_id(rid):  # a repeated id needs room too: it waits beside the first
            return None
        try:
            id_bytes = rawscan.id_bytes(raw) or b"null"
        except rawjson.Unparseable:  # pragma: no cover - ``raw`` parsed as ``message``
            id_bytes = _id_text(rid)
        return self._full_reply(id_bytes)

    def full_note(self, direction: Direction, message: JsonObject | str) -> PendingFull:
        """The note of a request refused for want of room (``message``: it, or its method)."""
        method = message if isinstance(message, str) else method_of(message) or "?"
        return PendingFull(direction, method, self.max_pending)

    def _full_reply(self, id_bytes: bytes) -> OutFrame:
        stats = self._state.stats
        stats.pending_refused += 1
        stats.replies += 1
        stats.errors_replied += 1
        data = error_bytes(
            id_bytes,
            INTERNAL_ERROR,
            f"acp-proxy: too many requests awaiting an answer (limit {self.max_pending}); "
            "not forwarded",
        )
        return OutFrame(data, None, self._state.version)

    def _negotiate(self, response: JsonObject, notes: list[Note]) -> None:
        state = self._state
        version = negotiated_version(response, notes, state.version)
        if version is not None and version != state.version:
            state.set_version(version)
            notes.append(VersionNegotiated(version))


def _id_text(rid: JsonValue) -> bytes:
    """An id's bytes when its own are not at hand (a message a middleware built)."""
    try:
        return rawjson.encode_value(rid)
    except rawjson.Unencodable:
        return b"null"


def negotiated_version(
    response: JsonObject, notes: list[Note], current: int | None = None
) -> int | None:
    """The version ``response`` negotiates, ``None`` for none; an ``UnusualVersion`` note in
    ``notes`` when its value is not a plain positive integer, or when the session negotiated
    ``current`` already."""
    result = response.get("result")
    if not isinstance(result, dict) or "protocolVersion" not in result:
        return None
    version = result["protocolVersion"]
    if type(version) is float and version.is_integer() and version >= 1:
        # Version robustness: ``2.0`` means 2 to every JSON reader that has one number type
        # (JavaScript's included); treat it as 2 rather than disable every rule.
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
        return None
    if current is not None:
        # A second initialize (a client bug, or a client that starts over) is forwarded and
        # answered as the agent decides, but the session's version stays the one the first
        # negotiated: the rules and patches of one protocol never switch to another mid-session.
        notes.append(
            UnusualVersion(
                str(version),
                f"a second initialize answered: the session keeps version {current}, "
                "negotiated first",
            )
        )
        return None
    return version


def _json_text(value: JsonValue) -> str:
    try:
        return rawjson.encode_value(value).decode("utf-8", "replace")
    except rawjson.Unencodable:
        return "?"
