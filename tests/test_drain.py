"""The agent's last output reaches a slow or paused client.

The client is a real process (``cat``) reading the proxy's stdout, stopped with SIGSTOP while the
agent writes a few MB, exits, and leaves requests unanswered. Before the fix the proxy gave up on
its session about 4 to 6 seconds after the agent exited and discarded most of the output and the
-32603 errors it owed. Now the client gets every byte for up to ``agent.drain_timeout``, and a
cut-off is logged with what was discarded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import orjson
import pytest
from proxy_harness import (
    REPO,
    TESTS,
    blocked_writing,
    children,
    close_pipes,
    error_line,
    proxy_env,
    request,
    wait_until,
    write_config,
)
from stream_agent import stream_lines

pytestmark = pytest.mark.anyio

STREAM_AGENT = TESTS / "stream_agent.py"
REQUESTS = 50
# What the proxy can hold while the client is stopped: its stdout pipe (enlarged to 1 MiB), one
# write in flight and the queue (64 KiB bound, plus one 256 KiB read): 1.1 to 1.7 MiB. With the
# agent's 1 MiB stdout pipe on top, 1.95 MB (1.86 MiB) is always written whole (the agent exits)
# and never all read by the proxy (part of it is still in the agent's pipe when it exits).
TOTAL = 1_950_000
CONFIG = "coalesce: {enabled: false, max_queue_bytes: 64KiB}\n"
PAD = 20_000
# Longer than the old give-up time after the agent's exit (two or three 2 s lingers).
OLD_GIVE_UP_S = 7.0


async def _wait_for(path: Path) -> None:
    with anyio.fail_after(60):
        while not path.exists():
            await anyio.sleep(0.05)


def paused_reader(received: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A client's reader, ``cat`` into ``received``, stopped (SIGSTOP) before anything is
    written: the write end of its input pipe is the proxy's stdout."""
    read_end, write_end = os.pipe()
    with received.open("wb") as out:
        cat = subprocess.Popen(["cat"], stdin=read_end, stdout=out)
    os.close(read_end)
    cat.send_signal(signal.SIGSTOP)
    return cat, write_end


async def run_with_paused_client(
    tmp_path: Path, config_text: str, pause_until_proxy_exits: bool
) -> tuple[int, bytes, list[dict[str, object]]]:
    """Run the proxy with ``cat`` as the client's reader; stop ``cat`` before the agent writes,
    resume it ``OLD_GIVE_UP_S`` after the agent exited (or once the proxy exited). Returns the
    proxy's exit code, what ``cat`` received, and the proxy's JSON log events."""
    config = write_config(tmp_path / "c.yaml", config_text)
    done = tmp_path / "agent_done"
    received = tmp_path / "received"
    log_file = tmp_path / "proxy.log"
    cat, write_end = paused_reader(received)
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "acp_proxy",
            "--config",
            config,
            "--log-format",
            "json",
            "--log-file",
            str(log_file),
            "--",
            sys.executable,
            str(STREAM_AGENT),
            "--requests",
            str(REQUESTS),
            "--bytes",
            str(TOTAL),
            "--pad",
            str(PAD),
            "--done",
            str(done),
            "--exit-code",
            "3",
        ],
        stdin=subprocess.PIPE,
        stdout=write_end,
        env=proxy_env(),
        cwd=str(REPO),
    )
    os.close(write_end)
    assert proxy.stdin is not None
    try:
        # Requests the agent reads and never answers; stdin stays open, as an editor's does.
        proxy.stdin.write(b"".join(request(i, "session/prompt", {}) for i in range(REQUESTS)))
        proxy.stdin.flush()
        await _wait_for(done)
        if pause_until_proxy_exits:
            with anyio.fail_after(60):
                while proxy.poll() is None:
                    await anyio.sleep(0.05)
        else:
            await anyio.sleep(OLD_GIVE_UP_S)
        cat.send_signal(signal.SIGCONT)
        with anyio.fail_after(60):
            while proxy.poll() is None or cat.poll() is None:
                await anyio.sleep(0.05)
    finally:
        for proc in (proxy, cat):  # only after a failure: never leave them behind
            if proc.poll() is None:
                proc.kill()  # SIGKILL also ends a stopped process
                proc.wait()
        close_pipes(proxy)
    events = [orjson.loads(line) for line in log_file.read_bytes().splitlines() if line]
    return proxy.returncode, received.read_bytes(), events


