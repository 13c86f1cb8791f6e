"""The fused annotation path against the general one: same bytes, same messages.

``Connection`` takes the fused path (``RulesMiddleware.fused_v2`` + ``rawsplice.splice_member``)
for v2 upsert notifications when its chain is one rules middleware; with ``_fused`` unset it runs
the chain and ``rewrite.rewrite_bytes``, the reference the RFD property tests (test_annotate,
test_rawjson) were written against. Every generated frame must come out identical both ways.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_strategies import WS, json_strings, json_text

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.meta.registry import UPSERT_KINDS
from acp_proxy.rules.engine import Rule, RuleDirection, RulesMiddleware, RuleTarget
from acp_proxy.wire.chain import Chain, Direction, Link
from acp_proxy.wire.connection import rewrite
from acp_proxy.wire.connection.pipeline import Connection, Result
from acp_proxy.wire.framing import Line, LineSplitter
from acp_proxy.wire.raw import rawjson, rawsplice

KEYS = ["example.dev/route", "example.dev/team", "traceparent"]
_VALUES: list[JsonValue] = [None, "edge", "core", 1, 1.0, True, [], {}, {"a": None}]
VALUES = st.sampled_from(_VALUES)
KINDS = sorted(UPSERT_KINDS[2])


@st.composite
def rules(draw: st.DrawFn) -> list[Rule]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        kinds = draw(st.one_of(st.none(), st.lists(st.sampled_from(KINDS), min_size=1)))
        out.append(
            Rule(
                name=f"r{i}",
                set_meta=draw(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=2)),
                remove_meta=tuple(draw(st.lists(st.sampled_from(KEYS), max_size=2))),
                overwrite=draw(st.booleans()),
                direction=draw(st.sampled_from([*RuleDirection, RuleDirection.BOTH])),
                method=draw(st.sampled_from([None, None, "session/update", "session/*", "other"])),
                update_kinds=tuple(kinds) if kinds is not None else None,
                update_upserts=draw(st.booleans()),
                target=draw(st.sampled_from([RuleTarget.ENTITY, RuleTarget.MESSAGE])),
            )
        )
    return out


def _meta_text(draw: st.DrawFn) -> str | None:
    """The update's ``_meta`` member text: absent, null, junk, or an object."""
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return None
    if choice == 1:
        return "null"
    if choice == 2:
        return draw(st.sampled_from(['"junk"', "[1]", "12345678901234567890123", "1e400"]))
    keys = draw(st.lists(st.sampled_from([*KEYS, "x/y"]), max_size=3, unique=True))
    ws = draw(WS)
    members = [
        ws + json.dumps(k) + ws + ":" + ws + draw(st.sampled_from(['"edge"', "null", "1", "{}"]))
        for k in keys
    ]
    return "{" + ",".join(members) + "}"


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    ws = draw(WS)
    kind = draw(st.sampled_from([*KINDS, *KINDS, "agent_message_chunk"]))
    members = [f'"sessionUpdate":{ws}"{kind}"']
    spec = UPSERT_KINDS[2].get(kind)
    if spec is not None and spec.key_field is not None and draw(st.integers(0, 9)):
        members.append(f'"{spec.key_field}":{ws}"t1"')
    members.append('"title":' + draw(json_strings()))
    members.append('"rawOutput":' + ws + draw(json_text(2)))
    meta = _meta_text(draw)
    if meta is not None:
        members.insert(draw(st.integers(0, len(members))), '"_meta":' + ws + meta)
    if draw(st.integers(0, 9)) == 0:  # a repeated key on the way
        members.append(draw(st.sampled_from(['"_meta":{}', '"sessionUpdate":"plan"'])))
    update = "{" + ws + ("," + ws).join(members) + ws + "}"
    params_members = ['"sessionId":' + ws + '"s"', '"update":' + ws + update]
    params_meta = _meta_text(draw)  # the message-level ``params._meta``, any position
    if params_meta is not None:
        at = draw(st.integers(0, len(params_members)))
        params_members.insert(at, '"_meta":' + ws + params_meta)
    params = "{" + ("," + ws).join(params_members) + "}"
    if draw(st.integers(0, 9)) == 0:
        params = params[:-1] + ',"update":{}}'
    head = '{"jsonrpc":"2.0",' + ws
    if draw(st.integers(0, 9)) == 0:
        head += '"id":7,'
    method = draw(st.sampled_from(["session/update"] * 9 + ["session/other"]))
    text = head + '"method":' + ws + json.dumps(method) + "," + ws + '"params":' + params + "}"
    if draw(st.integers(0, 2)) == 0:  # orjson's own form, when it can be written so
        with contextlib.suppress(orjson.JSONDecodeError):
            text = orjson.dumps(orjson.loads(text)).decode()
    return text.encode()


