"""What may happen on a ``--listen`` socket before a session starts.

Cross-protocol requests (an HTTP request, which any web page can make a browser send to a
loopback port) are refused with a 403 before any agent exists; a client that sends no first line
within ``handshake_timeout`` is closed with a JSON-RPC error line and frees its slot; a client
over ``--max-connections`` always reads the refusal line, never a reset. Real loopback TCP, real
Unix sockets, the real CLI as a subprocess; the opening reader itself is tested as a pure object.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import anyio
import anyio.abc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from listen_harness import PROXY, TIMEOUT, TINY, Proxy, exchange, listening
from proxy_harness import FAKE_AGENT, Lines, init_response, request, run, write_config

from acp_proxy.shell.sockets.opening import (
    OPENING_HOLD_BYTES,
    Opening,
    OpeningReader,
    http_forbidden,
)

INIT = request(1, "initialize", {"protocolVersion": 2})
FORBIDDEN = (
    b"HTTP/1.1 403 Forbidden\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 100\r\n"
    b"Connection: close\r\n"
    b"\r\n"
    b"acp-proxy: this socket speaks ACP (newline-delimited JSON-RPC), not HTTP; "
    b"HTTP requests are refused\n"
)


def refusal(limit: int) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"acp-proxy: too many '
        b'connections (max_connections %d); try again later"}}\n' % limit
    )


def handshake_error(timeout: str) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"acp-proxy: no request '
        b"within " + timeout.encode() + b" s of connecting (handshake_timeout); closing the "
        b'connection"}}\n'
    )


# -- pure: the opening reader -------------------------------------------------------------------


def feed_all(chunks: list[bytes], limit: int = 1000) -> tuple[list[Opening], bytes, str]:
    reader = OpeningReader(limit)
    verdicts = [reader.feed(chunk) for chunk in chunks]
    return verdicts, bytes(reader.buffer), reader.method


M, F, H = Opening.MORE, Opening.FRAME, Opening.HTTP


@pytest.mark.parametrize(
    ("chunks", "verdicts", "buffer", "method"),
    [
        ([b"GET / HTTP/1.1\r\n"], [H], b"GET / HTTP/1.1\r\n", "GET"),
        ([b"POST /x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"], [H], None, "POST"),
        ([b"OPTIONS * HTTP/1.1\r\n"], [H], None, "OPTIONS"),
        ([b"PUT / HTTP/1.1\r\n"], [H], None, "PUT"),
        ([b"HEAD / HTTP/1.0\r\n"], [H], None, "HEAD"),
        ([b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n"], [H], None, "CONNECT"),
        ([b"DELETE / HTTP/1.1\r\n"], [H], None, "DELETE"),
        ([b"PATCH / HTTP/1.1\r\n"], [H], None, "PATCH"),
        ([b"TRACE / HTTP/1.1\r\n"], [H], None, "TRACE"),
        ([b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"], [H], None, "PRI"),
        # Split anywhere: undecided until the token is complete.
        ([b"P", b"O", b"ST", b" / HTTP/1.1"], [M, M, M, H], b"POST / HTTP/1.1", "POST"),
        ([b"PRI * HTT", b"P/2.0\r\n"], [M, H], None, "PRI"),
        # Blank lines before the request line (RFC 9112 section 2.2 lets servers skip them).
        ([b"\r\n", b"\r\nGET / HTTP/1.1\r\n"], [M, H], b"GET / HTTP/1.1\r\n", "GET"),
        # JSON-RPC: decided at the end of the first line, every byte kept.
        ([INIT], [F], INIT, ""),
        ([INIT[:10], INIT[10:30], INIT[30:]], [M, M, F], INIT, ""),
        ([b'{"a":1}\n{"b":2}\n'], [F], b'{"a":1}\n{"b":2}\n', ""),
        # Blank lines before it are dropped (framing drops them too); its own spaces are not.
        ([b"\n \r\n\t\n", b'  {"a":1}\r\n'], [M, F], b'  {"a":1}\r\n', ""),
        ([b" \n \n", b" ", b" ", b"\n"], [M, M, M, M], b"", ""),
        # Near misses are not HTTP: lower case, no space, a different token.
        ([b"get / HTTP/1.1\r\n"], [F], None, ""),
        ([b"GET\n"], [F], None, ""),
        ([b"POSTMAN\n"], [F], None, ""),
        ([b"PRI * HTTP/1.1\n"], [F], None, ""),
        ([b"GE", b"\n"], [M, F], b"GE\n", ""),
        # A first line longer than the limit is handed over (the session rejects it).
        ([b"{" + b"x" * 999, b"x"], [M, F], b"{" + b"x" * 1000, ""),
        ([b" " * 1001], [F], b" " * 1001, ""),
    ],
)
def test_opening_reader(
    chunks: list[bytes], verdicts: list[Opening], buffer: bytes | None, method: str
) -> None:
    got_verdicts, got_buffer, got_method = feed_all(chunks)
    assert (got_verdicts, got_method) == (verdicts, method)
    assert got_buffer == (b"".join(chunks) if buffer is None else buffer)


@pytest.mark.parametrize(
    ("chunks", "verdict"),
    [
        ([], Opening.EMPTY),
        ([b"\n\r\n  "], Opening.EMPTY),
        ([b"PO"], Opening.FRAME),  # never became "POST ": a (non-JSON) line, not HTTP
        ([b'{"jsonrpc":"2.0","id":1,"method":"x"}'], Opening.FRAME),  # unterminated last line
    ],
)
def test_opening_reader_at_eof(chunks: list[bytes], verdict: Opening) -> None:
    reader = OpeningReader(1000)
    for chunk in chunks:
        assert reader.feed(chunk) is Opening.MORE
    assert reader.end() is verdict


PIECES = [b"\n", b"\r\n", b" ", b"\t", b"GET ", b"POST / HTTP/1.1\r\n", b"PRI * HTTP/2", b"P"]
PIECES += [b"PO", b"{", b'"id":1}', INIT, b"get ", b"x"]


@given(
    st.lists(st.sampled_from(PIECES), max_size=8),
    st.lists(st.integers(min_value=1, max_value=40), max_size=12),
)
def test_opening_reader_any_chunking(pieces: list[bytes], cuts: list[int]) -> None:
    """Any chunking of the same bytes gives the same verdict; what the session receives (the
    buffer, then the bytes not read yet) is the stream without its leading blank lines."""
    stream = b"".join(pieces)
    whole = OpeningReader(1_000_000)
    expected = whole.feed(stream) if stream else Opening.MORE
    if expected is Opening.MORE:
        expected = whole.end()
    reader = OpeningReader(1_000_000)
    verdict, at = Opening.MORE, 0
    for cut in [*cuts, len(stream)]:
        if verdict is not Opening.MORE or at >= len(stream):
            break
        verdict = reader.feed(stream[at : at + cut])
        at += cut
    if verdict is Opening.MORE:
        verdict = reader.end()
    assert verdict is expected
    assert reader.method == whole.method
    if verdict is Opening.FRAME:
        lead = len(stream) - len(stream.lstrip(b" \t\r\n"))
        dropped = stream.rfind(b"\n", 0, lead) + 1
        assert bytes(reader.buffer) + stream[at:] == stream[dropped:]


def test_http_forbidden_is_a_complete_response() -> None:
    assert http_forbidden() == FORBIDDEN
    head, _, body = FORBIDDEN.partition(b"\r\n\r\n")
    assert f"Content-Length: {len(body)}".encode() in head


# -- HTTP on the socket -------------------------------------------------------------------------


def browser_post(port: int) -> bytes:
    """What a web page's ``fetch(..., {method: "POST", mode: "no-cors", body})`` makes a
    browser send: a simple request (no preflight) whose body is two JSON-RPC lines."""
    body = INIT + request(2, "session/new", {"cwd": "/", "mcpServers": []})
    return (
        b"POST / HTTP/1.1\r\n"
        b"Host: 127.0.0.1:%d\r\n"
        b"Origin: https://attacker.example\r\n"
        b"Content-Type: text/plain;charset=UTF-8\r\n"
        b"Content-Length: %d\r\n"
        b"\r\n" % (port, len(body))
    ) + body


HTTP_REQUESTS = [
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    b"OPTIONS / HTTP/1.1\r\nHost: 127.0.0.1\r\nAccess-Control-Request-Method: PUT\r\n\r\n",
    b"PUT / HTTP/1.1\r\nContent-Length: 3\r\n\r\n{}\n",
    b"HEAD / HTTP/1.1\r\n\r\n",
    b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n",
    b"DELETE / HTTP/1.1\r\n\r\n",
    b"PATCH / HTTP/1.1\r\n\r\n",
    b"TRACE / HTTP/1.1\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
]


async def ask_over_http(proxy: Proxy, data: bytes) -> bytes:
    """Send ``data`` and read the answer. The half-close only makes a proxy that forwards the
    request (main) end the session, so the test fails with the agent's answers, not a hang."""
    stream = await proxy.connect()
    await stream.send(data)
    await stream.send_eof()
    answer = await Lines(stream).rest()
    await stream.aclose()
    return answer