def expected_output() -> bytes:
    errors = b"".join(
        error_line(i, -32603, "agent exited with status 3 during session/prompt")
        for i in range(REQUESTS)
    )
    return b"".join(stream_lines(TOTAL, 0, PAD)) + errors


async def test_paused_client_gets_everything_after_the_agent_exits(tmp_path: Path) -> None:
    rc, received, events = await run_with_paused_client(tmp_path, CONFIG, False)
    assert rc == 3
    assert received == expected_output()
    assert [e for e in events if "discard" in str(e["event"])] == []


async def test_a_short_drain_timeout_discards_and_logs_what(tmp_path: Path) -> None:
    rc, received, events = await run_with_paused_client(
        tmp_path,
        CONFIG + "agent: {drain_timeout: 1}\n",
        True,
    )
    assert rc == 3
    expected = expected_output()
    assert len(received) < len(expected)
    assert expected.startswith(received)
    [cut] = [e for e in events if "discarding the rest" in str(e["event"])]
    assert cut["drain_timeout_s"] == 1.0
    assert cut["level"] == "warning"
    # The errors were never queued: the agent's output was not read to its end.
    assert (cut["errors_not_queued"], cut["agent_output_read_to_end"]) == (REQUESTS, False)
    assert isinstance(cut["frames"], int) and cut["frames"] > 0
    assert isinstance(cut["bytes"], int) and cut["bytes"] > 0


async def test_a_paused_client_stops_the_proxy_reading_the_agent(tmp_path: Path) -> None:
    """The agent reader's work moved into the stream's readiness callback; it must still
    stop reading once the queue toward a paused client is full. ``cat`` is stopped while the
    agent streams 64 MB: the agent cannot finish (it blocks on its full pipe), the proxy holds
    a few MiB, and once ``cat`` resumes every byte arrives, in order."""
    total = 64_000_000
    # The client's stdin is empty, so the grace period starts at once; the agent, blocked by
    # the paused ``cat``, must outlive the pause and the drain however loaded the machine is.
    config = write_config(tmp_path / "c.yaml", CONFIG + "agent: {grace_period: 120}\n")
    done = tmp_path / "agent_done"
    received = tmp_path / "received"
    cat, write_end = paused_reader(received)
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "acp_proxy",
            "--config",
            config,
            "--log-level",
            "warning",
            "--",
            sys.executable,
            str(STREAM_AGENT),
            "--bytes",
            str(total),
            "--done",
            str(done),
        ],
        stdin=subprocess.DEVNULL,
        stdout=write_end,
        env=proxy_env(),
        cwd=str(REPO),
    )
    os.close(write_end)
    try:
        # The proxy stops reading the agent: the agent waits in a write to its full stdout.
        await wait_until(
            lambda: any(map(blocked_writing, children(proxy.pid))), "the agent blocked"
        )
        assert not done.exists()
        status = Path(f"/proc/{proxy.pid}/status").read_text()
        rss_kib = int(next(x for x in status.splitlines() if x.startswith("VmRSS:")).split()[1])
        assert rss_kib < 100 * 1024
        cat.send_signal(signal.SIGCONT)
        with anyio.fail_after(120):
            while proxy.poll() is None or cat.poll() is None:
                await anyio.sleep(0.05)
    finally:
        for proc in (proxy, cat):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proxy.returncode == 0
    assert done.exists()
    assert received.read_bytes() == b"".join(stream_lines(total, 0))
