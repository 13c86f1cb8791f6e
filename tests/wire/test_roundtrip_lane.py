"""The round trip's lane: ``Connection.handle_line``'s tracked step
against the general per-line path (``Connection.handle``), frame for frame.

The lane answers requests and responses that no middleware may act on in one step (parse, id,
request table) and gives everything else to the general path. These properties feed the same
generated conversation (requests, responses, notifications and junk, both ways, with odd ids,
repeated and escaped keys, full request tables, the ``initialize`` negotiation) to a connection
that takes the lane, as the shell does, and to one that never does, and require the same bytes
out, the same parsed messages, replies, notes and counters, and the same request tables (seen
through the ``-32603`` errors each would owe at exit, which echo every pending id's bytes).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.config import Config
from acp_proxy.rules.engine import Rule, RuleDirection, RulesMiddleware
from acp_proxy.shell.session.buffer_budget import READ_SIZE, BufferBudget
from acp_proxy.shell.session.pump import PumpSession
from acp_proxy.shell.streams.transports import FdStream
from acp_proxy.wire.chain import Chain, Direction, Link
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.lines import Lines
from acp_proxy.wire.connection.pipeline import AS_CAME, Connection, Result
from acp_proxy.wire.framing import Line
from acp_proxy.wire.raw import rawjson

C2A, A2C = Direction.CLIENT_TO_AGENT, Direction.AGENT_TO_CLIENT
MiB = 1024 * 1024

ID_TEXTS = ["1", "2", "-7", "0", "-0", "1.5", "2e3", '"a"', '"b"', "null", "true", "{}", "[1]",
            '"x\\"y"', "12345678901234567890123", "18446744073709551615",
            "-9223372036854775808"]  # fmt: skip
METHOD_TEXTS = ['"session/prompt"', '"initialize"', '"fs/read_text_file"', "5", "null"]
WS = st.sampled_from(["", " ", "\t", "  "])


@st.composite
def frame(draw: st.DrawFn) -> bytes:
    """One line: mostly requests and responses, some notifications, objects and junk."""
    ws = draw(WS)
    shape = draw(st.sampled_from(["request"] * 4 + ["result"] * 3 + ["error", "other"]))
    members = ['"jsonrpc":' + ws + '"2.0"']
    id_text = draw(st.sampled_from(ID_TEXTS))
    id_key = draw(st.sampled_from(['"id"'] * 12 + ['"\\u0069d"']))
    if draw(st.integers(0, 11)):
        members.append(id_key + ":" + ws + id_text)
    if shape == "request":
        members.append('"method":' + ws + draw(st.sampled_from(METHOD_TEXTS)))
        params = draw(st.sampled_from(['{"sessionId":"s"}', '{"id":3}', '{"x":[{"id":"n"}]}']))
        members.append('"params":' + ws + params)
    elif shape == "result":
        members.append('"result":' + ws + draw(st.sampled_from(
            ['{"protocolVersion":2}', '{"protocolVersion":1}', '{"messageId":"m"}', "null",
             '{"protocolVersion":"2"}']
        )))  # fmt: skip
    elif shape == "error":
        members.append('"error":{"code":-32603,"message":"no"}')
    else:
        members.append('"params":{"update":{"id":' + id_text + "}}")
    if draw(st.integers(0, 9)) == 0:  # a repeated key: the last one counts
        members.append(draw(st.sampled_from(['"id":9', '"method":"x"', '"result":{}'])))
    draw(st.randoms()).shuffle(members)
    text = "{" + ws + ("," + ws).join(members) + ws + "}"
    junk = draw(st.integers(0, 19))
    if junk == 0:
        text = text[: len(text) // 2]  # cut: not JSON
    elif junk == 1:
        text = "[" + text + "]"  # a batch of one
    elif junk == 2:
        text = " " + text  # a space before the opener
    return text.encode()


def _connection(
    *, rules: bool, max_pending: int, negotiate: bool, max_parse: int = 1 << 20
) -> Connection:
    chain = Chain([])
    if rules:
        rule = Rule(name="r", set_meta={"example.dev/route": "edge"},
                    direction=RuleDirection.BOTH, method="session/prompt")  # fmt: skip
        chain = Chain([Link(RulesMiddleware([rule]))])
    conn = Connection(chain, max_pending=max_pending, max_parse_bytes=max_parse)
    if negotiate:
        conn.handle(C2A, Line(b'{"jsonrpc":"2.0","id":0,"method":"initialize"}'))
        conn.handle(A2C, Line(b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2}}'))
    return conn


def _lane(conn: Connection, direction: Direction, raw: bytes) -> Result:
    """What the shell does with a line read alone: ``handle_line``, whose ``AS_CAME`` stands
    for the frame forwarded as it came."""
    got = conn.handle_line(direction, raw)
    if got is AS_CAME:
        return Result((OutFrame(raw, None, conn.version),))
    return got


def _owed(conn: Connection) -> tuple[list[bytes], list[bytes]]:
    """The request tables, as the errors each side would be owed (every pending id's bytes)."""
    client = [f.raw for chunk in conn.abort_pending("gone") for f in chunk]
    agent = [f.raw for chunk in conn.abort_agent_requests("gone") for f in chunk]
    return client, agent


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.tuples(st.sampled_from([C2A, A2C]), frame()), min_size=1, max_size=12),
    rules=st.booleans(),
    max_pending=st.sampled_from([1, 2, 1000]),
    negotiate=st.booleans(),
    max_parse=st.sampled_from([1 << 20, 1 << 20, 1500, 2000]),  # a budget near 33 bytes a byte
)
def test_the_lane_gives_the_general_paths_output(
    *,
    steps: list[tuple[Direction, bytes]],
    rules: bool,
    max_pending: int,
    negotiate: bool,
    max_parse: int,
) -> None:
    fast = _connection(
        rules=rules, max_pending=max_pending, negotiate=negotiate, max_parse=max_parse
    )
    slow = _connection(
        rules=rules, max_pending=max_pending, negotiate=negotiate, max_parse=max_parse
    )
    for direction, raw in steps:
        a = _lane(fast, direction, raw)
        b = slow.handle(direction, Line(raw))
        assert [f.raw for f in a.forward] == [f.raw for f in b.forward]
        for x, y in zip(a.forward, b.forward, strict=True):
            if x.message is not None:  # (the lane gives bytes only, as they came)
                assert rawjson.json_equal(x.message, y.message)
            assert x.version == y.version
        assert [f.raw for f in a.reply] == [f.raw for f in b.reply]
        assert a.notes == b.notes
        assert fast.stats == slow.stats
        assert fast.version == slow.version
    assert fast.pending_client_requests == slow.pending_client_requests
    assert fast.pending_agent_requests == slow.pending_agent_requests
    assert _owed(fast) == _owed(slow)