@pytest.mark.anyio
async def test_http_requests_never_reach_an_agent(tmp_path: Path) -> None:
    """Before the guard, the agent answered initialize and session/new sent as the body
    of a browser's POST. Now every HTTP opening gets the 403 and no agent is even started."""
    record = tmp_path / "agent-input.log"
    agent = [sys.executable, str(FAKE_AGENT), "--record", str(record)]
    with anyio.fail_after(TIMEOUT):
        async with listening("--listen", "tcp://127.0.0.1:0", agent=agent) as proxy:
            port = int((await proxy.address()).rpartition(":")[2])
            assert await ask_over_http(proxy, browser_post(port)) == FORBIDDEN
            for data in HTTP_REQUESTS:
                assert await ask_over_http(proxy, data) == FORBIDDEN
            # A client that connects and leaves without a word costs no agent either.
            silent = await proxy.connect()
            await silent.aclose()
            await proxy.event("connection closed", conn=len(HTTP_REQUESTS) + 2)
            assert proxy.count("agent started") == 0
            assert not record.exists()
            # An ACP client on the same port is served as before.
            stream = await proxy.connect()
            lines = Lines(stream)
            assert await exchange(lines, stream, INIT) == init_response(1)
            await stream.send_eof()
            assert await lines.rest() == b""
            await stream.aclose()
            await proxy.event("connection closed", conn=len(HTTP_REQUESTS) + 3)
            proxy.terminate()
            assert await proxy.wait() == 0
    assert record.read_bytes() == INIT
    methods = ["POST", "GET", "OPTIONS", "PUT", "HEAD", "CONNECT", "DELETE", "PATCH", "TRACE"]
    methods.append("PRI")
    warned = {
        e["conn"]: e["method"]
        for e in proxy.events
        if e["event"].startswith("HTTP request refused: this socket speaks ACP, not HTTP")
    }
    assert warned == dict(enumerate(methods, start=1))
    statuses = {e["conn"]: e["status"] for e in proxy.events if e["event"] == "connection closed"}
    assert statuses == {
        **{conn: f"refused: an HTTP request ({m})" for conn, m in enumerate(methods, start=1)},
        11: "client closed the connection before sending a request",
        12: "agent exited with status 0",
    }
    assert proxy.count("agent started") == 1


