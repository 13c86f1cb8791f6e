"""Tests for acp_proxy.wire.connection.pipeline: a synchronous "playbook" of frames in, exact bytes out."""

# ruff: noqa: E501 - wire bytes and their tables read best on one line each

from __future__ import annotations

import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.config import NonJsonPolicy
from acp_proxy.wire.chain import (
    FORWARD,
    BaseMiddleware,
    Chain,
    Direction,
    Drop,
    Link,
    MessageContext,
    MiddlewareFailure,
    Replace,
    Reply,
    Verdict,
)
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.pipeline import (
    Connection,
    Dropped,
    FrameInfo,
    MiddlewareFailed,
    NonJson,
    NotParsed,
    Observed,
    OversizeFrame,
    PipelineStats,
    Result,
    Rewritten,
    UnusualVersion,
    VersionNegotiated,
)
from acp_proxy.wire.errors import error_object
from acp_proxy.wire.framing import HEAD_BYTES, Line, LineSplitter, Oversize

A2C = Direction.AGENT_TO_CLIENT
C2A = Direction.CLIENT_TO_AGENT

INIT_REQ = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2,"info":{"name":"c","version":"1"},"capabilities":{}}}'
INIT_V2 = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2,"info":{"name":"a","version":"1"},"capabilities":{}}}'
INIT_V1 = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{},"authMethods":[]}}'
CHUNK = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}'
# Integers beyond 2**64 (orjson would turn them into floats), unicode, escapes, nulls and unknown
# fields: all must leave byte for byte when no middleware changed the message.
EXOTIC = (
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
    b'{"sessionUpdate":"tool_call_update","toolCallId":"t","big":123456789012345678901234567890,'
    b'"neg":-18446744073709551617,"f":1.0e+2,"u":"\xe6\x97\xa5\xe6\x9c\xac \\u00e9 \\ud83d\\ude00",'
    b'"n":null,"unknownField":{"x":[null,true,false]},"_meta":null}},"zzz":  1 }'
)


def tag_meta(message: JsonObject, key: str, value: str) -> JsonObject:
    params = message.get("params")
    assert isinstance(params, dict)
    return {**message, "params": {**params, "_meta": {key: value}}}


class Tag(BaseMiddleware):
    """Sets params._meta on session/update notifications (prefilter: the method name)."""

    needles = (b'"session/update"',)

    def __init__(self) -> None:
        self.seen: list[tuple[JsonObject, MessageContext]] = []

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        self.seen.append((message, ctx))
        if message.get("method") != "session/update":
            return FORWARD
        return Replace((tag_meta(message, "example.dev/tag", "x"),))


class Look(BaseMiddleware):
    """Sees every message, changes none."""

    def __init__(self) -> None:
        self.seen: list[JsonObject] = []

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        self.seen.append(message)
        return FORWARD


class ByMethod(BaseMiddleware):
    """Acts on a message according to its method: the batch test's swiss-army middleware."""

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        method = message.get("method")
        if method == "drop":
            return Drop("test")
        if method == "reply":
            return Reply({"jsonrpc": "2.0", "id": message.get("id"), "result": {"by": "proxy"}})
        if method == "replace":
            return Replace(({"jsonrpc": "2.0", "method": "replaced"},))
        if method == "split":
            return Replace(
                (
                    {"jsonrpc": "2.0", "method": "first"},
                    {"jsonrpc": "2.0", "method": "second"},
                    {"jsonrpc": "2.0", "method": "third"},
                )
            )
        if method == "boom":
            raise RuntimeError("kaboom")
        if method == "unencodable":
            return Replace(({"jsonrpc": "2.0", "method": "x", "params": {1, 2}},))  # type: ignore[dict-item]
        return FORWARD


class Boom(BaseMiddleware):
    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        raise RuntimeError("kaboom")


def connect(
    *links: Link,
    version: int | None = 2,
    non_json: NonJsonPolicy = NonJsonPolicy.LOG,
    inspect_all: bool = False,
) -> Connection:
    """A connection, with ``initialize`` already exchanged when ``version`` is given."""
    conn = Connection(Chain(links), non_json=non_json, inspect_all=inspect_all)
    if version is not None:
        conn.handle(C2A, Line(INIT_REQ))
        response = INIT_V2 if version == 2 else INIT_V1
        res = conn.handle(A2C, Line(response))
        assert res.notes[0] == VersionNegotiated(version)
        assert conn.version == version
    return conn


