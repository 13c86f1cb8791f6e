"""The log file is private: it can hold what a record holds, so it is opened by the record's rules.

- Created ``0600`` whatever the umask; an existing one must be a regular file or a FIFO, owned by
  the user, with no group or other access, seen without following a link (a link planted at the
  path is refused, its target untouched); refusals exit 2 naming the path and the reason.
- The live view's access token is never in a log line (the log shows its first characters).
- The agent's stderr is redacted in the log as in the record, the live view and ``error.data``.

Real ``python -m acp_proxy`` processes.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

import anyio
import orjson
import pytest
from proxy_harness import REPO, Lines, proxy_cmd, proxy_env, request, run

pytestmark = pytest.mark.anyio

KEY = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz"


def _umask_022(cmd: list[str]) -> list[str]:
    """``cmd`` run with umask 022 (the common default, which made a world-readable log)."""
    return ["sh", "-c", 'umask 022; exec "$@"', "sh", *cmd]


async def test_a_new_log_file_is_created_private(tmp_path: Path) -> None:
    log_file = tmp_path / "proxy.log"
    ran = await run(_umask_022(proxy_cmd("--log-file", str(log_file))), b"")
    assert ran.rc == 0
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    assert b"starting" in log_file.read_bytes()


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (
            lambda p: (p.with_name("target").write_text("mine\n"), p.symlink_to("target")),
            "it is a symbolic link (a log is never written through a link)",
        ),
        (
            lambda p: (p.write_text("old\n"), p.chmod(0o644)),
            "others may access it (mode 0644); a log must be private: chmod 600 it, or choose "
            "a new path",
        ),
        (lambda p: p.mkdir(), "it is not a regular file or a FIFO"),
    ],
    ids=["symlink", "readable-by-others", "directory"],
)
async def test_a_log_path_the_rules_refuse_exits_2(tmp_path: Path, make: object, why: str) -> None:
    log_file = tmp_path / "proxy.log"
    make(log_file)  # type: ignore[operator]
    ran = await run(proxy_cmd("--log-file", str(log_file)), b"")
    assert ran.rc == 2
    assert ran.stderr == f"acp-proxy: --log-file {log_file}: {why}\n".encode()
    if log_file.is_symlink():
        assert (tmp_path / "target").read_text() == "mine\n"  # never written through the link


async def test_an_existing_private_log_file_is_appended_to(tmp_path: Path) -> None:
    log_file = tmp_path / "proxy.log"
    log_file.write_bytes(b"earlier\n")
    log_file.chmod(0o600)
    ran = await run(proxy_cmd("--log-file", str(log_file)), b"")
    assert ran.rc == 0
    assert log_file.read_bytes().startswith(b"earlier\n")
    assert b"starting" in log_file.read_bytes()


async def test_the_agent_stderr_is_redacted_in_the_log(tmp_path: Path) -> None:
    log_file = tmp_path / "proxy.log"
    agent = 'echo "Error: bad key $AGENT_KEY" >&2; exit 1'  # the key is not in the argv logged
    cmd = [
        sys.executable,
        "-m",
        "acp_proxy",
        *("--log-format", "json", "--agent-stderr", "log", "--log-file", str(log_file)),
        *("--", "sh", "-c", agent),
    ]
    ran = await run(cmd, b"", env=proxy_env(AGENT_KEY=KEY))
    assert ran.rc == 1
    events = [orjson.loads(line) for line in log_file.read_bytes().splitlines()]
    lines = [e["line"] for e in events if e["event"] == "agent stderr"]
    assert lines == ["Error: bad key [REDACTED]"]
    assert KEY.encode() not in log_file.read_bytes()


async def test_the_live_view_token_is_not_in_the_log(tmp_path: Path) -> None:
    log_file = tmp_path / "proxy.log"
    cmd = proxy_cmd(
        *("--log-format", "json", "--log-file", str(log_file), "--ui", "tcp://127.0.0.1:0")
    )
    with anyio.fail_after(20):
        async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
            assert proc.stdin is not None and proc.stderr is not None
            printed = await Lines(proc.stderr).line()
            await proc.stdin.send(request(1, "initialize", {}))
            await proc.stdin.aclose()
            assert await proc.wait() == 0
    # The user's copy of the URL, with its token, is on stderr only.
    found = re.fullmatch(
        rb"acp-proxy: live view at (http://127\.0\.0\.1:\d+/)\?token=(\S+)\n", printed
    )
    assert found is not None
    url, token = found.group(1).decode(), found.group(2).decode()
    text = log_file.read_text()
    assert token not in text
    [serving] = [
        e for e in map(orjson.loads, text.splitlines()) if e["event"] == "serving the live view"
    ]
    assert (serving["url"], serving["token"]) == (url, token[:4] + "…")
    assert stat.S_IMODE(os.stat(log_file).st_mode) == 0o600