@pytest.mark.anyio
async def test_http_is_refused_on_a_unix_socket_too(tmp_path: Path) -> None:
    path = tmp_path / "acp.sock"
    with anyio.fail_after(TIMEOUT):
        async with listening("--listen", f"unix://{path}", agent=TINY) as proxy:
            assert await ask_over_http(proxy, browser_post(0)) == FORBIDDEN
            await proxy.event("connection closed", conn=1)
            proxy.terminate()
            assert await proxy.wait() == 0
    assert proxy.count("agent started") == 0


@pytest.mark.anyio
async def test_first_line_without_newline_then_eof_is_still_served() -> None:
    """Starting the agent at the first line keeps the stdio behaviour for an unterminated last
    line: it is delivered at EOF."""
    with anyio.fail_after(TIMEOUT):
        async with listening("--listen", "tcp://127.0.0.1:0", agent=TINY) as proxy:
            stream = await proxy.connect()
            await stream.send(INIT[:-1])
            await stream.send_eof()
            assert await Lines(stream).rest() == init_response(1)
            await stream.aclose()
            await proxy.event("connection closed", conn=1)
            proxy.terminate()
            assert await proxy.wait() == 0
    [closed] = [e for e in proxy.events if e["event"] == "connection closed"]
    assert (closed["status"], closed["frames_client_to_agent"]) == ("agent exited with status 0", 1)