def wire(frames: tuple[OutFrame, ...]) -> list[bytes]:
    return [f.raw for f in frames]


def msg(obj: object) -> bytes:
    return orjson.dumps(obj)


# --- byte-exact pass-through ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "links", [(), (Link(Look()),), (Link(Tag()),)], ids=["empty", "look", "tag"]
)
@pytest.mark.parametrize("direction", [A2C, C2A])
def test_untouched_frames_leave_as_their_exact_bytes(
    links: tuple[Link, ...], direction: Direction
) -> None:
    raw = EXOTIC.replace(b"session/update", b"x/other")  # Tag does not change it
    conn = connect(*links)
    res = conn.handle(direction, Line(raw))
    assert len(res.forward) == 1
    assert res.forward[0].raw is raw
    assert res.reply == () and res.notes == ()


def test_exotic_notification_is_parsed_by_look_but_still_forwarded_as_is() -> None:
    look = Look()
    conn = connect(Link(look))
    res = conn.handle(A2C, Line(EXOTIC))
    assert wire(res.forward) == [EXOTIC]
    assert look.seen[-1]["method"] == "session/update"  # it really was parsed and run


def test_crlf_frames_pass_with_their_cr() -> None:
    conn = connect(Link(Look()))
    raw = CHUNK + b"\r"
    assert wire(conn.handle(A2C, Line(raw)).forward) == [raw]


def test_rewritten_note_with_inspect_all() -> None:
    conn = connect(Link(Tag()), inspect_all=True)
    res = conn.handle(A2C, Line(CHUNK))
    rewritten = [n for n in res.notes if isinstance(n, Rewritten)]
    assert rewritten == [Rewritten("session/update", ("Tag",))]
    assert conn.stats.rewritten == 1


def test_changed_message_is_re_encoded_once_with_orjson() -> None:
    conn = connect(Link(Tag()))
    res = conn.handle(A2C, Line(CHUNK))
    expected = tag_meta(orjson.loads(CHUNK), "example.dev/tag", "x")
    assert wire(res.forward) == [orjson.dumps(expected)]
    assert res.forward[0].message == expected
    assert res.forward[0].version == 2
    assert res.notes == ()  # Rewritten notes are debug information: only with inspect_all
    assert conn.stats.rewritten == 1


# --- version negotiation ---------------------------------------------------------------------------


@pytest.mark.parametrize(("response", "version"), [(INIT_V1, 1), (INIT_V2, 2)])
def test_version_from_the_initialize_response(response: bytes, version: int) -> None:
    tag = Tag()
    conn = Connection(Chain([Link(tag)]))
    assert conn.version is None
    # Pipelined before the response: forwarded untouched, the chain is not run.
    assert wire(conn.handle(C2A, Line(INIT_REQ)).forward) == [INIT_REQ]
    assert wire(conn.handle(A2C, Line(CHUNK)).forward) == [CHUNK]
    assert tag.seen == []
    res = conn.handle(A2C, Line(response))
    assert wire(res.forward) == [response]
    assert res.notes == (VersionNegotiated(version),)
    assert conn.version == version
    after = conn.handle(A2C, Line(CHUNK))
    assert after.forward[0].raw != CHUNK
    assert tag.seen[-1][1] == MessageContext(A2C, version, False)


@pytest.mark.parametrize(
    "response",
    [
        b'{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":2}}',  # another id
        b'{"jsonrpc":"2.0","id":"0","result":{"protocolVersion":2}}',  # "0" is not 0
        b'{"jsonrpc":"2.0","id":0,"error":{"code":-32603,"message":"no"}}',  # an error
        b'{"jsonrpc":"2.0","method":"x","params":{"protocolVersion":2}}',
    ],
)
def test_no_version_without_a_matching_integer_answer(response: bytes) -> None:
    conn = Connection(Chain([]))
    conn.handle(C2A, Line(INIT_REQ))
    res = conn.handle(A2C, Line(response))
    assert wire(res.forward) == [response]
    assert res.notes == ()
    assert conn.version is None