def test_the_lane_takes_requests_and_responses_and_leaves_the_rest() -> None:
    conn = _connection(rules=False, max_pending=1000, negotiate=True)
    request = b'{"jsonrpc":"2.0","id":"r1","method":"session/prompt","params":{}}'
    assert conn.handle_line(C2A, request) is AS_CAME
    assert conn.pending_client_requests == 1
    response = b'{"jsonrpc":"2.0","id":"r1","result":{"messageId":"m"}}'
    assert conn.handle_line(A2C, response) is AS_CAME
    assert conn.pending_client_requests == 0
    stats = (conn.stats.client_to_agent_in, conn.stats.agent_to_client_out)
    assert stats == (2, 2)  # the initialize exchange, then these two
    # Left to the general path (its own ``Result``), each counted once: a notification (no "id"
    # bytes), an unparsable line, an id with an escape (the general path reads its bytes).
    for raw in (
        b'{"jsonrpc":"2.0","method":"session/update","params":{}}',
        b'{"jsonrpc":"2.0","id":1,',
        b'{"jsonrpc":"2.0","\\u0069d":1,"method":"m"}',
    ):
        assert conn.handle_line(C2A, raw) is not AS_CAME
    assert conn.stats.client_to_agent_in == 2 + 3
    # A full table: the general path's refusal.
    full = _connection(rules=False, max_pending=1, negotiate=False)
    assert full.handle_line(C2A, b'{"jsonrpc":"2.0","id":1,"method":"m"}') is AS_CAME
    refused = full.handle_line(C2A, b'{"jsonrpc":"2.0","id":2,"method":"m"}')
    assert refused is not AS_CAME
    assert refused.forward == ()
    assert refused.reply[0].raw.startswith(b'{"jsonrpc":"2.0","id":2,"error":{"code":-32603,')


