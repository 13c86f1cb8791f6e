"""Bounded memory: the parse budget and the pending-request table, with real processes.

Each proxy runs under an address-space cap (``RLIMIT_AS``) so a regression fails here instead of
swapping the machine, and its peak RSS is measured through the small launcher of
``proxy_harness.measured_cmd`` (a fork from pytest would report pytest's own RSS).
"""

from __future__ import annotations

import hashlib
import resource
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from proxy_harness import (
    REPO,
    TIMEOUT,
    init_response,
    measured_cmd,
    proxy_cmd,
    proxy_env,
    request,
)

from acp_proxy.wire.connection.pipeline import DEFAULT_MAX_PENDING

pytestmark = pytest.mark.anyio

GIB = 1024**3

# An agent that answers initialize, then answers the next request with one legal 60 MiB result
# made of 20 million ``{}`` (a parse of it takes about 2 GB).
AMPLIFIER = r"""
import sys
sys.stdin.buffer.readline()
sys.stdout.buffer.write(b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2}}\n')
sys.stdout.flush()
sys.stdin.buffer.readline()
n = 20_000_000
sys.stdout.buffer.write(b'{"jsonrpc":"2.0","id":1,"result":[' + b"{}," * (n - 1) + b'{}]}\n')
sys.stdout.flush()
"""


def _cap(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


async def test_a_60_mib_frame_of_empty_objects_is_forwarded_within_bounds(tmp_path: Path) -> None:
    agent = tmp_path / "amplifier.py"
    agent.write_text(AMPLIFIER)
    rss_file = tmp_path / "rss"
    cmd = proxy_cmd("--log-format", "json")
    cmd = [*cmd[: cmd.index("--") + 1], sys.executable, str(agent)]
    client = request(0, "initialize", {"protocolVersion": 2}) + request(1, "x", {})

    def capped_run() -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            measured_cmd(rss_file, cmd),
            input=client,
            capture_output=True,
            env=proxy_env(),
            cwd=str(REPO),
            preexec_fn=lambda: _cap(GIB),
            timeout=TIMEOUT * 3,
            check=False,
        )

    done = await anyio.to_thread.run_sync(capped_run)
    lines = done.stdout.split(b"\n")
    assert lines[0] == b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2}}'
    expected = b'{"jsonrpc":"2.0","id":1,"result":[' + b"{}," * (20_000_000 - 1) + b"{}]}"
    # Byte-exact, and the request is answered (it used to die with SIGSEGV under 1 GiB).
    assert hashlib.sha256(lines[1]).digest() == hashlib.sha256(expected).digest()
    assert done.returncode == 0, done.stderr[-2000:]
    assert b"over the parse budget" in done.stderr
    peak_mib = int(rss_file.read_text()) / 1024
    # Measured about 200 MiB (the frame held by the framer, the block and the write); the old
    # code took about 2 GB. The margin is for other machines, not for a parse.
    assert peak_mib < 450, peak_mib


async def test_pending_requests_past_the_limit_get_an_error(tmp_path: Path) -> None:
    # The agent answers initialize and then nothing: every request stays in flight.
    n = DEFAULT_MAX_PENDING + 50
    client = request(0, "initialize", {"protocolVersion": 2}) + b"".join(
        request(i, "session/prompt", {"sessionId": "s", "prompt": []}) for i in range(1, n + 1)
    )
    cmd = proxy_cmd("--log-format", "json", agent=["--silent-after", "1"])
    with anyio.fail_after(TIMEOUT * 3):
        done = await anyio.run_process(
            cmd, input=client, check=False, env=proxy_env(), cwd=str(REPO)
        )
    lines = done.stdout.splitlines()
    assert init_response(0)[:-1] in lines
    refused = [ln for ln in lines if b"too many requests awaiting an answer" in ln]
    aborted = [ln for ln in lines if b'"code":-32603,"message":"agent exited' in ln]
    # Requests were forwarded while the table had room (the initialize request holds a place
    # until its response comes back) and answered with -32603 when the agent left; the ones past
    # the limit were answered at once, never forwarded. Every request gets exactly one answer.
    assert DEFAULT_MAX_PENDING - 1 <= len(aborted) <= DEFAULT_MAX_PENDING
    assert len(refused) + len(aborted) == n
    assert refused[-1].startswith(b'{"jsonrpc":"2.0","id":%d,"error"' % n)
    assert len(lines) == 1 + n
