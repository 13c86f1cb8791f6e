"""Tests for acp_proxy.wire.chain: verdicts, the flat-map of replacements, failure isolation, the
needle prefilter and its escape rule, and rule names in ``changed_by``."""

from __future__ import annotations

import pytest

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.wire.chain import (
    FORWARD,
    BaseMiddleware,
    Chain,
    Direction,
    Drop,
    Link,
    MessageContext,
    MiddlewareFailure,
    Outcome,
    Replace,
    Reply,
    Verdict,
    needle_escapes,
)
from acp_proxy.wire.errors import error_object

CTX = MessageContext(Direction.AGENT_TO_CLIENT, 2)
REQ: JsonObject = {"jsonrpc": "2.0", "id": 7, "method": "x/do", "params": {}}
NOTE: JsonObject = {"jsonrpc": "2.0", "method": "x/note", "params": {"n": 1}}


class Fixed(BaseMiddleware):
    def __init__(self, verdict: Verdict, needles: tuple[bytes, ...] | None = None) -> None:
        self.verdict = verdict
        self.needles = needles
        self.seen: list[JsonObject] = []

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        self.seen.append(message)
        return self.verdict


class Boom(BaseMiddleware):
    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        raise ValueError("nope")


class Named(BaseMiddleware):
    """Replaces and names the parts that acted, like the rules middleware."""

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        self.last_changed_by = ("edge-route", "trace")
        return Replace(({**message, "tag": 1},))


def test_forward_keeps_the_message_unchanged() -> None:
    out = Chain([Link(Fixed(FORWARD))]).run(NOTE, CTX)
    assert out == Outcome((NOTE,))


def test_replace_feeds_every_message_to_the_next_link() -> None:
    a: JsonObject = {"id": 1}
    b: JsonObject = {"id": 2}
    second = Fixed(FORWARD)
    out = Chain([Link(Fixed(Replace((a, b)))), Link(second)]).run(NOTE, CTX)
    assert out.messages == (a, b) and out.changed and out.changed_by == ("Fixed",)
    assert second.seen == [a, b]


def test_replace_with_replies_forwards_and_answers_the_sender() -> None:
    cancel: JsonObject = {"jsonrpc": "2.0", "method": "session/cancel", "params": {}}
    second = Fixed(FORWARD)
    out = Chain([Link(Fixed(Replace((NOTE,), replies=(cancel,)))), Link(second)]).run(NOTE, CTX)
    assert out == Outcome((NOTE,), (cancel,), True, ("Fixed",))
    assert second.seen == [NOTE]


def test_links_that_want_it_see_the_initialize_request() -> None:
    class Watcher(BaseMiddleware):
        def __init__(self) -> None:
            self.requests: list[JsonObject] = []

        def on_initialize_request(self, request: JsonObject) -> None:
            self.requests.append(request)

    watcher = Watcher()
    Chain([Link(Fixed(FORWARD)), Link(watcher)]).initialize_requested(REQ)
    assert watcher.requests == [REQ]


def test_drop_and_reply_stop_the_chain() -> None:
    after = Fixed(FORWARD)
    dropped = Chain([Link(Fixed(Drop("no"))), Link(after)]).run(NOTE, CTX)
    assert dropped == Outcome((), (), True, (), "Fixed", ())
    answer = error_object(7, -32601, "no")
    replied = Chain([Link(Fixed(Reply(answer))), Link(after)]).run(REQ, CTX)
    assert replied == Outcome((), (answer,), True, (), "Fixed", ())
    assert after.seen == []


def test_fail_open_forwards_unchanged_and_reports() -> None:
    out = Chain([Link(Boom())]).run(REQ, CTX)
    assert out == Outcome((REQ,), failures=(MiddlewareFailure("Boom", "ValueError: nope", False),))


def test_fail_closed_drops_and_answers_a_request() -> None:
    out = Chain([Link(Boom(), fail_closed=True)]).run(REQ, CTX)
    assert out.messages == () and out.dropped_by == "Boom"
    assert out.replies == (error_object(7, -32603, "acp-proxy: middleware Boom failed"),)
    note = Chain([Link(Boom(), fail_closed=True)]).run(NOTE, CTX)
    assert note.messages == () and note.replies == ()  # a notification gets no answer


def test_changed_by_names_the_parts_that_acted() -> None:
    out = Chain([Link(Named()), Link(Fixed(Replace(({"x": 1},))))]).run(NOTE, CTX)
    assert out.changed_by == ("Named:edge-route", "Named:trace", "Fixed")


@pytest.mark.parametrize(
    ("needles", "escapes"),
    [
        ([(b'"tool_call_update"',)], (b"\\u",)),
        ([(b'"session/update"',)], (b"\\u", b"\\/")),
        ([None, (b'"a"',)], (b"\\u",)),
        ([], ()),  # no needle to hide: a link handed its requests by name has none
        ([()], ()),
    ],
)
def test_needle_escapes(
    needles: list[tuple[bytes, ...] | None], escapes: tuple[bytes, ...]
) -> None:
    assert needle_escapes(needles) == escapes


@pytest.mark.parametrize(
    ("raw", "wanted"),
    [
        (b'{"method":"session/update"}', (True, False)),
        (b'{"method":"session\\/update"}', (True, True)),  # an escape: every link may want it
        (b'{"method":"x","t":"\\u0041"}', (True, True)),  # ``\u`` may hide any needle
        (b'{"method":"x"}', (False, False)),
    ],
)
def test_interested_prefilter(raw: bytes, wanted: tuple[bool, bool]) -> None:
    chain = Chain(
        [Link(Fixed(FORWARD, (b'"session/update"',))), Link(Fixed(FORWARD, (b'"kind"',)))]
    )
    assert chain.interested(raw) == wanted
    assert chain.wants(raw) is any(wanted)