def test_initialize_with_string_id_inside_a_batch() -> None:
    conn = Connection(Chain([]))
    conn.handle(C2A, Line(b'[{"jsonrpc":"2.0","id":"i","method":"initialize","params":{}}]'))
    res = conn.handle(A2C, Line(b'[{"jsonrpc":"2.0","id":"i","result":{"protocolVersion":2}}]'))
    assert res.notes == (VersionNegotiated(2),)
    assert conn.version == 2


# --- request tracking and abort_pending ------------------------------------------------------------


def test_pending_client_requests_and_abort() -> None:
    conn = connect()
    for rid in (1, "two", None, 4):
        conn.handle(C2A, Line(msg({"jsonrpc": "2.0", "id": rid, "method": "session/prompt"})))
    conn.handle(C2A, Line(b'{"jsonrpc":"2.0","method":"session/cancel","params":{}}'))
    assert conn.pending_client_requests == 4
    conn.handle(A2C, Line(b'{"jsonrpc":"2.0","id":4,"result":{}}'))
    # A response whose content mentions "method" (id before it, as every SDK writes it).
    conn.handle(A2C, Line(b'{"jsonrpc":"2.0","id":"two","result":{"text":"\\"method\\""}}'))
    assert conn.pending_client_requests == 2
    frames = [
        f
        for chunk in conn.abort_pending("acp-proxy: the agent exited with status 3")
        for f in chunk
    ]
    assert conn.pending_client_requests == 0
    assert wire(tuple(frames)) == [
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"acp-proxy: the agent exited with status 3 during session/prompt"}}',
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"acp-proxy: the agent exited with status 3 during session/prompt"}}',
    ]
    assert conn.pending_client_requests == 0
    assert list(conn.abort_pending("again")) == []
    assert conn.stats.errors_replied == 2


def test_pending_agent_requests() -> None:
    conn = connect()
    permission = b'{"jsonrpc":"2.0","id":"p1","method":"session/request_permission","params":{}}'
    after_params = b'{"jsonrpc":"2.0","method":"fs/read_text_file","params":{"path":"/a"},"id":7}'
    for raw in (permission, after_params):
        assert wire(conn.handle(A2C, Line(raw)).forward) == [raw]
    assert conn.pending_agent_requests == 2
    conn.handle(
        C2A, Line(b'{"jsonrpc":"2.0","id":"p1","result":{"outcome":{"outcome":"cancelled"}}}')
    )
    assert conn.pending_agent_requests == 1
    assert [f.raw for chunk in conn.abort_agent_requests("client gone") for f in chunk] == [
        b'{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"client gone"}}'
    ]
    assert conn.pending_agent_requests == 0


def test_a_request_answered_by_middleware_is_not_pending() -> None:
    conn = connect(Link(ByMethod()))
    res = conn.handle(C2A, Line(b'{"jsonrpc":"2.0","id":9,"method":"reply"}'))
    assert res.forward == ()
    assert wire(res.reply) == [b'{"jsonrpc":"2.0","id":9,"result":{"by":"proxy"}}']
    assert res.notes == (Dropped("reply", "ByMethod"),)
    assert conn.pending_client_requests == 0


# --- batches ----------------------------------------------------------------------------------------


def batch(*entries: object) -> bytes:
    return orjson.dumps(list(entries))


def entry(method: str, rid: int | None = None) -> JsonObject:
    out: JsonObject = {"jsonrpc": "2.0", "method": method}
    if rid is not None:
        out["id"] = rid
    return out


@pytest.mark.parametrize("direction", [A2C, C2A])
def test_batch_entries_pass_the_chain_in_order(direction: Direction) -> None:
    conn = connect(Link(ByMethod()))
    raw = batch(
        entry("keep", 1),
        entry("drop"),
        entry("replace"),
        entry("reply", 2),
        entry("split", 3),
        entry("keep2"),
        5,  # an invalid entry stays, the receiver answers it
    )
    res = conn.handle(direction, Line(raw))
    assert wire(res.forward) == [
        batch(entry("keep", 1), entry("replaced"), entry("first"), entry("keep2"), 5),
        msg(entry("second")),
        msg(entry("third")),
    ]
    # The reply to a batch is an array (JSON-RPC batch semantics).
    assert wire(res.reply) == [b'[{"jsonrpc":"2.0","id":2,"result":{"by":"proxy"}}]']
    assert res.notes == (Dropped("drop", "ByMethod"), Dropped("reply", "ByMethod"))


