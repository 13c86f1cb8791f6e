"""The proxy-chain envelope core (acp_proxy.wire.envelope, acp_proxy.wire.component): each
dialect's handshake and envelope round trip, byte for byte, with no I/O."""

from __future__ import annotations

import json

import orjson
import pytest

from acp_proxy.wire.component import Link, Routed, Side
from acp_proxy.wire.envelope import (
    Dialect,
    NotAnEnvelope,
    accept_proxy,
    detect,
    replace_method,
    scan,
    unwrap,
    wrap,
)
from acp_proxy.wire.errors import error_bytes

INIT_PARAMS = b'{"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":true}}}'
TW_PARAMS = b'{"protocolVersion":1,"_meta":{"proxy":true}}'


def msg(raw: bytes):  # type: ignore[no-untyped-def]
    got = scan(raw)
    assert got is not None
    return got


@pytest.mark.parametrize(
    ("line", "dialect"),
    [
        (
            b'{"jsonrpc":"2.0","id":0,"method":"proxy/initialize","params":' + INIT_PARAMS + b"}",
            Dialect.OFFICIAL,
        ),
        (
            b'{"jsonrpc":"2.0","id":0,"method":"_proxy/initialize","params":' + INIT_PARAMS + b"}",
            Dialect.SACP,
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":' + TW_PARAMS + b"}",
            Dialect.THINKWELL,
        ),
        (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":' + INIT_PARAMS + b"}", None),
        (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"_meta":{"proxy":1}}}', None),
        (b'{"jsonrpc":"2.0","method":"proxy/initialize","params":{}}', None),  # no id
        (b'{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}', None),
    ],
)
def test_detect(line: bytes, dialect: Dialect | None) -> None:
    assert detect(msg(line)) is dialect


# (dialect, envelope line from the conductor, the inner plain line, the hop _meta bytes)
UNWRAP = [
    (
        Dialect.OFFICIAL,
        b'{"jsonrpc":"2.0","id":7,"method":"proxy/successor","params":{"method":"session/request_permission",'
        b'"params":{"sessionId":"s", "n":1.50,"_meta":{"a":"\\u00e9"}},'
        b'"_meta":{"traceparent":"00-x"}}}',
        b'{"jsonrpc":"2.0","id":7,"method":"session/request_permission",'
        b'"params":{"sessionId":"s", "n":1.50,"_meta":{"a":"\\u00e9"}}}',
        b'{"traceparent":"00-x"}',
    ),
    (
        Dialect.OFFICIAL,
        b'{"method":"proxy/successor","jsonrpc":"2.0","params":{"params":{"update":{}},"method":"session/update"}}',
        b'{"jsonrpc":"2.0","method":"session/update","params":{"update":{}}}',
        None,
    ),
    (  # omitted and null params are equivalent: the inner message has none
        Dialect.OFFICIAL,
        b'{"jsonrpc":"2.0","id":"a","method":"proxy/successor","params":{"method":"x/y","params":null}}',
        b'{"jsonrpc":"2.0","id":"a","method":"x/y"}',
        None,
    ),
    (  # the Rust SDK 2.x alias `meta` for the envelope's `_meta`
        Dialect.SACP,
        b'{"jsonrpc":"2.0","id":3,"method":"_proxy/successor","params":{"method":"fs/read_text_file",'
        b'"params":{"path":"/a"},"meta":{"k":1}}}',
        b'{"jsonrpc":"2.0","id":3,"method":"fs/read_text_file","params":{"path":"/a"}}',
        b'{"k":1}',
    ),
    (
        Dialect.THINKWELL,
        b'{"jsonrpc":"2.0","method":"_proxy/successor/notification","params":{"method":"session/update",'
        b'"params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[]}}}}',
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"plan","entries":[]}}}',
        None,
    ),
]


