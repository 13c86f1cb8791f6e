"""``--listen`` fairness: connections that hog the shared buffer budget never starve the others.

Every connection has a floor of the budget of its own (``budget.FLOOR_BYTES``, less when many
connections must fit), which interactive traffic never leaves; only what a connection holds
beyond its floor comes from the shared pool. So clients that never read while their agents
stream, or that park unfinished lines, fill the pool and wait, and a new well-behaved client
still gets its answers at once.

Scaled down (small budget, a few hogs) so that it runs in seconds; the old code gave the new
client no answer at all in both tests.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio
import anyio.abc
import pytest
from listen_harness import listening
from proxy_harness import REPO, Lines, blocked_writing, children, request, wait_until, write_config

from acp_proxy.wire.framing import HEAD_BYTES, Line, LineSplitter, Oversize

pytestmark = pytest.mark.anyio

# An agent that answers every request, and after a ``stream`` request writes notifications
# without end (until its input closes or it is killed): bench/flood_agent.py, shared with the bench.
AGENT = str(REPO / "bench" / "flood_agent.py")


async def _round_trips(stream: anyio.abc.ByteStream, count: int) -> list[float]:
    lines = Lines(stream)
    times = []
    for i in range(count):
        started = time.monotonic()
        await stream.send(request(i, "initialize" if i == 0 else "ping", {}))
        line = await lines.line()
        times.append(time.monotonic() - started)
        assert line.startswith(b'{"jsonrpc": "2.0", "id": %d' % i), line
    return times


async def test_clients_that_never_read_do_not_starve_a_new_client(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        "max_buffer_bytes: 24MiB\nmax_frame_bytes: 1MiB\nmax_connections: 10\n"
        "coalesce:\n  enabled: false\n  max_queue_bytes: 4MiB\n",
    )
    args = ("--config", config, "--listen", f"unix://{tmp_path}/s")
    async with listening(*args, agent=[sys.executable, AGENT]) as proxy:
        hogs = []
        for _ in range(8):  # 8 x 4 MiB queued: more than the budget
            hog = await proxy.connect()
            await hog.send(request(0, "initialize", {}) + request(1, "stream", {}))
            hogs.append(hog)
        # The hogs' queues fill the budget: the proxy reads none of their agents any more,
        # each waits in a write to its full stdout.
        await wait_until(
            lambda: (
                len(agents := children(proxy.process.pid)) == len(hogs)
                and all(map(blocked_writing, agents))
            ),
            "every hog's agent blocked",
        )
        good = await proxy.connect()
        with anyio.fail_after(10):
            times = await _round_trips(good, 20)
        await good.aclose()
        for hog in hogs:
            await hog.aclose()
        proxy.terminate()
    assert max(times) < 2.0, times


async def test_parked_partial_lines_do_not_starve_a_new_client(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        "max_buffer_bytes: 24MiB\nmax_frame_bytes: 8MiB\nmax_connections: 8\n",
    )
    args = ("--config", config, "--listen", f"unix://{tmp_path}/s")
    part = b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"t":"' + b"p" * (7 * 1024 * 1024)
    async with listening(*args, agent=[sys.executable, AGENT]) as proxy:
        parkers = []
        for _ in range(3):  # 3 x 7 MiB unfinished: more than the budget leaves them
            parker = await proxy.connect()
            parkers.append(parker)

        async def park(stream: anyio.abc.ByteStream) -> None:
            await stream.send(request(0, "initialize", {}))
            with anyio.move_on_after(5):
                await stream.send(part)  # may block: the proxy stops reading it

        async with anyio.create_task_group() as tg:
            for parker in parkers:
                tg.start_soon(park, parker)
            await anyio.sleep(2)  # parked
            good = await proxy.connect()
            with anyio.fail_after(10):
                times = await _round_trips(good, 5)
            await good.aclose()
            tg.cancel_scope.cancel()
        for parker in parkers:
            await parker.aclose()
        proxy.terminate()
    assert max(times) < 2.0, times


async def test_a_parked_line_over_its_share_is_refused_for_its_connection_only(
    tmp_path: Path,
) -> None:
    """Parked lines fill the pool and one holds the reserve: a client with a big legal frame
    would wait for them forever. A line that has not grown for ``PARKED_S`` while another
    session waits, and that holds more than its session's fair share of the pool, is refused:
    the waiting client gets its answer, and the parker gets an error once its line ends."""
    config = write_config(
        tmp_path / "c.yaml",
        "max_buffer_bytes: 24MiB\nmax_frame_bytes: 8MiB\nmax_connections: 8\n",
    )
    args = ("--config", config, "--listen", f"unix://{tmp_path}/s")
    part = b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"t":"' + b"p" * (7 * 1024 * 1024)
    big = request(5, "x", {"t": "b" * (6 * 1024 * 1024)})
    async with listening(*args, agent=[sys.executable, AGENT]) as proxy:
        parkers = [await proxy.connect() for _ in range(3)]

        async def park(stream: anyio.abc.ByteStream) -> None:
            await stream.send(request(0, "initialize", {}))
            await stream.send(part)  # may block while the proxy stops reading it

        async with anyio.create_task_group() as tg:
            for parker in parkers:
                tg.start_soon(park, parker)
            await anyio.sleep(1)  # parked
            client = await proxy.connect()
            lines = Lines(client)
            with anyio.fail_after(30):
                await client.send(request(0, "initialize", {}))
                await lines.line()
                await client.send(big)
                answer = await lines.line()
            assert answer == b'{"jsonrpc": "2.0", "id": 5, "result": {}}\n'
            await client.aclose()
            # A refused parker ends its line: it gets an error for its request, nothing else.
            refused = [
                e for e in proxy.events if e["event"] == "frame over the size limit discarded"
            ]
            tg.cancel_scope.cancel()
        errors = []
        for parker in parkers:
            with anyio.move_on_after(5):
                await parker.send(b'"}}\n')
                plines = Lines(parker)
                assert (
                    await plines.line()
                    == b'{"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 2}}\n'
                )
                errors.append(await plines.line())
            await parker.aclose()
        proxy.terminate()
    assert refused == []  # nothing refused before the lines ended
    assert len([e for e in errors if b'"error":{"code":-32600' in e]) >= 1, errors


def test_a_refused_line_is_reported_at_its_newline_with_the_share() -> None:
    splitter = LineSplitter(100_000)
    assert splitter.refuse(100) is False  # no pending line
    assert splitter.feed(b'{"id":3,"method":"m","params":"' + b"x" * 30_000) == []
    assert splitter.refuse(100) is True
    assert splitter.buffered == HEAD_BYTES  # only its head is kept
    assert splitter.refuse(100) is False  # refused already
    head = b'{"id":3,"method":"m","params":"' + b"x" * 30_000
    assert splitter.feed(b'xx"}\n{"id":4}\n') == [
        Oversize(len(head) + 4, (head + b'xx"}')[:HEAD_BYTES], 100),
        Line(b'{"id":4}'),
    ]