def test_batch_contexts_say_in_batch() -> None:
    tag = Tag()
    conn = connect(Link(tag))
    conn.handle(A2C, Line(batch(orjson.loads(CHUNK))))
    assert tag.seen[-1][1] == MessageContext(A2C, 2, True)


def test_unchanged_batch_leaves_as_its_bytes() -> None:
    conn = connect(Link(ByMethod()))
    raw = (
        b'[ {"jsonrpc":"2.0","method":"keep","params":{"n":123456789012345678901234567890}} ,\r\n5]'
    )
    assert wire(conn.handle(A2C, Line(raw)).forward) == [raw]


def test_batch_with_every_entry_dropped_is_not_sent() -> None:
    conn = connect(Link(ByMethod()))
    res = conn.handle(A2C, Line(batch(entry("drop"), entry("drop"))))
    assert res.forward == ()
    assert conn.stats.dropped == 2
    assert conn.stats.agent_to_client_out == 1  # the initialize response only


def test_batch_before_version_is_untouched_but_tracked() -> None:
    conn = Connection(Chain([Link(ByMethod())]))
    raw = batch(entry("drop", 1), entry("reply", 2))
    res = conn.handle(C2A, Line(raw))
    assert wire(res.forward) == [raw] and res.reply == ()
    assert conn.pending_client_requests == 2


def test_single_message_reply_is_not_batched() -> None:
    conn = connect(Link(ByMethod()))
    res = conn.handle(A2C, Line(msg(entry("reply", 5))))
    assert wire(res.reply) == [b'{"jsonrpc":"2.0","id":5,"result":{"by":"proxy"}}']


def test_empty_array_is_forwarded() -> None:
    conn = connect(Link(ByMethod()))
    assert wire(conn.handle(C2A, Line(b"[]")).forward) == [b"[]"]
    assert wire(conn.handle(A2C, Line(b"[]")).forward) == [b"[]"]


# --- middleware failures -----------------------------------------------------------------------------


def test_fail_closed_replies_with_an_error_to_the_sender() -> None:
    conn = connect(Link(Boom(), fail_closed=True))
    res = conn.handle(
        C2A, Line(b'{"jsonrpc":"2.0","id":"r","method":"session/prompt","params":{}}')
    )
    assert res.forward == ()
    assert wire(res.reply) == [
        b'{"jsonrpc":"2.0","id":"r","error":{"code":-32603,"message":"acp-proxy: middleware Boom failed"}}'
    ]
    assert res.notes == (
        MiddlewareFailed(MiddlewareFailure("Boom", "RuntimeError: kaboom", True)),
        Dropped("session/prompt", "Boom"),
    )
    assert conn.stats.errors_replied == 1 and conn.stats.middleware_failures == 1


def test_fail_closed_in_a_batch_replies_with_an_array() -> None:
    conn = connect(Link(Boom(), fail_closed=True))
    res = conn.handle(C2A, Line(batch(entry("a", 1), entry("b"), entry("c", 3))))
    assert res.forward == ()
    assert wire(res.reply) == [
        b'[{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"acp-proxy: middleware Boom failed"}},'
        b'{"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"acp-proxy: middleware Boom failed"}}]'
    ]


def test_fail_open_forwards_the_original_bytes() -> None:
    conn = connect(Link(Boom()), Link(Look()))
    res = conn.handle(A2C, Line(EXOTIC))
    assert wire(res.forward) == [EXOTIC]
    assert res.notes == (
        MiddlewareFailed(MiddlewareFailure("Boom", "RuntimeError: kaboom", False)),
    )


