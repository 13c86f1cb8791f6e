"""Memory bounds of the shell: the process-wide buffer budget shared by all sessions,
and answering a huge number of requests in flight when the agent dies without building all the
answers at once. Memory is checked with ``resource.setrlimit(RLIMIT_AS)`` in a subprocess (the
old code dies under the same cap) and with the budget's own accounting, never with timings.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import anyio
import anyio.abc
import pytest
from proxy_harness import (
    FAKE_AGENT,
    REPO,
    TESTS,
    Lines,
    MemoryByteStream,
    error_line,
    memory_pipe_pair,
    proxy_env,
)

from acp_proxy.config import Config, ConfigError, parse_config
from acp_proxy.shell.session.buffer_budget import READ_SIZE, BufferBudget, process_budget
from acp_proxy.shell.session.pump import PumpSession
from acp_proxy.wire.chain import Chain, Direction
from acp_proxy.wire.connection.pipeline import Connection
from acp_proxy.wire.connection.tracking import ABORT_CHUNK
from acp_proxy.wire.framing import Line

pytestmark = pytest.mark.anyio

MiB = 1024 * 1024
CAP = 300 * MiB

# Runs argv[2:] with its address space capped at argv[1] bytes. What counts is the memory the
# proxy allocates, not what threads reserve: asyncio's child watcher starts one thread per agent,
# and each thread would reserve an 8 MiB stack (RLIMIT_STACK) and a 64 MiB malloc arena.
CAPPED = (
    "import os, resource, sys\n"
    "cap = int(sys.argv[1])\n"
    "os.environ['MALLOC_ARENA_MAX'] = '1'\n"
    "resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, resource.RLIM_INFINITY))\n"
    "resource.setrlimit(resource.RLIMIT_AS, (cap, cap))\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def capped(cap: int, cmd: list[str]) -> list[str]:
    return [sys.executable, "-c", CAPPED, str(cap), *cmd]


# --- answering the requests in flight at agent death, incrementally ----------------------------


def test_abort_pending_builds_errors_lazily_in_chunks() -> None:
    conn = Connection(Chain([]))
    n = 2 * ABORT_CHUNK + 500
    for i in range(n):
        conn.handle(Direction.CLIENT_TO_AGENT, Line(b'{"jsonrpc":"2.0","id":%d,"method":"m"}' % i))
    chunks = conn.abort_pending("agent gone")
    # Detached at once: nothing is tracked any more, and nothing is built yet.
    assert (conn.pending_client_requests, conn.stats.errors_replied) == (0, 0)
    first = next(chunks)
    assert (len(first), conn.stats.errors_replied) == (ABORT_CHUNK, ABORT_CHUNK)
    rest = list(chunks)
    assert [len(c) for c in rest] == [ABORT_CHUNK, 500]
    frames = [f.raw + b"\n" for c in (first, *rest) for f in c]
    assert frames == [error_line(i, -32603, "agent gone during m") for i in range(n)]
    assert conn.stats.errors_replied == n


async def test_100k_requests_in_flight_answered_at_agent_death_under_a_memory_cap(
    tmp_path: Path,
) -> None:
    """100,000 client requests are in flight when the agent exits. Under a 300 MiB address-space
    cap every request gets its -32603 error, in order. The old code built every answer at once
    and queued them in one go: it died under the same cap (and under 400 MiB); now the proxy
    also passes under 120 MiB."""
    n = 100_000
    requests = b"".join(
        b'{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":{}}\n' % i for i in range(n)
    )
    # The pending table must hold them all (the default bound is 10,000).
    config = tmp_path / "pending.yaml"
    config.write_text(f"max_pending_requests: {n}\n")
    cmd = capped(
        300 * MiB,
        [
            sys.executable,
            "-m",
            "acp_proxy",
            "--config",
            str(config),
            "--",
            sys.executable,
            str(FAKE_AGENT),
            "--silent-after",
            "0",
            "--crash-after",
            str(n),
            "--exit-code",
            "5",
        ],
    )
    with anyio.fail_after(120):
        done = await anyio.run_process(
            cmd, input=requests, check=False, env=proxy_env(), cwd=str(REPO)
        )
    assert done.returncode == 5, done.stderr[-2000:]
    assert done.stdout == b"".join(
        error_line(i, -32603, "agent exited with status 5 during session/prompt") for i in range(n)
    )


# --- the process-wide buffer budget (``shell.session.buffer_budget``)
# -------------------------------------------


def _pipe_pair() -> tuple[MemoryByteStream, MemoryByteStream]:
    return memory_pipe_pair(4)


def big_frame(tag: int, size: int) -> bytes:
    head = b'{"jsonrpc":"2.0","method":"_x/big","params":{"tag":%d,"pad":"' % tag
    return head + b"p" * (size - len(head) - 3) + b'"}}'


async def test_sessions_sharing_a_budget_never_hold_more_than_it() -> None:
    """12 sessions in one process each receive a 1.5 MiB line in 64 KiB pieces (18 MiB of
    partial lines in all) under an 8 MiB budget: the budget's peak stays within it, readers
    waited for it, and every frame arrives whole (a frame can always complete)."""
    frame_size = 3 * MiB // 2
    config = Config(max_frame_bytes=2 * MiB, max_buffer_bytes=8 * MiB)
    budget = BufferBudget(8 * MiB, 2 * MiB + READ_SIZE)
    received: dict[int, bytes] = {}

    async def one(tag: int) -> None:
        client_side, proxy_client = _pipe_pair()
        proxy_agent, agent_side = _pipe_pair()
        session = PumpSession(
            config, proxy_client, proxy_client, proxy_agent, proxy_agent, budget=budget
        )

        async def client() -> None:
            frame = big_frame(tag, frame_size) + b"\n"
            for i in range(0, len(frame), 64 * 1024):
                await client_side.send(frame[i : i + 64 * 1024])

        async def agent() -> None:
            received[tag] = await Lines(agent_side).line()
            await agent_side.send_eof()

        async with anyio.create_task_group() as tg:
            tg.start_soon(client)
            tg.start_soon(agent)
            await session.run()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for tag in range(12):
                tg.start_soon(one, tag)
    assert received == {tag: big_frame(tag, frame_size) + b"\n" for tag in range(12)}
    assert budget.peak <= budget.limit
    assert budget.waits > 0
    assert budget.held == 0


def test_process_budget_is_shared_and_never_below_one_frame() -> None:
    a = process_budget(Config())
    assert a is process_budget(Config())
    assert (a.limit, a.reserve) == (256 * MiB, 64 * MiB + READ_SIZE)
    small = process_budget(Config(max_frame_bytes=8 * MiB, max_buffer_bytes=MiB))
    assert small.limit == small.reserve + 2 * READ_SIZE


def test_budget_config() -> None:
    def parse(text: str) -> Config:
        return parse_config(text, "c.yaml", {})

    assert parse("").max_buffer_bytes == 256 * MiB
    assert parse("max_buffer_bytes: 10MiB\nmax_frame_bytes: 9MiB\n").max_buffer_bytes == 10 * MiB
    # Not given: raised to what one maximal frame needs.
    assert parse("max_frame_bytes: 1GiB\n").max_buffer_bytes == 1024 * MiB + MiB
    with pytest.raises(ConfigError) as err:
        parse("max_frame_bytes: 9MiB\nmax_buffer_bytes: 10000000\n")
    assert str(err.value) == (
        "c.yaml:2: max_buffer_bytes: must be at least max_frame_bytes + 1 MiB "
        "(10485760 bytes), got 10000000"
    )
    assert parse("agent: {drain_timeout: 2.5}\n").agent.drain_timeout_s == 2.5
    assert parse("").agent.drain_timeout_s == 60.0
    with pytest.raises(ConfigError) as err:
        parse("agent: {drain_timeout: -1}\n")
    assert str(err.value) == (
        "c.yaml:1: agent.drain_timeout: expected a number of seconds >= 0, got -1"
    )


TINY_AGENT = TESTS / "tiny_agent.py"


async def many_clients_with_big_lines(
    tmp_path: Path, config_text: str, cap: int, clients: int, line_size: int
) -> tuple[int, list[bytes], bytes]:
    """``acp-proxy --listen`` under an address-space cap; ``clients`` clients at once each send
    a notification of ``line_size`` bytes in 256 KiB pieces, then a request, and read its
    answer. Returns the proxy's exit code (after SIGTERM), the answers and its stderr."""
    config = tmp_path / "c.yaml"
    config.write_text(config_text, encoding="utf-8")
    sock = tmp_path / "acp.sock"
    stderr_path = tmp_path / "stderr"
    cmd = capped(
        cap,
        [
            sys.executable,
            "-m",
            "acp_proxy",
            "--config",
            str(config),
            "--log-format",
            "json",
            "--listen",
            f"unix://{sock}",
            "--",
            sys.executable,
            "-S",
            str(TINY_AGENT),
        ],
    )
    answers: list[bytes] = []
    with stderr_path.open("wb") as err:
        async with await anyio.open_process(
            cmd, env=proxy_env(), cwd=str(REPO), stdin=subprocess.DEVNULL, stderr=err
        ) as proc:
            try:
                with anyio.fail_after(120):
                    while not sock.exists() and proc.returncode is None:
                        await anyio.sleep(0.05)

                    async def client(tag: int) -> None:
                        stream = await anyio.connect_unix(str(sock))
                        async with stream:
                            frame = big_frame(tag, line_size) + b"\n"
                            for i in range(0, len(frame), READ_SIZE):
                                await stream.send(frame[i : i + READ_SIZE])
                            await stream.send(b'{"jsonrpc":"2.0","id":%d,"method":"m"}\n' % tag)
                            answers.append(await Lines(stream).line())

                    async with anyio.create_task_group() as tg:
                        for tag in range(clients):
                            tg.start_soon(client, tag)
                    proc.send_signal(signal.SIGTERM)
                    rc = await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
    return rc, sorted(answers), stderr_path.read_bytes()


async def test_listener_with_many_big_partial_lines_stays_within_the_budget(
    tmp_path: Path,
) -> None:
    """12 clients each send a 15 MiB line at once to one listener (180 MiB of partial lines)
    with a 40 MiB budget, under a 300 MiB address-space cap: every client gets its answer and the
    listener exits normally. Without the budget the proxy needed about 530 MB (peak RSS) and
    died under caps up to 450 MiB; with it, about 170 MB, and it runs under a 200 MiB cap."""
    rc, answers, stderr = await many_clients_with_big_lines(
        tmp_path,
        "max_frame_bytes: 16MiB\nmax_buffer_bytes: 40MiB\n",
        CAP,
        12,
        15 * MiB,
    )
    assert answers == sorted(
        b'{"jsonrpc":"2.0","id":%d,"result":{"echo":null}}\n' % tag for tag in range(12)
    ), stderr[-3000:]
    assert rc == 0, stderr[-3000:]
