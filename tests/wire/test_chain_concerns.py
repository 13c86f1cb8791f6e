"""A middleware that declares its concerns: handed its requests by method (in a batch too),
told of the responses it asked for, never looked for in other frames; its marks and the
replies it sends while forwarding (``Forward(replies=...)``)."""

from __future__ import annotations

from typing import Any

import orjson

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.wire.chain import (
    Chain,
    Concerns,
    Direction,
    Forward,
    Link,
    MessageContext,
    Verdict,
)
from acp_proxy.wire.connection.pipeline import AS_CAME, Connection
from acp_proxy.wire.framing import Line

C2A, A2C = Direction.CLIENT_TO_AGENT, Direction.AGENT_TO_CLIENT


class Concerned:
    """Handed ``x/ask`` from the agent by name; told of ``x/open``'s responses; marks and
    answers with a notification what it is handed."""

    needles: tuple[bytes, ...] = ()
    concerns = Concerns(frozenset({(A2C, "x/ask")}), frozenset({"x/open"}))

    def __init__(self) -> None:
        self.seen: list[JsonObject] = []
        self.answers: list[tuple[str, JsonObject]] = []
        self.marks: list[object] = []

    @property
    def name(self) -> str:
        return "concerned"

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        self.seen.append(message)
        self.marks.append(("seen", message.get("id")))
        if message.get("id") == "boom":
            raise ValueError("boom")
        return Forward(replies=({"jsonrpc": "2.0", "method": "x/noted", "params": {}},))

    def on_answer(self, method: str, response: JsonObject) -> None:
        self.answers.append((method, response))


def frame(message: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", **message})


def negotiated(mw: Concerned, max_pending: int = 100) -> Connection:
    conn = Connection(Chain([Link(mw)]), max_pending=max_pending)
    conn.handle(C2A, Line(frame({"id": 0, "method": "initialize", "params": {}})))
    conn.handle(A2C, Line(frame({"id": 0, "result": {"protocolVersion": 1}})))
    return conn


def test_the_chain_routes_by_method_and_collects_marks_and_replies() -> None:
    mw = Concerned()
    chain = Chain([Link(mw)])
    assert chain.routes[A2C] == {"x/ask": (True,)}
    assert chain.routes[C2A] == {}
    assert chain.answers == frozenset({"x/open"})
    assert chain.interested(b'{"method":"x/ask"}') == (False,)  # no needle: never by bytes
    ask: JsonObject = {"jsonrpc": "2.0", "id": 1, "method": "x/ask"}
    out = chain.run(ask, MessageContext(A2C, 1))
    assert (out.messages, out.replies, out.changed) == (
        (ask,),
        ({"jsonrpc": "2.0", "method": "x/noted", "params": {}},),
        False,
    )
    assert out.marks == (("seen", 1),)
    assert mw.marks == []  # taken by the chain
    failed = chain.run({"jsonrpc": "2.0", "id": "boom", "method": "x/ask"}, MessageContext(A2C, 1))
    assert (failed.marks, mw.marks) == ((), [])  # a failed call's marks are dropped
    assert failed.failures


def test_a_routed_request_reaches_its_link_and_nothing_else_does() -> None:
    mw = Concerned()
    conn = negotiated(mw)
    other = frame({"id": 2, "method": "x/other", "params": {}})
    assert conn.handle_line(A2C, other) is AS_CAME  # the round trip's lane
    ask = frame({"id": 3, "method": "x/ask", "params": {}})
    result = conn.handle_line(A2C, ask)
    assert result is not AS_CAME
    assert [f.raw for f in result.forward] == [ask]
    assert [f.raw for f in result.reply] == [b'{"jsonrpc":"2.0","method":"x/noted","params":{}}']
    # In a batch, the routed entry only.
    batch = b"[" + frame({"id": 4, "method": "x/ask"}) + b"," + frame({"method": "x/n"}) + b"]"
    conn.handle(A2C, Line(batch))
    assert [m.get("id") for m in mw.seen] == [3, 4]
    # Not from the other side.
    conn.handle(C2A, Line(frame({"id": 5, "method": "x/ask"})))
    assert [m.get("id") for m in mw.seen] == [3, 4]


def test_a_watched_response_is_told_to_its_link_and_the_table_is_bounded() -> None:
    mw = Concerned()
    conn = negotiated(mw, max_pending=8)
    conn.handle(C2A, Line(frame({"id": 7, "method": "x/open", "params": {}})))
    response = frame({"id": 7, "result": {"sessionId": "s"}})
    assert conn.handle_line(A2C, response) is not AS_CAME  # the general path
    assert mw.answers == [("x/open", {"jsonrpc": "2.0", "id": 7, "result": {"sessionId": "s"}})]
    # A response to another request is not told.
    conn.handle(C2A, Line(frame({"id": 8, "method": "x/other"})))
    conn.handle(A2C, Line(frame({"id": 8, "result": {}})))
    assert len(mw.answers) == 1
    # Requests never answered do not pile up past the request table's bound.
    for i in range(20):
        conn.handle(C2A, Line(frame({"id": f"o{i}", "method": "x/open"})))
    assert 0 < len(conn._watched) <= 8