# -- the handshake timeout ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_silent_client_is_closed_after_the_handshake_timeout_and_frees_its_slot() -> None:
    """Before the handshake timeout, a client that never sent anything held a slot (and an agent)
    forever. With one slot: the silent client holds it (a second client is refused) until the
    handshake timeout closes it with an error line; then the slot serves a new client."""
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--listen",
            "tcp://127.0.0.1:0",
            "--max-connections",
            "1",
            "--handshake-timeout",
            "0.5",
            agent=TINY,
        ) as proxy:
            silent = await proxy.connect()
            await proxy.event("connection opened", conn=1)
            extra = await proxy.connect()
            await extra.send(INIT)
            assert await Lines(extra).rest() == refusal(1)
            await extra.aclose()
            assert await Lines(silent).rest() == handshake_error("0.5")
            await silent.aclose()
            await proxy.event("connection closed", conn=1)
            stream = await proxy.connect()
            lines = Lines(stream)
            assert await exchange(lines, stream, INIT) == init_response(1)
            await stream.send_eof()
            assert await lines.rest() == b""
            await stream.aclose()
            await proxy.event("connection closed", conn=2)
            proxy.terminate()
            assert await proxy.wait() == 0
    assert (await proxy.event("listening"))["handshake_timeout_s"] == 0.5
    warning = await proxy.event("handshake timeout: no request; closing the connection")
    assert (warning["level"], warning["conn"], warning["handshake_timeout_s"]) == (
        "warning",
        1,
        0.5,
    )
    statuses = {e["conn"]: e["status"] for e in proxy.events if e["event"] == "connection closed"}
    assert statuses == {
        1: "handshake timeout: no request within 0.5 s",
        2: "agent exited with status 0",
    }
    assert proxy.count("agent started") == 1


@pytest.mark.anyio
async def test_trickled_first_line_times_out_from_the_config_file(tmp_path: Path) -> None:
    """An unfinished first line is no request: the deadline counts from the connection, so
    trickling bytes does not extend it (and starts no agent). ``handshake_timeout:`` in the
    YAML file sets it."""
    path = tmp_path / "acp.sock"
    config = write_config(tmp_path / "h.yaml", "handshake_timeout: 0.4\n")
    with anyio.fail_after(TIMEOUT):
        async with listening("--config", config, "--listen", f"unix://{path}", agent=TINY) as proxy:
            stream = await proxy.connect()
            await stream.send(INIT[:20])
            await stream.send(INIT[20:40])
            assert await Lines(stream).rest() == handshake_error("0.4")
            await stream.aclose()
            await proxy.event("connection closed", conn=1)
            proxy.terminate()
            assert await proxy.wait() == 0
    assert proxy.count("agent started") == 0


