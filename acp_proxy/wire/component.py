"""One proxy component's conductor connection, split into the client side and the agent side.

Contract: a pure state machine (h11-style: lines in, routed lines out; no I/O, no clock) that
detects the conductor's dialect from its first message, tells for every line from the conductor
whether it belongs to the client side (plain messages from the predecessor) or the agent side
(what the successor sent, unwrapped), and turns every line the proxy writes toward a side into
what goes on the conductor connection (plain toward the client; wrapped toward the successor,
except responses, which answer an envelope's id directly). It keeps only the ids in flight
(bounded), never a message. The byte work is ``wire.envelope``'s.

Ids: the conductor allocates the ids of every request it sends to the component, plain or
wrapped, on this one connection, so they are unique among those in flight. The component reuses
each one for the request it sends on (a plain request's id becomes its envelope's id, an
envelope's id the id of the plain request toward the client): responses then pass byte for byte,
and a response's id alone says which side it answers. (An inference from the RFD and the Rust
conductor's per-connection ids; the TypeScript conductor renumbers every request anyway.)
"""

from __future__ import annotations

import enum

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.base.values import value
from acp_proxy.wire.envelope import (
    ENVELOPE_METHODS,
    EXPECTED,
    Dialect,
    Message,
    NotAnEnvelope,
    accept_proxy,
    detect,
    replace_method,
    scan,
    unwrap,
)
from acp_proxy.wire.envelope import wrap as wrap_envelope
from acp_proxy.wire.errors import INVALID_REQUEST, error_bytes
from acp_proxy.wire.framing import HEAD_BYTES, read_request_id, scan_head
from acp_proxy.wire.rawjson import Unparseable
from acp_proxy.wire.rawscan import array_elements

CANCEL = "$/cancel_request"
# Ids in flight kept per table when the caller names no bound (the pipeline's own default).
DEFAULT_MAX_IN_FLIGHT = 1024


class Side(enum.Enum):
    """Where a line from the conductor goes."""

    CLIENT = "client"  # the client side: from the predecessor, plain
    AGENT = "agent"  # the agent side: from the successor, unwrapped
    CONDUCTOR = "conductor"  # an answer the component owes the conductor itself
    NOWHERE = "nowhere"  # dropped (``note`` says why)


@value
class Routed:
    """What one line from the conductor became."""

    side: Side
    data: bytes  # the line for that side (no newline); CONDUCTOR: one or more reply lines
    envelope: str | None = None  # the envelope method it came in, when it was wrapped
    hop_meta: bytes | None = None  # the envelope's own ``_meta``
    note: str | None = None  # something to log (refused, dropped, unknown dialect)
    # What kind of note it is (a fixed text): a peer can repeat a note at will, so the log
    # counts them by kind (``None``: the note itself is fixed).
    kind: str | None = None


@value
class Sent:
    """What one line toward a side became on the conductor connection."""

    data: bytes | None  # None: nothing is written
    envelope: str | None = None  # the envelope method it was wrapped in
    note: str | None = None
    # Error responses for the requests in a line that could not go on (no envelope carries
    # it): given back to the side that wrote it, as the other side's answers, so no request
    # waits for an answer that cannot come.
    replies: tuple[bytes, ...] = ()