@pytest.mark.parametrize(("dialect", "envelope", "inner", "hop"), UNWRAP)
def test_unwrap_keeps_the_inner_bytes(
    dialect: Dialect, envelope: bytes, inner: bytes, hop: bytes | None
) -> None:
    got = unwrap(msg(envelope), dialect)
    assert got.inner == inner
    assert got.hop_meta == hop
    orjson.loads(got.inner)  # one JSON value


WRAP = [
    (
        Dialect.OFFICIAL,
        b'{"jsonrpc":"2.0","id":12,"method":"session/prompt","params":{"sessionId":"s","prompt":[],'
        b'"_meta":{"x":  1e400}}}',
        b'{"jsonrpc":"2.0","id":12,"method":"proxy/successor","params":{"method":"session/prompt",'
        b'"params":{"sessionId":"s","prompt":[],"_meta":{"x":  1e400}}}}',
    ),
    (
        Dialect.SACP,
        b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}',
        b'{"jsonrpc":"2.0","method":"_proxy/successor","params":{"method":"session/cancel",'
        b'"params":{"sessionId":"s"}}}',
    ),
    (
        Dialect.THINKWELL,
        b'{"jsonrpc":"2.0","id":"r-1","method":"session/new","params":{"cwd":"/","mcpServers":[]}}',
        b'{"jsonrpc":"2.0","id":"r-1","method":"_proxy/successor/request","params":{"method":"session/new",'
        b'"params":{"cwd":"/","mcpServers":[]}}}',
    ),
    (
        Dialect.THINKWELL,
        b'{"jsonrpc":"2.0","method":"session/cancel"}',
        b'{"jsonrpc":"2.0","method":"_proxy/successor/notification","params":{"method":"session/cancel"}}',
    ),
]


@pytest.mark.parametrize(("dialect", "plain", "envelope"), WRAP)
def test_wrap_builds_around_the_original_bytes(
    dialect: Dialect, plain: bytes, envelope: bytes
) -> None:
    assert wrap(msg(plain), dialect) == envelope
    # and back: the round trip gives the plain message (members in JSON-RPC order) exactly
    assert unwrap(msg(envelope), dialect).inner == plain


def test_wrap_carries_hop_meta_except_for_thinkwell() -> None:
    plain = msg(b'{"jsonrpc":"2.0","method":"m","params":{}}')
    assert wrap(plain, Dialect.OFFICIAL, hop_meta=b'{"t":1}').endswith(b',"_meta":{"t":1}}}')
    assert b'"_meta"' not in wrap(plain, Dialect.THINKWELL, hop_meta=b'{"t":1}')


@pytest.mark.parametrize(
    "params",
    [b"[]", b'[{"method":"a"},{"method":"b"}]', b'{"params":{}}', b'{"method":3}', b'"x"'],
)
def test_unwrap_refuses_what_is_not_one_wrapped_message(params: bytes) -> None:
    line = b'{"jsonrpc":"2.0","id":1,"method":"proxy/successor","params":' + params + b"}"
    with pytest.raises(NotAnEnvelope):
        unwrap(msg(line), Dialect.OFFICIAL)


@pytest.mark.parametrize(
    ("response", "accepted"),
    [
        (
            b'{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1}}',
            b'{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1,"_meta":{"proxy":true}}}',
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"result":{}}',
            b'{"jsonrpc":"2.0","id":1,"result":{"_meta":{"proxy":true}}}',
        ),
        (
            b'{"id":1,"result":{"_meta":{"a" : 1}, "z":2}}',
            b'{"id":1,"result":{"_meta":{"a" : 1,"proxy":true}, "z":2}}',
        ),
        (
            b'{"id":1,"result":{"_meta":{"proxy":false}}}',
            b'{"id":1,"result":{"_meta":{"proxy":true}}}',
        ),
        (b'{"id":1,"result":{"_meta":null}}', b'{"id":1,"result":{"_meta":{"proxy":true}}}'),
        (
            b'{"id":1,"result":{"_meta":{"proxy":true}}}',
            b'{"id":1,"result":{"_meta":{"proxy":true}}}',
        ),
        (
            b'{"id":1,"error":{"code":-1,"message":"m"}}',
            b'{"id":1,"error":{"code":-1,"message":"m"}}',
        ),
        (b'{"id":1,"result":null}', b'{"id":1,"result":null}'),
    ],
)
def test_accept_proxy_splices_one_member(response: bytes, accepted: bytes) -> None:
    assert accept_proxy(msg(response)) == accepted