def test_unencodable_replacement_fails_open() -> None:
    conn = connect(Link(ByMethod()))
    raw = b'{"jsonrpc":"2.0","method":"unencodable"}'
    res = conn.handle(A2C, Line(raw))
    assert wire(res.forward) == [raw]
    assert isinstance(res.notes[-1], MiddlewareFailed)
    assert res.notes[-1].failure.middleware == "ByMethod"


# --- non-JSON agent output ----------------------------------------------------------------------------

NON_JSON_CASES = [
    ("banner", b"Starting agent v1.2.3...", "text"),
    ("escape", b"\x1b[31mred\x1b[0m", "ansi-escape"),
    ("scalar", b'"just a string"', "text"),
    ("number", b"42", "text"),
    ("binary", b"\xff\xfe\x00", "text"),
    # Log lines that start like JSON but cannot be a frame (after ``{`` must come
    # whitespace, ``"`` or ``}``; after ``[`` whitespace, ``]``, ``{`` or ``[``).
    ("bracketed level", b"[INFO] Starting server", "text"),
    ("timestamp", b"[2026-12-03 10:00:00] debug", "text"),
    ("braces", b"{not json} x", "text"),
    ("lone brace", b"{", "text"),
]


@pytest.mark.parametrize(
    ("raw", "kind"), [c[1:] for c in NON_JSON_CASES], ids=[c[0] for c in NON_JSON_CASES]
)
def test_non_json_agent_lines_are_diverted(raw: bytes, kind: str) -> None:
    # Look parses everything, so the broken object is detected too.
    conn = connect(Link(Look()))
    res = conn.handle(A2C, Line(raw))
    assert res == Result((), (), (NonJson(kind, len(raw), raw, True),))
    assert conn.stats.diverted == 1


def test_first_of_kind_then_counted() -> None:
    conn = connect()
    kinds = [
        note.first_of_kind
        for raw in (b"a", b"b", b"\x1b[0m", b"c", b"\x1b[1m")
        for note in conn.handle(A2C, Line(raw)).notes
        if isinstance(note, NonJson)
    ]
    assert kinds == [True, False, True, False, False]
    assert conn.stats.diverted == 5


def test_non_json_forward_policy() -> None:
    conn = connect(non_json=NonJsonPolicy.FORWARD)
    res = conn.handle(A2C, Line(b"hello"))
    assert wire(res.forward) == [b"hello"]
    assert res.notes == (NonJson("text", 5, b"hello", True, forwarded=True),)
    assert conn.stats.diverted == 0


def test_escape_prefix_before_json_is_split_off() -> None:
    conn = connect()
    res = conn.handle(A2C, Line(b"\x1b[?25l\x1b[2K" + CHUNK))
    assert wire(res.forward) == [CHUNK]
    assert res.notes == (NonJson("ansi-escape", 10, b"\x1b[?25l\x1b[2K", True),)


def test_invalid_json_not_parsed_is_forwarded() -> None:
    """The documented trade-off: nothing wanted it, so it was not validated."""
    conn = connect()
    raw = b'{"jsonrpc":"2.0","method":"session/update","params":{'
    assert wire(conn.handle(A2C, Line(raw)).forward) == [raw]


def test_leading_whitespace_json_is_a_frame() -> None:
    conn = connect()
    raw = b"  \t" + CHUNK
    assert wire(conn.handle(A2C, Line(raw)).forward) == [raw]


@pytest.mark.parametrize("raw", [b"hello", b'{"id":1,', b"42", b'{"id":1,"method":"x"}}'])
def test_malformed_client_frames_are_forwarded(raw: bytes) -> None:
    conn = connect(Link(Look()))
    res = conn.handle(C2A, Line(raw))
    assert wire(res.forward) == [raw]
    assert res.reply == ()
    # What could not be parsed is forwarded untouched, and said (warned once); a JSON
    # scalar parses (the agent answers it), so it needs no word.
    unparsed = raw != b"42"
    expected = [(NotParsed, len(raw), True)] if unparsed else []
    got = [(type(n), n.size, n.first_of_kind) for n in res.notes if isinstance(n, NotParsed)]
    assert got == expected
    assert len(res.notes) == len(expected)
    assert conn.stats.not_parsed == unparsed


