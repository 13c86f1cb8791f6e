"""The HTTP servers' shared pieces: the accept loop (``shell.sockets.serving``), the bounded
head reader, and the one request-head parser (``telemetry.endpoint.parse_head``). In process,
on real sockets."""

from __future__ import annotations

import errno
import socket
from typing import Any

import anyio
import pytest

from acp_proxy.shell.sockets import serving
from acp_proxy.shell.sockets.streams import SocketStream
from acp_proxy.telemetry.endpoint import Request, parse_head

# --- parsing a head ------------------------------------------------------------------------------

HEADS: list[tuple[bytes, Request | None]] = [
    (b"GET /metrics HTTP/1.1\r\n", Request("GET", "/metrics", {}, {})),
    (b"HEAD /healthz?x=1 HTTP/1.0\n", Request("HEAD", "/healthz", {"x": "1"}, {})),
    (
        b"GET /events?since=3&token=t HTTP/1.1\r\nHost: 127.0.0.1:9\r\nX-A:  b \r\n\r\nbody",
        Request(
            "GET", "/events", {"since": "3", "token": "t"}, {"host": "127.0.0.1:9", "x-a": "b"}
        ),
    ),
    (b"GET /metrics HTTP/2.0\r\n", None),  # HTTP/1.x only
    (b"GET http://host/metrics HTTP/1.1\r\n", None),  # origin form only
    (b"GET /metrics\r\n", None),
    (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\n Host: x\r\n\r\n", None),  # a folded or padded name
    (b"", None),
]


@pytest.mark.parametrize(("head", "request_"), HEADS)
def test_parse_head(head: bytes, request_: Request | None) -> None:
    assert parse_head(head) == request_


# --- reading a head -------------------------------------------------------------------------------


def read(sent: list[bytes], *, close: bool, **options: Any) -> bytes | None:
    """What ``read_head`` gives for a client that sends ``sent`` (then closes its side)."""
    ours, theirs = socket.socketpair()

    async def main() -> bytes | None:
        stream = SocketStream(ours)
        try:
            for part in sent:
                theirs.sendall(part)
            if close:
                theirs.shutdown(socket.SHUT_WR)
            return await serving.read_head(stream, **options)
        finally:
            await stream.aclose()
            theirs.close()

    return anyio.run(main)


def test_read_head_stops_at_the_blank_line_or_the_request_line() -> None:
    head = b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
    assert read([head, b"more"], close=False, max_bytes=100, timeout_s=30) == head
    assert read([b"GET / HTTP/1.1\n\nx"], close=False, max_bytes=100, timeout_s=30) == (
        b"GET / HTTP/1.1\n\n"
    )
    line = b"GET /healthz HTTP/1.1\r\n"
    assert read([line + b"Hos"], close=False, max_bytes=100, timeout_s=30, line_only=True) == line


def test_read_head_gives_what_came_at_eof_or_at_the_timeout() -> None:
    part = b"GET / HTTP/1.1\r\nHost: h\r\n"
    assert read([part], close=True, max_bytes=100, timeout_s=30) == part
    assert read([part], close=False, max_bytes=100, timeout_s=0.05) == part


def test_a_head_over_the_bound_is_refused() -> None:
    head = b"GET / HTTP/1.1\r\nHost: " + b"h" * 80 + b"\r\n\r\n"
    assert read([head], close=False, max_bytes=len(head), timeout_s=30) == head
    assert read([head], close=False, max_bytes=len(head) - 1, timeout_s=30) is None
    assert read([b"x" * 500], close=False, max_bytes=100, timeout_s=30) is None  # no end at all
    assert read([b"x" * 500], close=True, max_bytes=100, timeout_s=30) is None


# --- accepting ------------------------------------------------------------------------------------


class Log:
    def __init__(self) -> None:
        self.errors: list[tuple[str, dict[str, Any]]] = []

    def error(self, event: str, **fields: Any) -> None:
        self.errors.append((event, fields))


class Scripted:
    """A listening socket whose ``accept`` raises the scripted errors first."""

    def __init__(self, codes: list[int], then: tuple[Any, Any]) -> None:
        self.codes = codes
        self.then = then

    def accept(self) -> tuple[Any, Any]:
        if self.codes:
            code = self.codes.pop(0)
            raise OSError(code, f"error {code}")
        return self.then


def test_accept_retries_transient_errors_and_backs_off_on_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(anyio, "sleep", sleep)
    codes = [errno.ECONNABORTED, errno.EINTR, errno.EMFILE, errno.ENETUNREACH]
    log = Log()
    got: Any = anyio.run(serving.accept, Scripted(codes, ("client", "peer")), log)  # type: ignore[arg-type]
    assert got == ("client", "peer")
    assert pauses == [serving.ACCEPT_BACKOFF_S] * 2  # the two that are not transient
    assert log.errors == [
        ("cannot accept a connection", {"error": f"error {errno.EMFILE}"}),
        ("cannot accept a connection", {"error": f"error {errno.ENETUNREACH}"}),
    ]


def test_serve_runs_a_task_per_connection_and_closes_the_refused() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    answered: list[int] = []

    async def main() -> None:
        served = anyio.Event()

        def start(client: socket.socket) -> Any:
            if not answered:
                answered.append(0)
                return None  # the first is refused: closed unanswered

            async def run() -> None:
                client.sendall(b"hello")
                client.close()
                answered.append(1)
                served.set()

            return run

        async with anyio.create_task_group() as tg:
            tg.start_soon(serving.serve, listener, start)
            for expected in (b"", b"hello"):
                conn = await anyio.to_thread.run_sync(socket.create_connection, ("127.0.0.1", port))
                conn.settimeout(10)
                assert await anyio.to_thread.run_sync(conn.recv, 10) == expected
                conn.close()
            await served.wait()
            tg.cancel_scope.cancel()

    anyio.run(main)
    listener.close()
    assert answered == [0, 1]
