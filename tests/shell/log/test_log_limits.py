"""The log never floods and never holds up the session.

- A warning that repeats (requests refused past ``max_pending_requests``, frames over the size
  limit, ...) is logged the first time, then counted: one line with ``repeated=N`` every
  interval while it goes on, and one for the rest at the end of the session.
- The log writer never blocks the session: when stderr is not read (an editor that ignores it),
  log lines are dropped and counted, and a ``log lines dropped`` line says how many once
  stderr drains again (or at exit).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import orjson
import pytest
from proxy_harness import FAKE_AGENT, REPO, Lines, proxy_env, request, run, write_config

from acp_proxy.shell.log.repeats import Repeats

pytestmark = pytest.mark.anyio

PROXY = [sys.executable, "-m", "acp_proxy", "--log-format", "json"]
REFUSED = "too many requests awaiting an answer; request answered with an error"


async def test_refused_requests_log_one_warning_then_a_count(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", "max_pending_requests: 1\n")
    # The agent answers nothing after initialize: one request stays pending, the rest refused.
    requests = [request(1, "initialize", {})] + [request(i, "x", {}) for i in range(2, 3003)]
    cmd = [*PROXY, "--config", config, "--", sys.executable, str(FAKE_AGENT), "--silent-after", "1"]
    ran = await run(cmd, b"".join(requests))
    answers = [orjson.loads(line) for line in ran.stdout.splitlines()]
    refused = [a for a in answers if "error" in a]
    assert len(refused) >= 3000  # every refusal is answered ...
    warnings = ran.events(REFUSED)
    # ... but logged once, then counted (the end of the session says how many more).
    assert [w.get("repeated") for w in warnings] == [None, len(refused) - 1], warnings[:3]
    assert warnings[0]["level"] == "warning"


async def test_an_unread_stderr_never_holds_up_the_session(tmp_path: Path) -> None:
    """Debug logging writes several lines per frame; nobody reads the proxy's stderr. Every
    request is still answered, and the lines that could not be written are counted."""
    count = 3000
    cmd = [*PROXY, "--log-level", "debug", "--log-frames", "--", sys.executable, str(FAKE_AGENT)]
    proxy = await anyio.open_process(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=proxy_env(),
        cwd=str(REPO),
    )
    async with proxy:
        assert proxy.stdin is not None and proxy.stdout is not None and proxy.stderr is not None
        lines = Lines(proxy.stdout)
        with anyio.fail_after(30):
            await proxy.stdin.send(request(1, "initialize", {}))
            await lines.line()
            for i in range(2, count + 2):
                await proxy.stdin.send(request(i, "x", {"n": i, "pad": "p" * 1000}))
                assert orjson.loads(await lines.line())["id"] == i  # answered: not blocked
            await proxy.stdin.aclose()
            err = await Lines(proxy.stderr).rest()  # now stderr is read
            assert await proxy.wait() == 0
    events = [orjson.loads(line) for line in err.splitlines() if line.startswith(b"{")]
    dropped = [e for e in events if e["event"] == "log lines dropped (stderr was not read)"]
    assert dropped and all(e["count"] > 0 for e in dropped)
    assert events[-1]["event"] in ("exit", "log lines dropped (stderr was not read)")


def test_repeats_logs_the_first_then_a_count_every_interval() -> None:
    now = [0.0]
    lines: list[tuple[str, dict[str, object]]] = []

    def emit(event: str, **fields: object) -> None:
        lines.append((event, fields))

    repeats = Repeats(interval_s=10.0, clock=lambda: now[0])
    for t in (0.0, 1.0, 2.0, 10.5, 11.0, 12.0):
        now[0] = t
        repeats("a", emit, "refused", n=t)
    repeats("b", emit, "other")
    repeats.flush()
    repeats.flush()  # nothing new: no line
    assert lines == [
        ("refused", {"n": 0.0}),
        ("refused", {"repeated": 3, "n": 10.5}),
        ("other", {}),
        ("refused", {"repeated": 2, "n": 12.0}),
    ]