def test_replace_method_and_error_bytes() -> None:
    line = b'{"jsonrpc":"2.0","id":0,"method" : "proxy/initialize","params":{"a":1}}'
    assert replace_method(msg(line), "initialize") == (
        b'{"jsonrpc":"2.0","id":0,"method" : "initialize","params":{"a":1}}'
    )
    assert error_bytes(b'"x"', -32600, "no") == (
        b'{"jsonrpc":"2.0","id":"x","error":{"code":-32600,"message":"no"}}'
    )
    assert scan(b"[1]") is None and scan(b"{") is None and scan(b"") is None


# -- the link: handshake, routing by id, both directions ---------------------------------------


def handshake(link: Link, dialect: Dialect) -> None:
    init = {
        Dialect.OFFICIAL: b'{"jsonrpc":"2.0","id":0,"method":"proxy/initialize","params":'
        + INIT_PARAMS
        + b"}",
        Dialect.SACP: b'{"jsonrpc":"2.0","id":0,"method":"_proxy/initialize","params":'
        + INIT_PARAMS
        + b"}",
        Dialect.THINKWELL: b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":'
        + TW_PARAMS
        + b"}",
    }[dialect]
    got = link.incoming(init)
    assert got.side is Side.CLIENT
    assert orjson.loads(got.data)["method"] == "initialize"
    out = link.outgoing(Side.AGENT, got.data)  # the proxy forwards it to the successor
    assert out.envelope == dialect.envelope_method(request=True)
    params = orjson.loads(INIT_PARAMS if dialect is not Dialect.THINKWELL else TW_PARAMS)
    assert orjson.loads(out.data or b"") == {
        "jsonrpc": "2.0",
        "id": 0,
        "method": out.envelope,
        "params": {"method": "initialize", "params": params},
    }
    response = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{}}}'
    back = link.incoming(response)
    assert back == type(back)(Side.AGENT, response)
    sent = link.outgoing(Side.CLIENT, response)
    if dialect is Dialect.THINKWELL:
        assert sent.data == (
            b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{},"_meta":{"proxy":true}}}'
        )
    else:
        assert sent.data == response
    assert link.in_flight() == 0


@pytest.mark.parametrize("dialect", list(Dialect))
def test_link_round_trips_in_every_dialect(dialect: Dialect) -> None:
    link = Link()
    handshake(link, dialect)
    assert link.dialect is dialect
    # client -> agent request: wrapped with the same id; its response answers the plain request
    prompt = (
        b'{"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}'
    )
    assert link.incoming(prompt).side is Side.CLIENT
    wrapped = link.outgoing(Side.AGENT, prompt)
    assert wrapped.data == wrap(msg(prompt), dialect)
    # agent -> client request inside an envelope, answered through the envelope's id
    ask = wrap(
        msg(b'{"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{"a":1}}'),
        dialect,
    )
    routed = link.incoming(ask)
    assert (routed.side, routed.data) == (
        Side.AGENT,
        b'{"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{"a":1}}',
    )
    assert link.outgoing(Side.CLIENT, routed.data).data == routed.data  # plain toward the client
    answer = b'{"jsonrpc":"2.0","id":9,"result":{"outcome":{"outcome":"cancelled"}}}'
    assert link.incoming(answer).side is Side.CLIENT  # the client answered our plain request 9
    assert link.outgoing(Side.AGENT, answer).data == answer  # answers envelope 9 unchanged
    done = b'{"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}}'
    assert link.incoming(done).side is Side.AGENT
    assert link.outgoing(Side.CLIENT, done).data == done
    assert link.in_flight() == 0
    # a notification from the successor, and an error the conductor answered itself
    note = wrap(msg(b'{"jsonrpc":"2.0","method":"session/update","params":{"u":1}}'), dialect)
    assert (
        link.incoming(note).data == b'{"jsonrpc":"2.0","method":"session/update","params":{"u":1}}'
    )
    link.outgoing(Side.AGENT, b'{"jsonrpc":"2.0","id":6,"method":"x","params":{}}')
    gone = b'{"jsonrpc":"2.0","id":6,"error":{"code":-32603,"message":"successor exited"}}'
    assert link.incoming(gone) == type(link.incoming(note))(Side.AGENT, gone)


