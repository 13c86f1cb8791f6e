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
import json

import orjson

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.base.values import value
from acp_proxy.wire.rawjson import Unparseable, exact_loads
from acp_proxy.wire.rawscan import object_members, value_start
from acp_proxy.wire.rawsplice import member_span


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

# Where a member's value starts and ends in a line.
Span = tuple[int, int]


class Message:
    """One JSON-RPC object line: its exact bytes and its parse (orjson; the exact parser for
    what orjson refuses). Byte spans are looked up only where a value is cut out or replaced,
    by the C scanner when it is built (``rawjson.member_span``), so the large ``params`` of an
    update is skipped at C speed, never decoded twice."""

    __slots__ = ("obj", "raw")

    def __init__(self, raw: bytes, obj: dict[str, JsonValue]) -> None:
        self.raw = raw
        self.obj = obj

    def has(self, key: str) -> bool:
        return key in self.obj

    def span(self, key: str, path: tuple[str, ...] = ()) -> Span | None:
        """Where member ``key`` of the object at ``path`` sits in ``raw`` (None: absent)."""
        got = member_span(self.raw, _path_bytes(path), key.encode())
        if got is None:  # a key with an escape, or given twice: the full walk
            return _span_py(self.raw, path, key)
        return None if got[2] < 0 else (got[2], got[3])

    def bytes_of(self, key: str, path: tuple[str, ...] = ()) -> bytes | None:
        span = self.span(key, path)
        return None if span is None else self.raw[span[0] : span[1]]

    def string(self, key: str) -> str | None:
        """The member's value when it is a JSON string, else None."""
        got = self.obj.get(key)
        return got if isinstance(got, str) else None

    @property
    def method(self) -> str | None:
        return self.string("method")

    @property
    def is_request(self) -> bool:
        return "method" in self.obj and "id" in self.obj

    @property
    def is_notification(self) -> bool:
        return "method" in self.obj and "id" not in self.obj

    @property
    def is_response(self) -> bool:
        return "method" not in self.obj and "id" in self.obj

    def id_key(self, key: str = "id", within: str | None = None) -> JsonValue:
        """The id (or the id-valued member ``key`` of the object member ``within``) as a value
        to look up in a table: two spellings of one id are one key."""
        obj = self.obj.get(within) if within is not None else self.obj
        got = obj.get(key) if isinstance(obj, dict) else None
        if isinstance(got, (dict, list)):  # not an id JSON-RPC allows: its encoding
            return json.dumps(got, sort_keys=True)
        return got


_PATHS: dict[tuple[str, ...], tuple[bytes, ...]] = {}


def _path_bytes(path: tuple[str, ...]) -> tuple[bytes, ...]:
    got = _PATHS.get(path)
    if got is None:
        got = tuple(step.encode() for step in path)
        if len(_PATHS) < 16:  # this module uses three
            _PATHS[path] = got
    return got


def _span_py(raw: bytes, path: tuple[str, ...], key: str) -> Span | None:
    """``Message.span`` by a full walk (the last of repeated keys wins, as in the parse)."""
    i = value_start(raw)
    for step in (*path, key):
        if i >= len(raw) or raw[i] != ord("{"):
            return None
        found = None
        for name, _ks, vs, ve in object_members(raw, i)[0]:
            if name == step:
                found = (vs, ve)
        if found is None:
            return None
        i = found[0]
    return found


def scan(raw: bytes) -> Message | None:
    """The JSON object line ``raw`` (no newline) with its parse, or None when it is not an
    object (a batch array, garbage). Never raises."""
    start = value_start(raw)
    if start >= len(raw) or raw[start] != ord("{"):
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            obj = exact_loads(raw)
        except Unparseable:
            obj = _loads_invalid_utf8(raw)
    return Message(raw, obj) if isinstance(obj, dict) else None


def _loads_invalid_utf8(raw: bytes) -> JsonValue:
    """A line that is JSON but for raw bytes that are not UTF-8 inside its strings (the
    standalone proxy forwards such a frame as it came), parsed with each such byte read as a
    lone surrogate (``surrogateescape``): enough to route it by its method and id, and its
    bytes are spliced, never re-encoded. None when it is not JSON even so."""
    try:
        return json.loads(raw.decode("utf-8", "surrogateescape"))  # type: ignore[no-any-return]
    except (ValueError, RecursionError):
        return None


def detect(msg: Message) -> Dialect | None:
    """The dialect a conductor's first message speaks, or None when it is none of them."""
    if not msg.is_request:
        return None
    method = msg.method
    if method == "proxy/initialize":
        return Dialect.OFFICIAL
    if method == "_proxy/initialize":
        return Dialect.SACP
    if method == "initialize" and _proxy_flag(msg.obj.get("params")):
        return Dialect.THINKWELL
    return None