def _connection(rule_list: list[Rule], *, fused: bool) -> Connection:
    conn = Connection(Chain([Link(RulesMiddleware(rule_list))]))
    if not fused:
        conn._state.fused = None
    conn.handle(Direction.CLIENT_TO_AGENT, Line(b'{"jsonrpc":"2.0","id":0,"method":"initialize"}'))
    conn.handle(
        Direction.AGENT_TO_CLIENT, Line(b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2}}')
    )
    return conn


@contextlib.contextmanager
def _accelerator(on: bool) -> Iterator[None]:
    """The C accelerator's splice in use (when built) or not: both paths must give the same
    bytes (without it, canonical frames are encoded whole and the rest spliced in Python)."""
    saved = rewrite.SPLICE_IN_C, rawsplice._member_span_c
    if not on:
        rewrite.SPLICE_IN_C = None
        rawsplice._member_span_c = None
    try:
        yield
    finally:
        rewrite.SPLICE_IN_C, rawsplice._member_span_c = saved


def _assert_same_rest(a: Result, b: Result, fast: Connection, slow: Connection) -> None:
    """Beyond the forwarded bytes: the same replies, notes and counters both ways."""
    assert [f.raw for f in a.reply] == [f.raw for f in b.reply]
    assert a.notes == b.notes
    assert fast.stats == slow.stats


def _same(a: Any, b: Any) -> bool:
    return rawjson.json_equal(a, b)


@settings(max_examples=400, deadline=None)
@given(
    rule_list=rules(),
    raw=frames(),
    direction=st.sampled_from(list(Direction)),
    accel=st.booleans(),
)
def test_fused_path_gives_the_general_paths_output(
    rule_list: list[Rule], raw: bytes, direction: Direction, accel: bool
) -> None:
    fast = _connection(rule_list, fused=True)
    slow = _connection(rule_list, fused=False)
    with _accelerator(accel):
        a = fast.handle(direction, Line(raw))
    b = slow.handle(direction, Line(raw))
    assert [f.raw for f in a.forward] == [f.raw for f in b.forward]
    assert len(a.forward) == len(b.forward)
    for x, y in zip(a.forward, b.forward, strict=True):
        assert _same(x.message, y.message)
    _assert_same_rest(a, b, fast, slow)


@settings(max_examples=150, deadline=None)
@given(
    rule_list=rules(),
    raws=st.lists(frames(), min_size=1, max_size=6),
    direction=st.sampled_from(list(Direction)),
    accel=st.booleans(),
)
def test_the_fused_lane_of_a_block_gives_the_per_line_general_output(
    rule_list: list[Rule], raws: list[bytes], direction: Direction, accel: bool
) -> None:
    """Lines read together take the block path, where the fused lane (``Rewriter.lane``)
    answers the v2 notifications without the per-line steps: the bytes on the wire, the notes
    and the counters must be those of the general path fed the lines one by one."""
    lines = [raw.replace(b"\n", b" ") for raw in raws]  # one frame per line (JSON whitespace)
    fast = _connection(rule_list, fused=True)
    slow = _connection(rule_list, fused=False)
    block = b"\n".join(lines) + b"\n"
    with _accelerator(accel):
        a = fast.handle_many(direction, LineSplitter().feed_blocks(block), join=True)
    b = slow.handle_many(direction, [Line(line) for line in lines])
    assert b"\n".join(f.raw for f in a.forward) == b"\n".join(f.raw for f in b.forward)
    _assert_same_rest(a, b, fast, slow)