def test_cancellation_is_hop_by_hop() -> None:
    link = Link()
    handshake(link, Dialect.OFFICIAL)
    cancel5 = b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":5}}'
    # the client cancels its request 5: on toward the successor plain, naming envelope 5
    assert link.incoming(cancel5).side is Side.CLIENT
    assert link.outgoing(Side.AGENT, cancel5) == type(link.outgoing(Side.AGENT, cancel5))(cancel5)
    # the conductor cancels envelope request 9 (the successor gave up): the agent side's
    link.incoming(
        wrap(
            msg(b'{"jsonrpc":"2.0","id":9,"method":"fs/read_text_file","params":{}}'),
            Dialect.OFFICIAL,
        )
    )
    cancel9 = b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":9}}'
    assert link.incoming(cancel9).side is Side.AGENT
    # the older wrapped form is accepted too
    older = wrap(msg(cancel9), Dialect.OFFICIAL)
    assert (link.incoming(older).side, link.incoming(older).data) == (Side.AGENT, cancel9)
    # the TypeScript conductor has no hop cancellation: wrapped like any notification
    tw = Link()
    handshake(tw, Dialect.THINKWELL)
    assert tw.outgoing(Side.AGENT, cancel5).envelope == "_proxy/successor/notification"


def test_unknown_first_message_gets_a_clear_error() -> None:
    link = Link()
    got = link.incoming(
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
    )
    assert got.side is Side.CONDUCTOR
    error = orjson.loads(got.data)
    assert error["id"] == 1 and error["error"]["code"] == -32600
    assert (
        "proxy/initialize" in error["error"]["message"]
        and "_meta.proxy" in error["error"]["message"]
    )
    assert got.note is not None and "expected" in got.note
    assert link.dialect is None
    assert link.incoming(b'{"jsonrpc":"2.0","method":"x"}').side is Side.NOWHERE
    handshake(link, Dialect.SACP)  # a proper handshake afterwards still works


def test_batches_and_odd_lines_are_refused() -> None:
    link = Link()
    handshake(link, Dialect.OFFICIAL)
    batch = (
        b'[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"},'
        b'{"jsonrpc":"2.0","id":"z","method":"c"}]'
    )
    got = link.incoming(batch)
    assert got.side is Side.CONDUCTOR
    assert [orjson.loads(line)["id"] for line in got.data.split(b"\n")] == [1, "z"]
    assert link.incoming(b"[]").side is Side.NOWHERE
    # Not JSON: no envelope, so the client side's (the session takes it as standalone does);
    # toward the successor no envelope carries it, and a request in it gets an error back.
    assert link.incoming(b"not json") == Routed(Side.CLIENT, b"not json")
    assert link.outgoing(Side.AGENT, b"not json").replies == ()
    cut = link.outgoing(Side.AGENT, b'{"jsonrpc":"2.0","id":3,"method":"a","params":{"x":')
    assert cut.data is None
    assert [orjson.loads(r)["id"] for r in cut.replies] == [3]
    inside = b'{"jsonrpc":"2.0","id":4,"method":"proxy/successor","params":[{"method":"a"}]}'
    refused = link.incoming(inside)
    assert refused.side is Side.CONDUCTOR and orjson.loads(refused.data)["error"]["code"] == -32600
    assert (
        link.incoming(b'{"jsonrpc":"2.0","method":"proxy/successor","params":[]}').side
        is Side.NOWHERE
    )
    # another dialect's envelope is not this conductor's
    other = b'{"jsonrpc":"2.0","id":2,"method":"_proxy/successor/request","params":{"method":"a"}}'
    assert link.incoming(other).side is Side.CONDUCTOR
    assert link.incoming(b'{"jsonrpc":"2.0","id":77,"result":{}}').side is Side.NOWHERE  # unknown
    assert link.incoming(b'{"jsonrpc":"2.0"}').side is Side.NOWHERE
    assert link.outgoing(Side.AGENT, b"[1]").data is None


