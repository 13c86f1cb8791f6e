"""The exit sweep finds processes the agent detached and that keep forking (Linux, /proc).

A one-pass sweep (list the descendants, SIGKILL each) loses a process that forks between the
listing and the kill: the new child is adopted by the proxy (a subreaper) after its parent dies,
and nobody looks again. The sweep stops (SIGSTOP) what it finds until a pass finds nothing new,
then kills: a stopped process cannot fork.

Survivors are found by the session cookie in their environment (``ACP_PROXY_SESSION``), whoever
adopted them after the proxy. Every forker here ends by itself (a stop file, a deadline), so a
failing test leaves nothing running for long.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from proxy_harness import FAKE_AGENT, REPO, Lines, init_response, proxy_env, request

from acp_proxy.shell.agent.spawn import SESSION_ENV

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux-only guarantees"),
]

BOUND = 20.0
# A detached (setsid) process that keeps forking: eight fork-and-exit chains (each generation
# forks the next and exits at once, so the live process changes pid every fork), each
# generation leaving a sleeping child. Everything ends by itself when STOP exists or after 20 s.
FORKER = """
import os, sys, time
stop, started = sys.argv[1], sys.argv[2]
os.setsid()
end = time.monotonic() + 20
for _ in range(7):  # eight chains
    if os.fork() == 0:
        break
else:
    open(started, "w").close()
generation = 0
while not os.path.exists(stop) and time.monotonic() < end:
    if os.fork():
        os._exit(0)
    generation += 1
    if os.fork() == 0:
        while not os.path.exists(stop) and time.monotonic() < end:
            time.sleep(0.05)
        os._exit(0)
"""


def _with_cookie(prefix: bytes) -> list[int]:
    """Live (not zombie) processes whose environment holds ``SESSION_ENV=prefix...``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in (b"Z", b"X") and any(v.startswith(prefix) for v in environ.split(b"\0")):
            found.append(int(entry))
    return found


async def test_a_detached_process_that_keeps_forking_is_gone_after_the_proxy_exits(
    tmp_path: Path,
) -> None:
    stop, started = tmp_path / "stop", tmp_path / "started"
    agent = (
        f'{sys.executable} -c "$FORKER" {stop} {started} </dev/null >/dev/null 2>&1 & '
        f"exec {sys.executable} {FAKE_AGENT}"
    )
    cmd = [sys.executable, "-m", "acp_proxy", "--", "sh", "-c", agent]
    try:
        with (tmp_path / "log").open("wb") as err:
            proxy = await anyio.open_process(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=proxy_env(FORKER=FORKER),
                cwd=str(REPO),
            )
        async with proxy:
            assert proxy.stdin is not None and proxy.stdout is not None
            with anyio.fail_after(BOUND):
                await proxy.stdin.send(request(1, "initialize", {}))
                assert await Lines(proxy.stdout).line() == init_response(1)
                while not started.exists():
                    await anyio.sleep(0.01)
            await anyio.sleep(0.3)  # let it fork a while: many generations, many children
            cookie = f"{SESSION_ENV}={proxy.pid}.".encode()
            assert len(_with_cookie(cookie)) > 2  # alive and forking
            await proxy.stdin.aclose()
            with anyio.fail_after(BOUND):
                assert await proxy.wait() == 0
        # Anything the sweep missed is still forking now: look a few times.
        survivors: list[int] = []
        for _ in range(5):
            survivors += _with_cookie(cookie)
            time.sleep(0.05)
        assert survivors == []
    finally:
        stop.touch()