@settings(max_examples=150, deadline=None)
@given(
    rule_list=rules(),
    raws=st.lists(frames(), min_size=1, max_size=4),
    direction=st.sampled_from(list(Direction)),
    accel=st.booleans(),
    ws=st.sampled_from(["", " ", "\n "]),
)
def test_the_fused_path_in_a_batch_gives_the_general_paths_output(
    rule_list: list[Rule], raws: list[bytes], direction: Direction, accel: bool, ws: str
) -> None:
    """The entries of a batch take the fused path too (``acp_proxy.wire.connection.batches``): same
    array
    bytes, replies, notes and counters as the chain."""
    sep = ("," + ws).encode()
    batch = b"[" + ws.encode() + sep.join(raws) + b"]"
    fast = _connection(rule_list, fused=True)
    slow = _connection(rule_list, fused=False)
    with _accelerator(accel):
        a = fast.handle(direction, Line(batch))
    b = slow.handle(direction, Line(batch))
    assert [f.raw for f in a.forward] == [f.raw for f in b.forward]
    _assert_same_rest(a, b, fast, slow)


def test_the_lane_takes_block_lines_and_leaves_requests_to_the_tracker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block of an annotated update, a request and an update no rule matches: the update is
    spliced by the lane (no per-line ``Result``), the request is tracked, the rest is as read."""
    rule = Rule(
        name="edge-route",
        set_meta={"example.dev/route": "edge"},
        direction=RuleDirection.AGENT_TO_CLIENT,
        update_kinds=("tool_call_update",),
    )
    conn = _connection([rule], fused=True)
    update = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"tool_call_update","toolCallId":"t"}}}'
    )
    request = b'{"jsonrpc":"2.0","id":5,"method":"fs/read_text_file","params":{"path":"/a"}}'
    other = update.replace(b"tool_call_update", b"plan_update")
    lanes: list[bytes] = []
    real_lane = rewrite.Rewriter.lane

    def counting(self: rewrite.Rewriter, direction: Direction, raw: bytes, budget: int) -> Any:
        lanes.append(raw)
        return real_lane(self, direction, raw, budget)

    monkeypatch.setattr(rewrite.Rewriter, "lane", counting)
    out = conn.handle_many(
        Direction.AGENT_TO_CLIENT,
        LineSplitter().feed_blocks(b"\n".join([update, request, other]) + b"\n"),
        join=True,
    )
    assert b"\n".join(f.raw for f in out.forward) == b"\n".join(
        [update.replace(b'"t"}', b'"t","_meta":{"example.dev/route":"edge"}}'), request, other]
    )
    assert lanes == [update]  # the request holds "id"; the plan update holds no needle
    assert conn.pending_agent_requests == 1
    assert conn.stats.rewritten == 1
    assert conn.stats.agent_to_client_in == conn.stats.agent_to_client_out == 4  # + init reply


def test_the_fused_path_is_taken_for_the_bench_rule() -> None:
    """The bench's annotation rule on a compact and a spaced frame: answered without the
    middleware's ``__call__`` (no message built), same bytes as before the fused path."""
    rule = Rule(
        name="edge-route",
        set_meta={"example.dev/route": "edge"},
        direction=RuleDirection.AGENT_TO_CLIENT,
        method="session/update",
        update_kinds=("tool_call_update", "terminal_update"),
    )
    conn = _connection([rule], fused=True)
    middleware = conn.chain.links[0].middleware
    assert isinstance(middleware, RulesMiddleware)
    calls: list[Any] = []

    def counting(self: RulesMiddleware, message: Any, ctx: Any) -> Any:
        calls.append(message)
        return RulesMiddleware.__call__(self, message, ctx)

    middleware.__class__ = type("Counting", (RulesMiddleware,), {"__call__": counting})
    compact = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"tool_call_update","toolCallId":"t","_meta":{"a/b":1}}}}'
    )
    spaced = compact.replace(b",", b", ").replace(b'":', b'": ')
    out = conn.handle_many(Direction.AGENT_TO_CLIENT, [Line(compact), Line(spaced)])
    assert [f.raw for f in out.forward] == [
        compact.replace(b'{"a/b":1}', b'{"a/b":1,"example.dev/route":"edge"}'),
        spaced.replace(b'{"a/b": 1}', b'{"a/b": 1,"example.dev/route":"edge"}'),
    ]
    assert calls == []
    assert conn.stats.rewritten == 2