@pytest.mark.parametrize(
    ("version", "expected", "action"),
    [
        (b'"2"', None, "not a positive integer"),
        (b"true", None, "not a positive integer"),
        (b"0", None, "not a positive integer"),
        (b"2.5", None, "not a positive integer"),
        (b"2.0", 2, "treated as 2"),
        (b"2E0", 2, "treated as 2"),
    ],
)
def test_unusual_protocol_version_is_said(
    version: bytes, expected: int | None, action: str
) -> None:
    # No silent degradation: a float 2.0 used to disable every rule without a word.
    conn = Connection(Chain([]))
    conn.handle(C2A, Line(INIT_REQ))
    response = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":' + version + b"}}"
    res = conn.handle(A2C, Line(response))
    assert wire(res.forward) == [response]
    unusual = [n for n in res.notes if isinstance(n, UnusualVersion)]
    shown = version.decode() if version != b"2E0" else "2.0"
    assert [(n.value, n.action.startswith(action)) for n in unusual] == [(shown, True)]
    assert conn.version == expected


# --- oversize frames ------------------------------------------------------------------------------


def test_oversize_request_gets_an_error_reply() -> None:
    conn = connect()
    head = b'{"jsonrpc":"2.0","id":12,"method":"session/prompt","params":{"prompt":"' + b"x" * 5000
    res = conn.handle(C2A, Oversize(70_000_000, head[:HEAD_BYTES], 67_108_864))
    assert res.forward == ()
    assert wire(res.reply) == [
        b'{"jsonrpc":"2.0","id":12,"error":{"code":-32600,"message":"acp-proxy: message of 70000000 '
        b'bytes exceeds the 67108864-byte limit; not forwarded"}}'
    ]
    assert res.notes == (OversizeFrame(70_000_000, 12, replied=True, limit=67_108_864),)
    assert conn.stats.oversize == 1 and conn.stats.errors_replied == 1
    assert conn.pending_client_requests == 0


def test_oversize_big_integer_id_is_echoed_exactly() -> None:
    conn = connect()
    res = conn.handle(
        A2C, Oversize(99, b'{"id":123456789012345678901234567890,"method":"m","params":"', 50)
    )
    assert wire(res.reply)[0].startswith(
        b'{"jsonrpc":"2.0","id":123456789012345678901234567890,"error"'
    )


def test_oversize_response_answers_the_waiting_request() -> None:
    conn = connect()
    conn.handle(C2A, Line(b'{"jsonrpc":"2.0","id":"q","method":"session/load","params":{}}'))
    res = conn.handle(A2C, Oversize(200, b'{"jsonrpc":"2.0","id":"q","result":{"x":"', 100))
    assert wire(res.forward) == [
        b'{"jsonrpc":"2.0","id":"q","error":{"code":-32603,"message":"acp-proxy: the response was '
        b'200 bytes, over the 100-byte limit; dropped"}}'
    ]
    assert res.notes == (OversizeFrame(200, "q", answered=True, limit=100),)
    assert conn.pending_client_requests == 0


@pytest.mark.parametrize(
    "head",
    [
        b'{"jsonrpc":"2.0","method":"session/update","params":{"x":"',  # notification
        b'{"jsonrpc":"2.0","id":"nobody","result":{"x":"',  # response to no pending request
        b"garbage",
    ],
)
def test_oversize_without_anyone_to_answer(head: bytes) -> None:
    conn = connect()
    res = conn.handle(A2C, Oversize(1000, head))
    assert res == Result((), (), (OversizeFrame(1000, None),))


# --- inspection, counters, handle_many ---------------------------------------------------------------


def test_inspect_all_reports_every_message() -> None:
    conn = connect(Link(Tag()), inspect_all=True)
    res = conn.handle(A2C, Line(CHUNK))
    assert res.notes[-1] == FrameInfo(
        A2C, "session/update", None, "agent_message_chunk", len(CHUNK), ("Tag",)
    )
    res = conn.handle(C2A, Line(b'{"jsonrpc":"2.0","id":3,"method":"session/new","params":{}}'))
    assert res.notes == (FrameInfo(C2A, "session/new", 3, None, 59, ()),)