@pytest.mark.anyio
async def test_shutdown_ends_a_connection_still_waiting_for_its_first_line() -> None:
    """SIGTERM does not wait for the (default, 30 s) handshake timeout of a silent client."""
    with anyio.fail_after(TIMEOUT):
        async with listening("--listen", "tcp://127.0.0.1:0", agent=TINY) as proxy:
            silent = await proxy.connect()
            await proxy.event("connection opened", conn=1)
            proxy.process.send_signal(signal.SIGTERM)
            assert await Lines(silent).rest() == b""
            await silent.aclose()
            assert await proxy.wait() == 0
    [closed] = [e for e in proxy.events if e["event"] == "connection closed"]
    assert closed["status"] == "closed at shutdown before a request"


# -- refusals under load ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_every_refused_client_reads_the_refusal_line() -> None:
    """Before the refusal drained its client, 200 concurrent clients against --max-connections
    64 left 104 (120 when re-measured) with a bare reset instead of the refusal line. Same
    ratio, smaller: 50 clients, 16 slots. Every client keeps its connection open until all have
    their first answer, so the refusals overlap as in a burst; each refused client must then
    read exactly the refusal line and EOF (no reset, no silent close)."""
    slots, clients = 16, 50
    first: dict[int, bytes] = {}
    rest: dict[int, bytes] = {}
    all_answered = anyio.Event()

    async def client(proxy: Proxy, i: int) -> None:
        stream = await proxy.connect()
        lines = Lines(stream)
        try:
            await stream.send(INIT)
            first[i] = await lines.line()
        except (anyio.EndOfStream, anyio.BrokenResourceError) as exc:
            first[i] = type(exc).__name__.encode()
        if len(first) == clients:
            all_answered.set()
        await all_answered.wait()
        if first[i] == init_response(1):
            await stream.send_eof()
        try:
            rest[i] = await lines.rest()
        except anyio.BrokenResourceError:
            rest[i] = b"reset"
        await stream.aclose()

    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--listen", "tcp://127.0.0.1:0", "--max-connections", str(slots), agent=TINY
        ) as proxy:
            async with anyio.create_task_group() as tg:
                for i in range(clients):
                    tg.start_soon(client, proxy, i)
            for conn in range(1, slots + 1):
                await proxy.event("connection closed", conn=conn)
            proxy.terminate()
            assert await proxy.wait() == 0
    held = sorted(i for i in first if first[i] == init_response(1))
    refused = sorted(i for i in first if i not in held)
    assert len(held) == slots
    assert {first[i] + rest[i] for i in refused} == {refusal(slots)}
    assert {rest[i] for i in held} == {b""}
    assert proxy.count("connection refused: too many connections") == clients - slots
    assert proxy.count("agent started") == slots


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--handshake-timeout", "0"], "must be a positive number of seconds: '0'"),
        (["--handshake-timeout", "soon"], "not a number: 'soon'"),
    ],
)
@pytest.mark.anyio
async def test_handshake_timeout_usage_errors(argv: list[str], message: str) -> None:
    ran = await run([*PROXY, "--listen", "tcp://127.0.0.1:0", *argv, "--", *TINY])
    assert (ran.rc, ran.stdout) == (2, b"")
    assert message in ran.stderr.decode()


def test_a_long_first_line_is_handed_over_without_being_held_whole() -> None:
    # Held first lines are outside the process-wide buffer budget: never more than
    # OPENING_HOLD_BYTES of one is held (found by the budget test with 12 x 15 MiB first lines).
    reader = OpeningReader(64 * 1024 * 1024)
    assert reader.feed(b'{"jsonrpc":"2.0","method":"x","params":{"a":"') is Opening.MORE
    assert reader.feed(b"a" * OPENING_HOLD_BYTES) is Opening.FRAME
    assert len(reader.buffer) <= 2 * OPENING_HOLD_BYTES