def _proxy_flag(params: JsonValue) -> bool:
    """``params._meta.proxy`` is ``true`` (the TypeScript conductor's offer)."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and meta.get("proxy") is True


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
    params = msg.obj.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("method"), str):
        raise NotAnEnvelope("the envelope's params must be an object with a string method")
    parts = [b'{"jsonrpc":"2.0"']
    ident = msg.bytes_of("id") if msg.has("id") else None
    if ident is not None:
        parts += (b',"id":', ident)
    parts += (b',"method":', msg.bytes_of("method", _PARAMS) or b'""')
    if params.get("params") is not None:
        parts += (b',"params":', msg.bytes_of("params", _PARAMS) or b"null")
    parts.append(b"}")
    hop = None
    if params.get("_meta") is not None:
        hop = msg.bytes_of("_meta", _PARAMS)
    elif dialect is Dialect.SACP and params.get("meta") is not None:
        hop = msg.bytes_of("meta", _PARAMS)
    return Unwrapped(b"".join(parts), hop)


_PARAMS = ("params",)


def wrap(msg: Message, dialect: Dialect, *, hop_meta: bytes | None = None) -> bytes:
    """The envelope that carries the plain request or notification ``msg`` to the successor:
    the same id, the dialect's envelope method, and ``{"method", "params", "_meta"?}`` whose
    method and params are ``msg``'s exact bytes. ``hop_meta`` (the encoded JSON object) becomes
    the envelope's own ``_meta`` (official and Rust 2.x dialects; the TypeScript conductor reads
    none). Top-level members other than ``jsonrpc``, ``id``, ``method`` and ``params`` have no
    place in an envelope and are not carried."""
    ident = msg.bytes_of("id") if msg.has("id") else None
    envelope = dialect.envelope_method(request=ident is not None)
    parts = [b'{"jsonrpc":"2.0"']
    if ident is not None:
        parts += (b',"id":', ident)
    parts += (b',"method":"', envelope.encode(), b'","params":{"method":')
    parts.append(msg.bytes_of("method") or b'""')
    params = msg.bytes_of("params") if msg.has("params") else None
    if params is not None:
        parts += (b',"params":', params)
    if hop_meta is not None and dialect is not Dialect.THINKWELL:
        parts += (b',"_meta":', hop_meta)
    parts.append(b"}}")
    return b"".join(parts)


def replace_method(msg: Message, method: str) -> bytes:
    """``msg``'s bytes with the value of its ``method`` member replaced (``proxy/initialize``
    seen by the chain as the ``initialize`` it carries); everything else as it came."""
    span = msg.span("method")
    assert span is not None
    return msg.raw[: span[0]] + orjson.dumps(method) + msg.raw[span[1] :]


def accept_proxy(msg: Message) -> bytes:
    """A successful initialize response with ``result._meta.proxy`` set to ``true`` (the
    TypeScript conductor refuses a component whose answer lacks it), spliced into the exact
    bytes: an existing ``_meta`` keeps its other members; one that already says ``true`` is
    left alone. An error response, or a result that is not an object, is returned unchanged."""
    raw = msg.raw
    result = msg.obj.get("result")
    if not isinstance(result, dict):
        return raw
    meta = result.get("_meta")
    if isinstance(meta, dict):
        if meta.get("proxy") is True:
            return raw
        flag = msg.span("proxy", ("result", "_meta"))
        if flag is not None:
            return raw[: flag[0]] + b"true" + raw[flag[1] :]
        where = msg.span("_meta", ("result",))
        assert where is not None
        return _add_member(raw, where, b'"proxy":true')
    if "_meta" in result:  # a ``_meta`` that is not an object (null): replaced
        where = msg.span("_meta", ("result",))
        assert where is not None
        return raw[: where[0]] + b'{"proxy":true}' + raw[where[1] :]
    where = msg.span("result")
    assert where is not None
    return _add_member(raw, where, b'"_meta":{"proxy":true}')


def _add_member(raw: bytes, where: Span, member: bytes) -> bytes:
    """``raw`` with ``member`` (``"key":value``) added last to the object at ``where``."""
    close = where[1] - 1  # the object's ``}``
    empty = not raw[where[0] + 1 : close].strip()
    return raw[:close] + (b"" if empty else b",") + member + raw[close:]


__all__ = [
    "ENVELOPE_METHODS",
    "EXPECTED",
    "Dialect",
    "Message",
    "NotAnEnvelope",
    "Unwrapped",
    "accept_proxy",
    "detect",
    "replace_method",
    "scan",
    "unwrap",
    "wrap",
]