def test_id_tables_are_bounded() -> None:
    link = Link(max_in_flight=4)
    handshake(link, Dialect.OFFICIAL)
    for i in range(10):
        link.outgoing(Side.AGENT, b'{"jsonrpc":"2.0","id":%d,"method":"m"}' % i)
    assert link.in_flight() == 4
    assert link.incoming(b'{"jsonrpc":"2.0","id":0,"result":1}').side is Side.NOWHERE  # forgotten
    assert link.incoming(b'{"jsonrpc":"2.0","id":9,"result":1}').side is Side.AGENT


@pytest.mark.parametrize("version", [1, 2])
def test_official_envelopes_match_the_schema(version: int) -> None:
    """What the component builds and reads in the official dialect is what the official schema
    (tests/schemas, unstable: ``ProxySuccessorRequest`` / ``ProxySuccessorNotification``)
    describes."""
    from acp_schema import validate_v1, validate_v2

    validate = validate_v2 if version == 2 else validate_v1
    for dialect, plain, _envelope in WRAP:
        if dialect is not Dialect.OFFICIAL:
            continue
        # (the standard library's parser: the table's 1e400 is beyond orjson)
        built = json.loads(wrap(msg(plain), dialect, hop_meta=b'{"traceparent":"00-x"}'))
        validate(
            "ProxySuccessorRequest" if "id" in built else "ProxySuccessorNotification",
            built["params"],
        )
    for dialect, envelope, _inner, _hop in UNWRAP:
        if dialect is Dialect.OFFICIAL:
            parsed = orjson.loads(envelope)
            kind = "ProxySuccessorRequest" if "id" in parsed else "ProxySuccessorNotification"
            validate(kind, parsed["params"])
    init = (
        orjson.loads(INIT_PARAMS)
        if version == 1
        else {"protocolVersion": 2, "info": {"name": "zed", "version": "1"}, "capabilities": {}}
    )
    validate("InitializeProxyRequest", init)


def test_escaped_and_repeated_keys_take_the_full_walk() -> None:
    """Where the C scanner declines (a key with an escape, a key given twice), the spans come
    from a full walk, and the last of repeated keys wins, as in the parse."""
    escaped = (
        b'{"jsonrpc":"2.0","method":"proxy/successor","params":{"method":"a/b",'
        b'"par\\u0061ms":{"x":1},"_meta":{"h":1}}}'
    )
    got = unwrap(msg(escaped), Dialect.OFFICIAL)
    assert got.inner == b'{"jsonrpc":"2.0","method":"a/b","params":{"x":1}}'
    assert got.hop_meta == b'{"h":1}'
    repeated = b'{"jsonrpc":"2.0","id":1,"id":2,"method":"m","params":{"a":1},"params":{"b":2}}'
    assert wrap(msg(repeated), Dialect.SACP) == (
        b'{"jsonrpc":"2.0","id":2,"method":"_proxy/successor","params":{"method":"m","params":{"b":2}}}'
    )
