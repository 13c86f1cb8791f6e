"""Proxy-chain envelopes: unwrap and wrap the conductor's successor messages by byte splicing.

Contract: pure functions from one JSON-RPC line on a conductor connection to another, in each of
the three conductor dialects seen on real wires. It owns the dialects' method names and shapes;
it never re-encodes a value it did not change (the inner message's ``params`` and ``_meta``
leave as the exact bytes that came in, and an envelope is built *around* them), and it never
does I/O. Which side a message belongs to, and the ids in flight, are ``wire.component``'s.

Sources (read December 2026; see docs/component.md for what was verified and how):

* Official, RFD "Agent Extensions via ACP Proxies" (agent-client-protocol
  ``docs/rfds/proxy-chains.mdx``) and schema >= 1.15 (``unstable_proxy_chains``, ``proxy.rs``),
  Rust SDK 5.0: ``proxy/initialize`` carries ordinary initialize params; ``proxy/successor``
  params are ``{"method", "params"?, "_meta"?}``. "Omitted and null are equivalent"; "the
  wrapped request's own ``_meta`` stays inside these params"; the envelope's ``_meta`` is
  "metadata for the ``proxy/successor`` envelope itself".
* Rust SDK 0.x-2.x (``sacp``; rust-sdk ``src/agent-client-protocol/src/schema/proxy_protocol.rs``):
  ``_proxy/initialize`` and ``_proxy/successor``; ``SuccessorMessage`` flattens the inner
  message into the params, with ``#[serde(rename = "_meta", alias = "meta")]``.
* ``@thinkwell/conductor`` 0.5.x (dherman/thinkwell ``packages/protocol/src/proxy-protocol.ts``,
  ``packages/conductor/src/conductor.ts``): a plain ``initialize`` whose ``params._meta.proxy``
  is ``true``, answered with ``result._meta.proxy`` truthy ("Proxy component did not accept
  proxy capability" otherwise); envelopes ``_proxy/successor/request`` (with id) and
  ``_proxy/successor/notification`` (without), params ``{method, params}``.

Whether a wrapped message is a request or a notification is the envelope's own ``id`` (RFD:
"determined by the presence of an ``id`` field in the outer JSON-RPC envelope"); the envelope's
id is the inner message's id, so a response passes through the conductor connection unchanged.
"""

from __future__ import annotations

import enum

import orjson

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.base.values import value
from acp_proxy.wire.rawjson import Unparseable
from acp_proxy.wire.rawscan import object_members, value_start


class Dialect(enum.Enum):
    """A conductor's proxy protocol, named by where it comes from."""

    OFFICIAL = "official"  # proxy/initialize + proxy/successor (RFD, schema >= 1.15, SDK 5.0)
    SACP = "sacp"  # _proxy/initialize + _proxy/successor (Rust SDK 0.x-2.x)
    THINKWELL = "thinkwell"  # initialize + _meta.proxy, _proxy/successor/{request,notification}

    @property
    def init_method(self) -> str:
        """The method of the conductor's first request to a proxy component."""
        return _INIT_METHOD[self]

    def envelope_method(self, *, request: bool) -> str:
        """The method of an envelope around a request (``request``) or a notification."""
        if self is Dialect.THINKWELL:
            return "_proxy/successor/request" if request else "_proxy/successor/notification"
        return "proxy/successor" if self is Dialect.OFFICIAL else "_proxy/successor"

    def is_envelope(self, method: str, *, request: bool) -> bool:
        """Whether ``method`` (with an id: ``request``) is this dialect's envelope."""
        return method == self.envelope_method(request=request)

    @property
    def cancel_hop_by_hop(self) -> bool:
        """``$/cancel_request`` travels plain on the conductor connection, naming the
        envelope's id (SDK 5.0: "Cancellation is never forwarded to another hop"; rust-sdk
        ``md/request-cancellation.md`` "Proxy Chains"). The TypeScript conductor has no
        cancellation of its own: there the notification travels wrapped, like any other."""
        return self is not Dialect.THINKWELL


_INIT_METHOD = {
    Dialect.OFFICIAL: "proxy/initialize",
    Dialect.SACP: "_proxy/initialize",
    Dialect.THINKWELL: "initialize",
}
# Every method name that can only be a conductor's envelope, whatever the dialect.
ENVELOPE_METHODS = frozenset(
    {"proxy/successor", "_proxy/successor"}
    | {"_proxy/successor/request", "_proxy/successor/notification"}
)
EXPECTED = (
    "proxy/initialize (ACP proxy chains), _proxy/initialize (Rust SDK 0.x-2.x conductor) or "
    "initialize with params._meta.proxy = true (@thinkwell/conductor 0.5)"
)