def test_stats() -> None:
    conn = connect(Link(ByMethod()))
    conn.handle(A2C, Line(CHUNK))
    conn.handle(A2C, Line(b"noise"))
    conn.handle(A2C, Line(msg(entry("replace"))))
    conn.handle(C2A, Line(msg(entry("drop"))))
    conn.handle(C2A, Oversize(10, b"{"))
    assert conn.stats == PipelineStats(
        client_to_agent_in=3,
        client_to_agent_out=1,
        agent_to_client_in=4,
        agent_to_client_out=3,
        rewritten=1,
        dropped=1,
        diverted=1,
        oversize=1,
    )
    assert conn.stats.as_dict()["diverted"] == 1


SESSION = [
    (C2A, INIT_REQ),
    (A2C, CHUNK),
    (A2C, INIT_V2),
    (C2A, b'{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{}}'),
    (A2C, CHUNK),
    (A2C, b"banner"),
    (A2C, EXOTIC),
    (A2C, b'{"jsonrpc":"2.0","id":"p","method":"session/request_permission","params":{}}'),
    (C2A, b'{"jsonrpc":"2.0","id":"p","result":{}}'),
    (A2C, batch(entry("split", 8), entry("keep"))),
    (A2C, b'{"jsonrpc":"2.0","id":1,"result":{}}'),
    (C2A, msg(entry("reply", 4))),
]


@settings(max_examples=60, deadline=None)
@given(
    cuts=st.lists(st.integers(0, len(SESSION)), max_size=6),
    join=st.booleans(),
    chained=st.booleans(),
)
def test_handle_many_is_handle_in_sequence(cuts: list[int], join: bool, chained: bool) -> None:
    links = (Link(ByMethod()), Link(Tag())) if chained else ()

    def fresh() -> Connection:
        return Connection(Chain(links))

    one, many = fresh(), fresh()
    expected: dict[Direction, list[bytes]] = {A2C: [], C2A: []}
    for direction, raw in SESSION:
        res = one.handle(direction, Line(raw))
        expected[direction] += wire(res.forward)
    got: dict[Direction, list[bytes]] = {A2C: [], C2A: []}
    points = sorted({0, len(SESSION), *cuts})
    for a, b in itertools.pairwise(points):
        # group consecutive events of one direction, as the shell does per read
        i = a
        while i < b:
            j = i
            while j < b and SESSION[j][0] is SESSION[i][0]:
                j += 1
            direction = SESSION[i][0]
            res = many.handle_many(direction, [Line(r) for _, r in SESSION[i:j]], join=join)
            got[direction] += wire(res.forward)
            i = j
    for direction in (A2C, C2A):
        assert b"\n".join(got[direction]) == b"\n".join(expected[direction])
    assert many.stats == one.stats
    assert many.version == one.version == 2


def test_handle_many_join_makes_one_frame_per_run() -> None:
    conn = connect()
    res = conn.handle_many(A2C, [Line(CHUNK), Line(CHUNK), Line(b"noise"), Line(CHUNK)], join=True)
    assert wire(res.forward) == [CHUNK + b"\n" + CHUNK, CHUNK]
    assert res.notes == (NonJson("text", 5, b"noise", True),)


def test_end_to_end_with_the_splitter() -> None:
    """Splitter + pipeline on a byte stream: untouched frames come out byte for byte."""
    stream = b"\n".join([INIT_V2, CHUNK + b"\r", b"", EXOTIC, b"  "]) + b"\n"
    conn = Connection(Chain([Link(Look())]))
    conn.handle(C2A, Line(INIT_REQ))
    splitter = LineSplitter(1 << 20)
    out: list[bytes] = []
    for i in range(0, len(stream), 13):
        for event in splitter.feed(stream[i : i + 13]):
            out += wire(conn.handle(A2C, event).forward)
    assert out == [INIT_V2, CHUNK + b"\r", EXOTIC]


def test_error_response_shape_is_shared() -> None:
    assert error_object(1, -32603, "m") == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32603, "message": "m"},
    }


class Needles(BaseMiddleware):
    def __init__(self, needles: tuple[bytes, ...] | None) -> None:
        self.needles = needles