def test_the_fused_path_is_taken_for_the_example_configs_rules() -> None:
    """config/example.yaml's two rules (an entity rule on tool calls and a message-target rule on
    every update): each update is answered without the middleware's ``__call__``, and both
    `_meta` members are spliced in, also into a spaced frame and a chunk (the example config cost
    36 µs a message through the chain before the fused path)."""
    entity = Rule(
        name="edge-route",
        set_meta={"example.dev/route": "edge"},
        remove_meta=("zed.dev/debugMode",),
        direction=RuleDirection.AGENT_TO_CLIENT,
        method="session/update",
        update_kinds=("tool_call_update", "terminal_update"),
    )
    message = Rule(
        name="proxied-by",
        set_meta={"example.dev/proxy": "acp-proxy"},
        direction=RuleDirection.AGENT_TO_CLIENT,
        method="session/update",
        target=RuleTarget.MESSAGE,
    )
    conn = _connection([entity, message], fused=True)
    middleware = conn.chain.links[0].middleware
    assert isinstance(middleware, RulesMiddleware)
    calls: list[Any] = []

    def counting(self: RulesMiddleware, message: Any, ctx: Any) -> Any:
        calls.append(message)
        return RulesMiddleware.__call__(self, message, ctx)

    middleware.__class__ = type("Counting", (RulesMiddleware,), {"__call__": counting})
    tool = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"tool_call_update","toolCallId":"t","_meta":{"a/b":1}}}}'
    )
    spaced = tool.replace(b",", b", ").replace(b'":', b'": ')
    chunk = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"_meta":{"x/y":2},'
        b'"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":'
        b'{"type":"text","text":"hi"}}}}'
    )
    out = conn.handle_many(Direction.AGENT_TO_CLIENT, [Line(tool), Line(spaced), Line(chunk)])
    assert [f.raw for f in out.forward] == [
        tool.replace(
            b'{"a/b":1}}}',
            b'{"a/b":1,"example.dev/route":"edge","zed.dev/debugMode":null}},'
            b'"_meta":{"example.dev/proxy":"acp-proxy"}}',
        ),
        spaced.replace(
            b'{"a/b": 1}}}',
            b'{"a/b": 1,"example.dev/route":"edge","zed.dev/debugMode":null}},'
            b'"_meta":{"example.dev/proxy":"acp-proxy"}}',
        ),
        chunk.replace(b'{"x/y":2}', b'{"x/y":2,"example.dev/proxy":"acp-proxy"}'),
    ]
    assert calls == []
    assert conn.stats.rewritten == 3


@pytest.mark.parametrize("accel", [True, False])
@pytest.mark.parametrize("value", ["core", None])
def test_a_key_removed_and_set_again_moves_to_the_end_on_both_paths(
    accel: bool, value: JsonValue
) -> None:
    """Found by the property above: a message-target rule removes a key and a later one sets it
    again, on a canonical frame. The general path encodes the frame whole, the key now last;
    the fused path with the C splice kept the key where it was (same JSON, other bytes)."""
    a2c = RuleDirection.AGENT_TO_CLIENT
    rule_list = [
        Rule(name="r0", remove_meta=("example.dev/route",), target=RuleTarget.MESSAGE,
             direction=a2c),
        Rule(name="r1", set_meta={"example.dev/route": value}, target=RuleTarget.MESSAGE,
             direction=a2c),
    ]  # fmt: skip
    raw = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"_meta":'
        b'{"example.dev/route":"edge","example.dev/team":"edge"},"sessionId":"s",'
        b'"update":{"sessionUpdate":"agent_message","messageId":"m","content":[]}}}'
    )
    fast = _connection(rule_list, fused=True)
    slow = _connection(rule_list, fused=False)
    with _accelerator(accel):
        a = fast.handle(Direction.AGENT_TO_CLIENT, Line(raw))
    b = slow.handle(Direction.AGENT_TO_CLIENT, Line(raw))
    route = orjson.dumps(value).decode()
    expected = raw.replace(
        b'{"example.dev/route":"edge","example.dev/team":"edge"}',
        f'{{"example.dev/team":"edge","example.dev/route":{route}}}'.encode(),
    )
    assert [f.raw for f in a.forward] == [f.raw for f in b.forward] == [expected]