class Link:
    """The component's view of its conductor connection (one per process).

    ``max_in_flight`` bounds each id table (requests sent toward a side and not answered yet,
    envelope requests not answered yet); past it the oldest entry is forgotten, with a note (its
    response is then dropped as unknown), so memory stays bounded whatever the peers do.
    """

    __slots__ = (
        "_from_agent",
        "_init_id",
        "_init_pending",
        "_to_agent",
        "_to_client",
        "dialect",
        "max_in_flight",
    )

    def __init__(self, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        self.dialect: Dialect | None = None
        self.max_in_flight = max_in_flight
        self._to_agent: dict[JsonValue, None] = {}  # our envelope requests awaiting a response
        self._to_client: dict[JsonValue, None] = {}  # our plain requests awaiting a response
        self._from_agent: dict[JsonValue, None] = {}  # envelope requests we have not answered
        self._init_id: JsonValue = None  # thinkwell: the initialize whose answer accepts
        self._init_pending = False

    def in_flight(self) -> int:
        """How many ids the tables hold (for the bounds test and the summary)."""
        return len(self._to_agent) + len(self._to_client) + len(self._from_agent)

    # -- from the conductor ------------------------------------------------------------------

    def incoming(self, raw: bytes) -> Routed:
        """Route one line (without its newline) that came from the conductor."""
        msg = scan(raw)
        if msg is None:
            return self._not_an_object(raw)
        dialect = self.dialect
        if dialect is None:
            return self._first(msg)
        method = msg.method
        if method is None:
            return self._response(msg)
        if method in ENVELOPE_METHODS:
            return self._envelope(msg, dialect, method)
        if method == CANCEL and dialect.cancel_hop_by_hop:
            # Hop by hop: a cancel of an envelope request we were sent comes from the
            # successor's side (it gave up on its request); any other is the client's.
            side = Side.AGENT if _cancelled_id(msg) in self._from_agent else Side.CLIENT
            return Routed(side, raw)
        if method == dialect.init_method and dialect is not Dialect.THINKWELL and msg.is_request:
            return Routed(Side.CLIENT, replace_method(msg, "initialize"))
        return Routed(Side.CLIENT, raw)

    def _first(self, msg: Message) -> Routed:
        dialect = detect(msg)
        if dialect is None:
            got = msg.method or ("a response" if msg.is_response else "no method")
            note = f"the conductor's first message is {got}; expected {EXPECTED}"
            kind = "the conductor's first message is not a proxy initialize"
            if msg.is_request:
                text = f"acp-proxy component: expected {EXPECTED}; got {got}"
                reply = error_bytes(msg.bytes_of("id"), INVALID_REQUEST, text)
                return Routed(Side.CONDUCTOR, reply, note=note, kind=kind)
            return Routed(Side.NOWHERE, msg.raw, note=note, kind=kind)
        self.dialect = dialect
        if dialect is Dialect.THINKWELL:
            self._init_id, self._init_pending = msg.id_key(), True
            return Routed(Side.CLIENT, msg.raw)
        return Routed(Side.CLIENT, replace_method(msg, "initialize"))

    def _response(self, msg: Message) -> Routed:
        if not msg.has("id"):
            return Routed(Side.NOWHERE, msg.raw, note="a message with neither method nor id")
        key = msg.id_key()
        if key in self._to_agent:
            del self._to_agent[key]
            return Routed(Side.AGENT, msg.raw)
        if key in self._to_client:
            del self._to_client[key]
            return Routed(Side.CLIENT, msg.raw)
        return Routed(Side.NOWHERE, msg.raw, note="a response to no request in flight; dropped")

    def _envelope(self, msg: Message, dialect: Dialect, method: str) -> Routed:
        mine = method == dialect.envelope_method(request=True) or method == (
            dialect.envelope_method(request=False)
        )
        try:
            if not mine:
                raise NotAnEnvelope(f"{method} is not this conductor's envelope")
            got = unwrap(msg, dialect)
        except NotAnEnvelope as exc:
            note = f"envelope refused: {exc} (batches are not supported inside a proxy chain)"
            kind = "envelope refused"
            if msg.is_request:
                reply = error_bytes(msg.bytes_of("id"), INVALID_REQUEST, str(exc))
                return Routed(Side.CONDUCTOR, reply, envelope=method, note=note, kind=kind)
            return Routed(Side.NOWHERE, msg.raw, envelope=method, note=note, kind=kind)
        if msg.is_request:
            self._remember(self._from_agent, msg.id_key())
        return Routed(Side.AGENT, got.inner, envelope=method, hop_meta=got.hop_meta)

    def _not_an_object(self, raw: bytes) -> Routed:
        """A batch (array) is refused: each request in it gets an error (how a conductor would
        wrap a batch is unspecified; Rust SDK 5.0 removed batches, the TypeScript conductor
        drops them). Any other line is no envelope, so it comes from the client side: it goes
        to the session as the standalone proxy takes such a line from its client (recorded,
        counted); toward the successor it then has no envelope (``outgoing``)."""
        start = len(raw) - len(raw.lstrip())
        if raw[start : start + 1] != b"[":
            return Routed(Side.CLIENT, raw)
        text = "JSON-RPC batches are not supported inside a proxy chain"
        count, replies = _refusals(raw, text)
        note = f"a batch of {count} from the conductor refused: {text}"
        kind = "a batch from the conductor refused"
        if not replies:
            return Routed(Side.NOWHERE, raw, note=note, kind=kind)
        return Routed(Side.CONDUCTOR, b"\n".join(replies), note=note, kind=kind)

    # -- toward the conductor ----------------------------------------------------------------

    def outgoing(self, side: Side, raw: bytes) -> Sent:
        """What to write on the conductor connection for the line ``raw`` the proxy sends
        toward ``side`` (CLIENT or AGENT)."""
        msg = scan(raw)
        dialect = self.dialect
        if side is Side.CLIENT:
            if msg is not None:
                if msg.is_request:
                    self._remember(self._to_client, msg.id_key())
                elif self._init_pending and msg.is_response and msg.id_key() == self._init_id:
                    self._init_pending = False
                    return Sent(accept_proxy(msg))
            return Sent(raw)
        if msg is None or dialect is None:
            text = (
                "acp-proxy component: no envelope carries this message to the successor "
                "(not one JSON-RPC object); not forwarded"
            )
            return Sent(
                None,
                note="a line toward the successor that is not one JSON-RPC object; dropped",
                replies=tuple(_refusals(raw, text)[1]),
            )
        if msg.is_response:
            self._from_agent.pop(msg.id_key(), None)
            return Sent(raw)  # answers the envelope's id itself
        if msg.method == CANCEL and dialect.cancel_hop_by_hop:
            return Sent(raw)  # names our envelope's id on this hop (never wrapped)
        if msg.is_request:
            self._remember(self._to_agent, msg.id_key())
        envelope = dialect.envelope_method(request=msg.is_request)
        return Sent(wrap_envelope(msg, dialect), envelope=envelope)

    def _remember(self, table: dict[JsonValue, None], key: JsonValue) -> None:
        table[key] = None
        if len(table) > self.max_in_flight:
            del table[next(iter(table))]


def _refusals(raw: bytes, text: str) -> tuple[int, list[bytes]]:
    """For a line that cannot go on: how many messages it holds (an array's elements, else 1)
    and a -32600 error with ``text`` for each request among them whose id can be read (from
    the head of a line that is not JSON), its id as written."""
    start = len(raw) - len(raw.lstrip())
    if raw[start : start + 1] == b"[":
        try:
            elements, _close = array_elements(raw, start)
        except (Unparseable, IndexError):
            elements = None
        if elements is not None:
            replies = []
            for s, e in elements:
                item = scan(raw[s:e])
                if item is not None and item.is_request:
                    replies.append(error_bytes(item.bytes_of("id"), INVALID_REQUEST, text))
            return len(elements), replies
    msg = scan(raw)
    if msg is not None:
        if not msg.is_request:
            return 1, []
        return 1, [error_bytes(msg.bytes_of("id"), INVALID_REQUEST, text)]
    head = raw[:HEAD_BYTES]
    if not read_request_id(head)[0]:
        return 1, []
    return 1, [error_bytes(scan_head(head).id_bytes, INVALID_REQUEST, text)]


def _cancelled_id(msg: Message) -> JsonValue:
    return msg.id_key("requestId", within="params")


__all__ = ["CANCEL", "DEFAULT_MAX_IN_FLIGHT", "Link", "Routed", "Sent", "Side"]