@settings(max_examples=200, deadline=None)
@given(
    raw=st.lists(
        st.sampled_from([b"a", b'"x"', b"\\u", b"\\/", b"\\n", b"y", b"{"]), max_size=8
    ).map(b"".join),
    spec=st.lists(
        st.one_of(
            st.none(), st.lists(st.sampled_from([b'"x"', b"y", b"zz"]), max_size=2).map(tuple)
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_prefilter_matches_chain_interested(
    raw: bytes, spec: list[tuple[bytes, ...] | None]
) -> None:
    chain = Chain([Link(Needles(n)) for n in spec])
    conn = connect(*chain.links)
    expected = chain.interested(raw)
    assert conn._state.interested(raw) == (expected if any(expected) else None)


# --- the parse budget ---------------------------------------------------------------


def test_a_frame_over_the_parse_budget_is_forwarded_and_tracked_from_its_head() -> None:
    conn = Connection(Chain([Link(Look())]), max_parse_bytes=64 * 1024)
    conn.handle(C2A, Line(INIT_REQ))
    conn.handle(A2C, Line(INIT_V2))
    big = (
        b'{"jsonrpc":"2.0","id":18446744073709551616,"method":"x","params":['
        + b"{}," * 40_000
        + b"{}]}"
    )
    res = conn.handle(C2A, Line(big))
    assert wire(res.forward) == [big]  # not parsed, not changed
    [note] = res.notes
    assert isinstance(note, NotParsed) and note.reason.startswith("over the parse budget")
    assert conn.pending_client_requests == 1
    [[error]] = list(conn.abort_pending("agent gone"))
    assert (
        error.raw
        == b'{"jsonrpc":"2.0","id":18446744073709551616,"error":{"code":-32603,"message":"agent gone during x"}}'
    )
    # A big response is matched from its head too.
    conn.handle(A2C, Line(b'{"jsonrpc":"2.0","id":9,"method":"session/request_permission"}'))
    reply = b'{"jsonrpc":"2.0","id":9,"result":[' + b"{}," * 40_000 + b"{}]}"
    assert wire(conn.handle(C2A, Line(reply)).forward) == [reply]
    assert conn.pending_agent_requests == 0


# --- observing (recording, metrics, tracing) --------------------------------------------------


def test_observe_describes_every_frame_and_its_fate() -> None:
    conn = Connection(Chain([Link(Tag())]), observe=True)
    res = conn.handle(C2A, Line(INIT_REQ))
    [obs] = [n for n in res.notes if isinstance(n, Observed)]
    assert (obs.direction, obs.raw, obs.sent, obs.replies, obs.kind) == (
        C2A,
        INIT_REQ,
        None,
        (),
        "message",
    )
    assert [(m.method, m.id) for m in obs.messages] == [("initialize", 0)]
    res = conn.handle(A2C, Line(INIT_V2))
    [obs] = [n for n in res.notes if isinstance(n, Observed)]
    # A response names the method of the request it answers.
    assert [(m.method, m.id, m.answers) for m in obs.messages] == [(None, 0, "initialize")]
    res = conn.handle(A2C, Line(CHUNK))
    [obs] = [n for n in res.notes if isinstance(n, Observed)]
    assert obs.sent == tuple(f.raw for f in res.forward) != (CHUNK,)
    assert obs.messages[0].changed_by == ("Tag",)
    res = conn.handle(A2C, Line(b"[INFO] hello"))
    [obs] = [n for n in res.notes if isinstance(n, Observed)]
    assert (obs.sent, obs.kind, obs.messages) == ((), "non-json", ())


class _BadReply(BaseMiddleware):
    """Answers every request with a reply that is not JSON (a set)."""

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        return Reply({"jsonrpc": "2.0", "id": message.get("id"), "result": {1, 2}})  # type: ignore[dict-item]


def test_a_reply_that_is_not_json_becomes_an_error_with_the_requests_id_bytes() -> None:
    conn = connect(Link(_BadReply()))
    request = b'{"jsonrpc":"2.0","id":18446744073709551616,"method":"session/prompt","params":{}}'
    [reply] = conn.handle(C2A, Line(request)).reply
    assert reply.raw == (
        b'{"jsonrpc":"2.0","id":18446744073709551616,'
        b'"error":{"code":-32603,"message":"acp-proxy: bad reply"}}'
    )