@pytest.mark.parametrize("rules", [False, True])
def test_the_initialize_response_negotiates_on_the_general_path(rules: bool) -> None:
    conn = _connection(rules=rules, max_pending=1000, negotiate=False)
    request = b'{"jsonrpc":"2.0","id":0,"method":"initialize"}'
    # The request too: its id is kept for its response (``LinkInterest.watch``).
    assert conn.handle_line(C2A, request) is not AS_CAME
    assert conn.version is None
    response = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2}}'
    assert conn.handle_line(A2C, response) is not AS_CAME  # the negotiation: not the lane's
    assert conn.version == 2
    assert conn.pending_client_requests == 0


# --- the shell's side: PumpSession over real pipes (FdStream's readiness callback) -------------


class _Pipes:
    """A session's four pipe ends as the proxy holds them, and the test's ends."""

    def __init__(self) -> None:
        self.c2p_r, self.c2p_w = os.pipe()  # the client writes requests here
        self.p2c_r, self.p2c_w = os.pipe()  # and reads responses here
        self.p2a_r, self.p2a_w = os.pipe()  # the agent reads requests here
        self.a2p_r, self.a2p_w = os.pipe()  # and writes responses here
        self.client = FdStream(self.c2p_r, self.p2c_w)
        self.agent = FdStream(self.a2p_r, self.p2a_w)
        for fd in (self.p2c_r, self.p2a_r, self.c2p_w):
            os.set_blocking(fd, False)

    async def send(self, fd: int, data: bytes) -> None:
        """Write all of ``data`` without blocking the event loop the proxy runs on."""
        view = memoryview(data)
        with anyio.fail_after(10):
            while view:
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    await anyio.sleep(0.001)

    def read(self, fd: int) -> bytes:
        """What ``fd`` holds now (its non-blocking test end)."""
        try:
            return os.read(fd, 1 << 20)
        except BlockingIOError:
            return b""

    async def expect(self, fd: int, data: bytes) -> None:
        """Read ``fd`` until ``len(data)`` bytes came, and require exactly ``data``."""
        got = b""
        with anyio.fail_after(10):
            while len(got) < len(data):
                got += self.read(fd)
                await anyio.sleep(0.0005)
        assert got == data

    def close_test_ends(self) -> None:
        for fd in (self.c2p_w, self.p2c_r, self.p2a_r, self.a2p_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _request(i: int, pad: int = 0) -> bytes:
    params = b'{"sessionId":"s","prompt":[{"type":"text","text":"' + b"p" * pad + b'"}]}'
    return b'{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":%s}' % (i, params)


def _response(i: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"result":{"messageId":"m%d"}}' % (i, i)


async def _until(check: Callable[[], bool]) -> None:
    with anyio.fail_after(10):
        while not check():
            await anyio.sleep(0.001)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # FdStream's watch is asyncio-only
async def test_round_trips_over_pipes_take_the_lane_and_keep_the_budget_exact(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 sequential round trips through a session on real pipes: every frame arrives byte
    for byte, none goes through a general path (the lane took them all, on the readiness
    callback), and the budget and the request table are back to zero at the end. Midway,
    another holder fills the budget: the next read waits instead of keeping its reservation
    (``BufferBudget.keep_read``), and resumes, losing nothing, once the budget is released."""
    general = 0

    def counted(owner: type[Any], name: str) -> None:
        original = getattr(owner, name)

        def counting(self: object, *args: Any, **kwargs: Any) -> Result:
            nonlocal general
            general += 1
            return original(self, *args, **kwargs)  # type: ignore[no-any-return]

        monkeypatch.setattr(owner, name, counting)

    # The general paths: the line path's two ends, and the many-frames path.
    for owner, name in ((Lines, "agent"), (Lines, "client"), (Connection, "handle_many")):
        counted(owner, name)
    budget = BufferBudget(8 * MiB, 2 * MiB + READ_SIZE)
    p = _Pipes()
    session = PumpSession(Config(), p.client, p.client, p.agent, p.agent, budget=budget)
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.run)
        # Both readers parked on their pipes first (a reader's very first read is its own).
        await _until(
            lambda: None not in (session.from_client.receiving, session.from_agent.receiving)
        )
        for i in range(1, 301):
            if i == 150:  # another session holds all the budget's room for reads, and one byte
                await _until(lambda: session.from_client.receiving is not None)
                waits = budget.waits
                pressure = budget.limit - budget.reserve - budget.held + 1
                budget.add(pressure)
            await p.send(p.c2p_w, _request(i) + b"\n")
            await p.expect(p.p2a_r, _request(i) + b"\n")
            if i == 150:  # the reader did not keep its read: it waits for the budget
                await _until(lambda: budget.waits > waits)  # noqa: B023 - awaited here
                budget.add(-pressure)
            os.write(p.a2p_w, _response(i) + b"\n")
            await p.expect(p.p2c_r, _response(i) + b"\n")
        assert session.connection.pending_client_requests == 0
        p.close_test_ends()
    assert general == 0
    assert budget.held == 0
    assert session.connection.stats.client_to_agent_in == 300


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_lane_leaves_what_a_full_pipe_did_not_take_to_the_writer(
    anyio_backend: str,
) -> None:
    """Requests of 60 KB toward an agent that does not read: the lane writes what the pipe
    takes and leaves the rest as the outbox's tail (then the queue); once the agent reads,
    every request arrives whole and in order, and the budget is back to zero."""
    budget = BufferBudget(64 * MiB, 2 * MiB + READ_SIZE)
    p = _Pipes()
    session = PumpSession(Config(), p.client, p.client, p.agent, p.agent, budget=budget)
    sent = [_request(i, pad=60_000) + b"\n" for i in range(1, 41)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.run)
        await _until(
            lambda: None not in (session.from_client.receiving, session.from_agent.receiving)
        )
        await p.send(p.c2p_w, sent[0])  # the agent's pipe takes it whole: 4 KB room left
        await _until(lambda: session.connection.stats.client_to_agent_out == 1)
        await p.send(p.c2p_w, sent[1])  # one read, one line: the lane, which writes 4 KB of it
        await _until(lambda: session.connection.stats.client_to_agent_out == 2)
        # The rest is the outbox's (its tail, then the writer's send in flight), and the budget
        # counts it: both readers' reserved reads plus exactly what the outbox holds.
        assert len(session.to_agent.queue) == 0
        held = session.to_agent.held()
        assert 0 < held < len(sent[1])
        assert budget.held == 2 * READ_SIZE + held
        for frame in sent[2:]:
            await p.send(p.c2p_w, frame)
        await _until(lambda: len(session.to_agent.queue) > 0)
        partial = session.from_client.splitter.buffered  # a line half read
        assert budget.held == 2 * READ_SIZE + session.to_agent.held() + partial
        await p.expect(p.p2a_r, b"".join(sent))
        p.close_test_ends()
    assert budget.held == 0


class _Waiter:
    """A budget waiter's event, recording whether it was woken."""

    def __init__(self) -> None:
        self.woken = False

    def set(self) -> None:
        self.woken = True


@settings(max_examples=300, deadline=None)
@given(
    held=st.integers(READ_SIZE, 8 * MiB),
    owner=st.sampled_from(["nobody", "reader", "another"]),
    waiting=st.booleans(),
)
def test_keeping_a_read_is_exactly_giving_it_back_and_reserving_it_again(
    held: int, owner: str, waiting: bool
) -> None:
    """``BufferBudget.keep_read`` is True exactly when what the lane skips (give the read back,
    release the reserve, reserve the next read) would succeed and change nothing: the same bytes
    held, the same owner, no waiter woken."""
    reader, another = object(), object()
    owners = {"nobody": None, "reader": reader, "another": another}

    def budget() -> tuple[BufferBudget, list[_Waiter]]:
        b = BufferBudget(8 * MiB, 2 * MiB + READ_SIZE)
        b.held = held
        b._owner = owners[owner]
        waiters = [_Waiter()] if waiting else []
        b._waiters = list(waiters)  # type: ignore[arg-type]
        return b, waiters

    kept, _ = budget()
    keep = kept.keep_read(reader)
    assert (kept.held, kept._owner) == (held, owners[owner])  # a question, not a change
    skipped, waiters = budget()
    skipped.add(-READ_SIZE)
    skipped.release_owner(reader)
    again = skipped.try_reserve_read(reader, 0)
    unchanged = (
        again
        and skipped.held == held
        and skipped._owner is owners[owner]
        and not any(w.woken for w in waiters)
    )
    assert keep == unchanged
