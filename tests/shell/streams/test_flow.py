"""Flow control between the two directions: backpressure in one direction never stops
the proxy reading the other direction's sender.

Real ``python -m acp_proxy`` and a real streaming agent (``stream_agent.py``) over pipes. Each
scenario is first run with the client talking to the agent directly (the control: it completes),
then through the proxy, which must deliver exactly the same bytes both ways. Timeouts are generous
and only stop a hang; nothing is timed.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson
import pytest
from proxy_harness import REPO, TESTS, Lines, MemoryByteStream, memory_pipe_pair, proxy_env, request
from stream_agent import stream_lines

from acp_proxy.config import Config
from acp_proxy.shell.session.pump import PumpSession
from acp_proxy.shell.streams.outbox import REPLY_QUEUE_FRAMES
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.connection.pipeline import Connection

pytestmark = pytest.mark.anyio

STREAM_AGENT = TESTS / "stream_agent.py"
HANG = 60.0  # only a hang takes this long


def agent_cmd(*args: str) -> list[str]:
    return [sys.executable, str(STREAM_AGENT), *args]


def via_proxy(cmd: list[str], *proxy_args: str) -> list[str]:
    return [sys.executable, "-m", "acp_proxy", *proxy_args, "--", *cmd]


def client_notes(count: int, seed: int = 0) -> list[bytes]:
    """``count`` client notifications (about 400 bytes each; random sizes when seeded)."""
    rng = random.Random(seed)
    return [
        b'{"jsonrpc":"2.0","method":"_client/note","params":{"i":%d,"pad":"%s"}}\n'
        % (i, b"p" * (rng.randrange(1, 4000) if seed else 330))
        for i in range(count)
    ]


@dataclass
class Outcome:
    rc: int
    stdout: bytes
    sent: int  # bytes of client input the peer accepted before it went away (or all)


async def drive(
    cmd: list[str], lines: list[bytes], *, read_while_writing: bool, seed: int = 0
) -> Outcome:
    """A client: write ``lines`` (in random batches and pauses when seeded), read stdout either
    at the same time or only once everything was written, then wait for the process."""
    rng = random.Random(seed) if seed else None
    sent = 0
    out: list[bytes] = []
    async with await anyio.open_process(
        cmd, env=proxy_env(), cwd=str(REPO), stderr=subprocess.DEVNULL
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout

        async def write() -> None:
            nonlocal sent
            i = 0
            try:
                while i < len(lines):
                    n = rng.choice((1, 3, 50, 400)) if rng else 100
                    batch = b"".join(lines[i : i + n])
                    await stdin.send(batch)
                    sent += len(batch)
                    i += n
                    if rng is not None and rng.random() < 0.05:
                        await anyio.sleep(rng.random() * 0.05)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the reader went away (an agent that never reads, once it exited)
            await stdin.aclose()

        async def read() -> None:
            reader_rng = random.Random(seed + 7) if seed else None
            while True:
                try:
                    out.append(await stdout.receive(65536))
                except anyio.EndOfStream:
                    return
                if reader_rng is not None and reader_rng.random() < 0.05:
                    await anyio.sleep(reader_rng.random() * 0.1)

        try:
            with anyio.fail_after(HANG):
                if read_while_writing:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(write)
                        tg.start_soon(read)
                else:
                    await write()
                    await read()
                rc = await proc.wait()
        finally:
            if proc.returncode is None:  # a hang: do not wait for it on the way out
                proc.kill()
    return Outcome(rc, b"".join(out), sent)


def recorded(path: Path) -> tuple[int, str]:
    size, digest = path.read_text().split()
    return int(size), digest


def digest(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()


async def test_agent_that_never_reads_its_input_while_streaming() -> None:
    """The agent streams 4 MB and never reads stdin; the client sends 10,000 notifications (4 MB)
    while reading. Before the fix the proxy stopped reading the agent as soon as the queue
    *toward the agent* was full, and the session never ended."""
    agent = agent_cmd("--bytes", str(4_000_000), "--stdin", "never")
    lines = client_notes(10_000)
    expected = b"".join(stream_lines(4_000_000, 0))
    direct = await drive(agent, lines, read_while_writing=True)
    assert (direct.rc, direct.stdout == expected) == (0, True)
    proxied = await drive(via_proxy(agent), lines, read_while_writing=True)
    assert proxied.rc == 0
    assert proxied.stdout == expected


async def test_client_that_never_reads_its_output_while_sending(tmp_path: Path) -> None:
    """The mirror: the client writes 30,000 notifications (10 MB) and reads only afterwards,
    while the agent streams 8 MB and reads its input at the same time. Before the fix the proxy
    stopped reading the client once the queue *toward the client* was full."""
    record = tmp_path / "agent_read"
    agent = agent_cmd("--bytes", str(8_000_000), "--stdin", "thread", "--record", str(record))
    lines = client_notes(30_000)
    expected = b"".join(stream_lines(8_000_000, 0))
    direct = await drive(agent, lines, read_while_writing=False)
    assert (direct.rc, direct.stdout == expected) == (0, True)
    assert recorded(record) == digest(b"".join(lines))
    record.unlink()
    proxied = await drive(via_proxy(agent), lines, read_while_writing=False)
    assert proxied.rc == 0
    assert proxied.stdout == expected
    assert recorded(record) == digest(b"".join(lines))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_random_sizes_and_pauses_on_both_sides_never_stall(seed: int, tmp_path: Path) -> None:
    """Seeded random line sizes (10 B to 30 KB), batch sizes and pauses in every reader and
    writer, on both sides: every byte arrives both ways and the session ends."""
    record = tmp_path / "agent_read"
    agent = agent_cmd(
        "--bytes", str(2_000_000), "--seed", str(seed), "--stdin", "thread", "--record", str(record)
    )
    lines = client_notes(1500, seed)
    proxied = await drive(
        via_proxy(agent, "--config", str(_tiny_queues(tmp_path))),
        lines,
        read_while_writing=True,
        seed=seed,
    )
    assert proxied.rc == 0
    assert proxied.stdout == b"".join(stream_lines(2_000_000, seed))
    assert recorded(record) == digest(b"".join(lines))


def _tiny_queues(tmp_path: Path) -> Path:
    # Small queues make every pause reach backpressure; coalescing off so the bytes stay exact.
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "coalesce: {enabled: false, max_queue_messages: 8, max_queue_bytes: 64KiB}\n",
        encoding="utf-8",
    )
    return path


# --- replies the proxy owes a sender -----------------------------------------------------------


def _pipe_pair() -> tuple[MemoryByteStream, MemoryByteStream]:
    return memory_pipe_pair(16)


async def test_replies_a_client_leaves_unread_stop_reading_that_client_only() -> None:
    """A client sends 5,000 requests the proxy answers itself (each over the frame limit: -32600)
    and reads nothing. The replies wait in their own bounded queue; once it is full the proxy
    stops reading the client, while the agent's output still goes through to the client's queue.
    When the client reads, every answer arrives, in order."""
    n = 5000
    config = Config(max_frame_bytes=64)
    client_side, proxy_client = _pipe_pair()
    proxy_agent, agent_side = _pipe_pair()
    session = PumpSession(config, proxy_client, proxy_client, proxy_agent, proxy_agent)
    sent = 0

    async def client() -> None:
        nonlocal sent
        for i in range(n):
            await client_side.send(request(i, "session/prompt", {"pad": "x" * 64}))
            sent += 1

    with anyio.fail_after(HANG):
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.run)
            tg.start_soon(client)
            await agent_side.send(b'{"jsonrpc":"2.0","method":"n","params":{}}\n')
            await anyio.wait_all_tasks_blocked()
            # Stopped reading the client: the replies stay within their bound (plus what the
            # memory streams buffer), and the agent's notification was still read.
            assert sent < n
            assert len(session.to_client.replies) <= REPLY_QUEUE_FRAMES
            assert session.connection.stats.agent_to_client_in == 1
            got = Lines(client_side)
            lines = [await got.line() for _ in range(n + 1)]
            await agent_side.send_eof()
    assert sent == n
    assert lines.count(b'{"jsonrpc":"2.0","method":"n","params":{}}\n') == 1
    errors = [line for line in lines if b'"error"' in line]
    assert [orjson.loads(line)["id"] for line in errors] == list(range(n))
    assert {orjson.loads(line)["error"]["code"] for line in errors} == {-32600}


async def test_lines_read_behind_a_backlog_still_travel_as_blocks_and_still_coalesce() -> None:
    """With frames waiting toward a client that does not read, the reader used to go
    line by line (no one-pass scan of the block: a proxy that fell behind got slower still).
    Now every read is one block; the queue splits a joined run that has to wait into its lines,
    so coalescing still merges them, and every byte arrives in order."""
    client_side, proxy_client = _pipe_pair()
    proxy_agent, agent_side = _pipe_pair()
    calls: list[tuple[int, list[str]]] = []

    class Spy(Connection):
        def handle_many(self, direction: Any, events: Any, **kw: Any) -> Any:
            events = list(events)
            if direction is Direction.AGENT_TO_CLIENT:
                kinds = [type(e).__name__ for e in events]
                calls.append((len(session.to_client.queue), kinds))
            return super().handle_many(direction, events, **kw)

    config = Config()
    session = PumpSession(
        config,
        proxy_client,
        proxy_client,
        proxy_agent,
        proxy_agent,
        connection=Spy(config.build_chain()),
    )
    # The v2 handshake, then tool call updates of one entity: mergeable while they wait.
    init = request(0, "initialize", {"protocolVersion": 2})
    ok = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2}}\n'

    def update(i: int) -> bytes:
        return (
            orjson.dumps(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {
                        "sessionId": "s",
                        "update": {
                            "sessionUpdate": "tool_call_update",
                            "toolCallId": "t1",
                            "status": "in_progress",
                            "title": f"step {i}",
                        },
                    },
                }
            )
            + b"\n"
        )

    with anyio.fail_after(HANG):
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.run)
            await client_side.send(init)
            await agent_side.send(ok)
            got = Lines(client_side)
            assert await got.line() == ok
            # The client reads nothing now: 40 reads of 5 updates each pile up in its queue.
            for r in range(40):
                await agent_side.send(b"".join(update(5 * r + k) for k in range(5)))
            await anyio.wait_all_tasks_blocked()
            assert len(session.to_client.queue) > 0
            await agent_side.send_eof()
            await client_side.send_eof()
            out: list[bytes] = []
            while not out or b'"step 199"' not in out[-1]:
                out.append(await got.line())
    behind = [kinds for queued, kinds in calls if queued > 0]
    assert behind and all(kinds == ["Block"] for kinds in behind)
    # Coalesced: fewer frames than sent, the last one carries the final title.
    assert 0 < len(out) < 200
    assert orjson.loads(out[-1])["params"]["update"]["title"] == "step 199"
    assert session.connection.stats.agent_to_client_in == 201