# One member of a scanned object: where its value starts and ends.
Span = tuple[int, int]


@value
class Message:
    """The top-level members of one JSON-RPC object line (value spans into ``raw``)."""

    raw: bytes
    members: dict[str, Span]

    def has(self, key: str) -> bool:
        return key in self.members

    def bytes_of(self, key: str) -> bytes | None:
        span = self.members.get(key)
        return None if span is None else self.raw[span[0] : span[1]]

    def string(self, key: str) -> str | None:
        """The member's value when it is a JSON string, else None."""
        data = self.bytes_of(key)
        if data is None or data[:1] != b'"':
            return None
        got = orjson.loads(data) if b"\\" in data else data[1:-1].decode("utf-8", "replace")
        return got if isinstance(got, str) else None

    @property
    def method(self) -> str | None:
        return self.string("method")

    @property
    def is_request(self) -> bool:
        return "method" in self.members and "id" in self.members

    @property
    def is_notification(self) -> bool:
        return "method" in self.members and "id" not in self.members

    @property
    def is_response(self) -> bool:
        return "method" not in self.members and "id" in self.members

    def id_key(self, key: str = "id") -> JsonValue:
        """The id (or the id-valued member ``key``) as a value to look up in a table (two
        spellings of one id are one key)."""
        data = self.bytes_of(key)
        return None if data is None else _id_key(data)


def _id_key(data: bytes) -> JsonValue:
    try:
        return orjson.loads(data)  # type: ignore[no-any-return]
    except orjson.JSONDecodeError:
        return data.decode("utf-8", "replace")  # an id beyond orjson (huge integer): its digits


def scan(raw: bytes) -> Message | None:
    """The top-level members of the JSON object ``raw`` (one line, no newline), or None when
    it is not an object (a batch array, garbage). The last of repeated keys wins, as in a
    parse. Never raises."""
    start = value_start(raw)
    if start >= len(raw) or raw[start] != ord("{"):
        return None
    try:
        members, _close = object_members(raw, start)
    except (Unparseable, IndexError):
        return None
    return Message(raw, {key: (vs, ve) for key, _ks, vs, ve in members})


def detect(msg: Message) -> Dialect | None:
    """The dialect a conductor's first message speaks, or None when it is none of them."""
    if not msg.is_request:
        return None
    method = msg.method
    if method == "proxy/initialize":
        return Dialect.OFFICIAL
    if method == "_proxy/initialize":
        return Dialect.SACP
    if method == "initialize" and _proxy_flag(msg.bytes_of("params")):
        return Dialect.THINKWELL
    return None


def _proxy_flag(params: bytes | None) -> bool:
    """``params._meta.proxy`` is ``true`` (the TypeScript conductor's offer)."""
    inner = scan(params) if params else None
    meta = inner.bytes_of("_meta") if inner is not None else None
    flag = scan(meta) if meta else None
    return flag is not None and flag.bytes_of("proxy") == b"true"


@value
class Unwrapped:
    """An envelope's inner message as a plain JSON-RPC line, and the envelope's own ``_meta``."""

    inner: bytes
    hop_meta: bytes | None  # the envelope's ``_meta`` (``meta`` in the Rust SDK 2.x alias)


class NotAnEnvelope(ValueError):
    """An envelope method whose params are not ``{"method": string, ...}`` (e.g. a batch)."""


def unwrap(msg: Message, dialect: Dialect) -> Unwrapped:
    """The plain message inside the envelope ``msg``: ``{"jsonrpc":"2.0","id":<the envelope's
    id>,"method":<inner method>,"params":<inner params>}``, every value its original bytes.

    An omitted or ``null`` inner ``params`` is left out (the official schema: "Omitted and null
    are equivalent"). Raises ``NotAnEnvelope`` when the params are not an object with a string
    ``method`` (an array is a batch, which no conductor defines inside an envelope).
    """
    params = msg.bytes_of("params")
    inner = scan(params) if params is not None else None
    if inner is None or inner.string("method") is None:
        raise NotAnEnvelope("the envelope's params must be an object with a string method")
    parts = [b'{"jsonrpc":"2.0"']
    ident = msg.bytes_of("id")
    if ident is not None:
        parts += (b',"id":', ident)
    parts += (b',"method":', inner.bytes_of("method") or b'""')
    inner_params = inner.bytes_of("params")
    if inner_params is not None and inner_params != b"null":
        parts += (b',"params":', inner_params)
    parts.append(b"}")
    hop = inner.bytes_of("_meta")
    if hop is None and dialect is Dialect.SACP:
        hop = inner.bytes_of("meta")
    return Unwrapped(b"".join(parts), hop)


