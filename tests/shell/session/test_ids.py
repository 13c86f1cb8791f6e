"""Request ids that are value-equal or repeated never lose an answer; a second ``initialize``.

A client bug (``1`` and ``1.0`` in flight at once, the same id twice) must not collapse the
table of requests in flight: each request that crossed the proxy gets exactly one response or
error, also when the agent dies. The errors echo each request's id as it was spelled.

A second ``initialize`` is forwarded (the agent decides what it means) and logged; the session
keeps the version the first one negotiated, so a second answer naming another version cannot
switch the proxy's rules to another protocol mid-session.
"""

from __future__ import annotations

import sys

import orjson
import pytest
from proxy_harness import FAKE_AGENT, init_response, request, run

from acp_proxy.wire.chain import Chain, Direction
from acp_proxy.wire.connection.pipeline import Connection, UnusualVersion
from acp_proxy.wire.connection.tracking import RequestTracker
from acp_proxy.wire.framing import Line

C2A = Direction.CLIENT_TO_AGENT
A2C = Direction.AGENT_TO_CLIENT
PROXY = [sys.executable, "-m", "acp_proxy", "--log-format", "json"]


def _line(text: str) -> Line:
    return Line(text.encode())


def _errors(conn: Connection, reason: str) -> list[bytes]:
    return [f.raw for chunk in conn.abort_pending(reason) for f in chunk]


def _initialized() -> Connection:
    conn = Connection(Chain([]))
    conn.handle(C2A, _line('{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}'))
    conn.handle(A2C, _line('{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2}}'))
    return conn


def test_value_equal_ids_in_flight_each_get_an_error() -> None:
    conn = _initialized()
    conn.handle(C2A, _line('{"jsonrpc":"2.0","id":1,"method":"a"}'))
    conn.handle(C2A, _line('{"jsonrpc":"2.0","id":1.0,"method":"b"}'))
    assert conn.pending_client_requests == 2
    assert _errors(conn, "agent exited with status 1") == [
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32603,'
        b'"message":"agent exited with status 1 during a"}}',
        b'{"jsonrpc":"2.0","id":1.0,"error":{"code":-32603,'
        b'"message":"agent exited with status 1 during b"}}',
    ]


def test_a_repeated_id_answered_once_leaves_one_error_owed() -> None:
    conn = _initialized()
    conn.handle(C2A, _line('{"jsonrpc":"2.0","id":7,"method":"a"}'))
    conn.handle(C2A, _line('{"jsonrpc":"2.0","id":7,"method":"b"}'))
    conn.handle(A2C, _line('{"jsonrpc":"2.0","id":7,"result":{}}'))  # answers the oldest
    assert conn.pending_client_requests == 1
    assert _errors(conn, "agent exited with status 1") == [
        b'{"jsonrpc":"2.0","id":7,"error":{"code":-32603,'
        b'"message":"agent exited with status 1 during b"}}'
    ]


def test_the_tracker_counts_every_request_in_its_bound() -> None:
    t = RequestTracker(max_pending=2)
    assert t.admit(C2A, 1, "a", b"1")
    assert t.admit(C2A, 1.0, "b", b"1.0")
    assert not t.admit(C2A, 1, "c", b"1")  # two in flight: the table is full
    assert t.answer(C2A, 1) == ("a", b"1")
    assert t.answer(C2A, 1) == ("b", b"1.0")
    assert t.answer(C2A, 1) is None and t.waiting(C2A) == 0


def test_a_second_initialize_keeps_the_negotiated_version() -> None:
    conn = _initialized()
    assert conn.version == 2
    conn.handle(C2A, _line('{"jsonrpc":"2.0","id":9,"method":"initialize","params":{}}'))
    answer = '{"jsonrpc":"2.0","id":9,"result":{"protocolVersion":1}}'
    res = conn.handle(A2C, _line(answer))
    assert conn.version == 2
    assert [f.raw for f in res.forward] == [answer.encode()]  # forwarded untouched
    assert res.notes == (
        UnusualVersion(
            "1",
            "a second initialize answered: the session keeps version 2, negotiated first",
        ),
    )


@pytest.mark.anyio
async def test_value_equal_ids_get_an_error_each_when_the_agent_dies() -> None:
    """Real processes: the agent reads both requests, answers neither, and exits 1."""
    frames = [
        request(0, "initialize", {}),
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":{}}\n',
        b'{"jsonrpc":"2.0","id":1.0,"method":"y","params":{}}\n',
    ]
    agent = [sys.executable, str(FAKE_AGENT), "--silent-after", "1", "--crash-after", "3"]
    ran = await run([*PROXY, "--", *agent, "--exit-code", "1"], b"".join(frames))
    lines = ran.stdout.splitlines(keepends=True)
    assert lines[0] == init_response(0)
    errors = sorted(lines[1:])
    assert [orjson.loads(e)["error"]["message"] for e in errors] == [
        "agent exited with status 1 during x",
        "agent exited with status 1 during y",
    ]
    assert sorted(e.split(b',"error"')[0] for e in errors) == [
        b'{"jsonrpc":"2.0","id":1',
        b'{"jsonrpc":"2.0","id":1.0',
    ]
