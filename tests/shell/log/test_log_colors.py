"""The console log's colours on a terminal, and NO_COLOR (https://no-color.org): present and not
empty, it turns them off. Run with stderr on a real pseudo-terminal."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest
from proxy_harness import proxy_env


def _stderr_on_a_tty(no_color: str | None) -> bytes:
    env = proxy_env()
    env.pop("NO_COLOR", None)
    if no_color is not None:
        env["NO_COLOR"] = no_color
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "acp_proxy",
                "--log-level",
                "info",
                "--",
                sys.executable,
                "-c",
                "pass",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=follower,
            env=env,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0
        os.close(follower)
        follower = -1
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)


@pytest.mark.parametrize(("no_color", "coloured"), [(None, True), ("1", False), ("", True)])
def test_console_log_colours_follow_no_color(no_color: str | None, coloured: bool) -> None:
    out = _stderr_on_a_tty(no_color)
    assert b"starting" in out
    assert (b"\x1b[" in out) is coloured