def wrap(msg: Message, dialect: Dialect, *, hop_meta: bytes | None = None) -> bytes:
    """The envelope that carries the plain request or notification ``msg`` to the successor:
    the same id, the dialect's envelope method, and ``{"method", "params", "_meta"?}`` whose
    method and params are ``msg``'s exact bytes. ``hop_meta`` (the encoded JSON object) becomes
    the envelope's own ``_meta`` (official and Rust 2.x dialects; the TypeScript conductor reads
    none). Top-level members other than ``jsonrpc``, ``id``, ``method`` and ``params`` have no
    place in an envelope and are not carried."""
    ident = msg.bytes_of("id")
    envelope = dialect.envelope_method(request=ident is not None)
    parts = [b'{"jsonrpc":"2.0"']
    if ident is not None:
        parts += (b',"id":', ident)
    parts += (b',"method":"', envelope.encode(), b'","params":{"method":')
    parts.append(msg.bytes_of("method") or b'""')
    params = msg.bytes_of("params")
    if params is not None:
        parts += (b',"params":', params)
    if hop_meta is not None and dialect is not Dialect.THINKWELL:
        parts += (b',"_meta":', hop_meta)
    parts.append(b"}}")
    return b"".join(parts)


def replace_method(msg: Message, method: str) -> bytes:
    """``msg``'s bytes with the value of its ``method`` member replaced (``proxy/initialize``
    seen by the chain as the ``initialize`` it carries); everything else as it came."""
    start, end = msg.members["method"]
    return msg.raw[:start] + orjson.dumps(method) + msg.raw[end:]


def accept_proxy(msg: Message) -> bytes:
    """A successful initialize response with ``result._meta.proxy`` set to ``true`` (the
    TypeScript conductor refuses a component whose answer lacks it), spliced into the exact
    bytes: an existing ``_meta`` keeps its other members; one that already says ``true`` is
    left alone. An error response, or a result that is not an object, is returned unchanged."""
    span = msg.members.get("result")
    result = scan(msg.raw[span[0] : span[1]]) if span is not None else None
    if span is None or result is None:
        return msg.raw
    meta_span = result.members.get("_meta")
    meta = scan(result.raw[meta_span[0] : meta_span[1]]) if meta_span is not None else None
    if meta is not None:
        assert meta_span is not None
        if meta.bytes_of("proxy") == b"true":
            return msg.raw
        new_meta = _set_member(meta, "proxy", b"true")
        at = span[0] + meta_span[0]
        return msg.raw[:at] + new_meta + msg.raw[span[0] + meta_span[1] :]
    if meta_span is not None:  # ``_meta`` that is not an object (null): replaced
        at = span[0] + meta_span[0]
        return msg.raw[:at] + b'{"proxy":true}' + msg.raw[span[0] + meta_span[1] :]
    return msg.raw[: span[0]] + _set_member(result, "_meta", b'{"proxy":true}') + msg.raw[span[1] :]


def _set_member(obj: Message, key: str, data: bytes) -> bytes:
    """The object ``obj`` with member ``key`` set to the encoded ``data``: replaced in place
    when present, else added last."""
    span = obj.members.get(key)
    if span is not None:
        return obj.raw[: span[0]] + data + obj.raw[span[1] :]
    close = obj.raw.rstrip().rfind(b"}")
    body = obj.raw[1:close].strip()
    member = orjson.dumps(key) + b":" + data
    return obj.raw[:close] + (b"," if body else b"") + member + obj.raw[close:]


def error_response(ident: bytes | None, code: int, message: str) -> bytes:
    """A JSON-RPC error response line (no newline) for the request whose id bytes are
    ``ident`` (``null`` when it has none)."""
    error = orjson.dumps({"code": code, "message": message})
    return b'{"jsonrpc":"2.0","id":' + (ident or b"null") + b',"error":' + error + b"}"


__all__ = [
    "ENVELOPE_METHODS",
    "EXPECTED",
    "Dialect",
    "Message",
    "NotAnEnvelope",
    "Unwrapped",
    "accept_proxy",
    "detect",
    "error_response",
    "replace_method",
    "scan",
    "unwrap",
    "wrap",
]
