"""The readers of lines that are not a session's streams, each on the one ``LineSplitter``: a
record file (``show``, ``replay``, ``ui``), the agent's stderr, the start-failure answerer. In
process, on real pipes and sockets where the reader reads one."""

from __future__ import annotations

import io
import os
import socket
from typing import Any

import anyio
import orjson

from acp_proxy.shell import agent_stderr
from acp_proxy.shell.agent_stderr import MAX_STDERR_LINE, StderrTail, drain_stderr
from acp_proxy.shell.recordread import (
    EOF,
    MAX_HEADER_BYTES,
    Problems,
    RecordLines,
    line_at,
    placed_entries,
)
from acp_proxy.shell.sockets.streams import SocketStream
from acp_proxy.shell.startfail import MAX_LINE, answer_requests

# --- a record file ------------------------------------------------------------------------------

HEADER = b'{"acp-proxy-record":1,"started":"2026-12-03T00:00:00.000+00:00","version":"test"}'
FRAME = b'{"t":0.1,"dir":"agent_to_client","raw":"{}"}'


def test_record_lines_count_blank_lines_and_give_their_offsets() -> None:
    data = b"".join([HEADER, b"\n\n", FRAME, b"\n  \n", b"x" * 50, b"\n", FRAME, b"\n", b"torn"])
    lines = RecordLines(io.BytesIO(data), max_line=40)
    got = []
    while (line := lines.read()) is not EOF:
        got.append((lines.number, lines.offset, line))
    assert got == [
        (1, 0, None),  # longer than 40: read through, not kept
        (2, len(HEADER) + 1, b""),
        (3, len(HEADER) + 2, None),
        (4, len(HEADER) + len(FRAME) + 3, b"  "),
        (5, len(HEADER) + len(FRAME) + 6, None),
        (6, len(HEADER) + len(FRAME) + 57, None),
        (7, len(HEADER) + 2 * len(FRAME) + 58, b"torn"),
    ]
    stream = io.BytesIO(data)
    whole = RecordLines(stream)
    offsets = []
    while (line := whole.read()) is not EOF:
        offsets.append((whole.offset, line))
    assert [line_at(stream, offset) for offset, _ in offsets] == [line for _, line in offsets]


def test_a_blank_line_of_a_record_is_reported_by_its_number() -> None:
    out = io.StringIO()
    lines = RecordLines(io.BytesIO(b"\n".join([HEADER, FRAME, b"", FRAME, b" "])))
    header = lines.read()
    assert header == HEADER
    problems = Problems("rec", "acp-proxy show", out=out)
    offsets = [offset for _session, _entry, offset in placed_entries(lines, {}, problems)]
    assert offsets == [0, len(HEADER) + 1, len(HEADER) + len(FRAME) + 3]  # header, two frames
    assert out.getvalue().splitlines() == [
        "acp-proxy show: rec:3: an empty line; skipped",
        "acp-proxy show: rec:5: an empty line; skipped",
    ]


class Endless(io.RawIOBase):
    """``/dev/zero``: no newline, ever; counts what was read."""

    def __init__(self) -> None:
        self.given = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        buffer[:] = b"\0" * len(buffer)
        self.given += len(buffer)
        return len(buffer)


def test_a_first_line_longer_than_a_header_is_not_read_through() -> None:
    raw = Endless()
    lines = RecordLines(io.BufferedReader(raw))
    assert lines.read(MAX_HEADER_BYTES) is None
    assert lines.read() is EOF  # the reading ended there
    assert raw.given <= 3 * MAX_HEADER_BYTES


# --- the agent's stderr -------------------------------------------------------------------------


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))


def test_stderr_lines_blank_ones_too_and_a_long_one_cut() -> None:
    long = b"y" * (MAX_STDERR_LINE + 10)
    read, write = os.pipe()
    data = b"one\r\n\n  \n" + long + b"\nlast"
    log, tail = Log(), StderrTail()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain_stderr, read, log, tail)
            for i in range(0, len(data), 4096):
                await anyio.to_thread.run_sync(os.write, write, data[i : i + 4096])
            os.close(write)

    anyio.run(main)
    assert log.events == [
        ("agent stderr", {"line": "one"}),
        ("agent stderr", {"line": ""}),
        ("agent stderr", {"line": "  "}),
        ("agent stderr", {"line": "y" * MAX_STDERR_LINE, "truncated": True}),
        ("agent stderr", {"line": "last"}),
    ]
    assert tail.last_line(lambda b: b.decode()) == "last"
    assert agent_stderr.MAX_STDERR_TAIL_LINES >= 5


# --- the start-failure answerer ------------------------------------------------------------------


def test_the_start_failure_answers_requests_and_skips_an_overlong_line() -> None:
    ours, theirs = socket.socketpair()
    request = b'{"jsonrpc":"2.0","id":7,"method":"initialize","params":{}}'
    overlong = b'{"jsonrpc":"2.0","id":6,"method":"x","params":"' + b"z" * MAX_LINE + b'"}'

    async def main() -> int:
        stream = SocketStream(ours)
        async with anyio.create_task_group() as tg:

            async def client() -> None:
                await anyio.to_thread.run_sync(theirs.sendall, overlong + b"\n\n" + request + b"\n")
                theirs.shutdown(socket.SHUT_WR)

            tg.start_soon(client)
            answered = await answer_requests(stream, "agent gone", first_wait_s=10)
        await stream.aclose()
        return answered

    assert anyio.run(main) == 1
    reply = theirs.makefile("rb").read()
    theirs.close()
    assert orjson.loads(reply) == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32603, "message": "agent gone during initialize"},
    }
