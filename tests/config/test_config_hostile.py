"""Hostile or broken config files are refused with ``FILE:LINE: reason`` and exit 2, never a
traceback: control characters YAML does not allow (NUL, ESC), integers too long for Python's
int conversion, numbers too large for a float, numbers written with thousands of digits.

Each case runs the real command line (``check-config`` and a real run), as a user would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from proxy_harness import REPO, proxy_env

CASES = [
    (
        "nul",
        b"agent:\n  grace_period: 1\x00\n",
        "2: a control character (U+0000) at column 18: YAML allows no control characters "
        "but tab, line feed and carriage return; remove it",
    ),
    (
        "escape",
        b"agent: \x1b[31m\n",
        "1: a control character (U+001B) at column 8: YAML allows no control characters "
        "but tab, line feed and carriage return; remove it",
    ),
    (
        "5000 digits",
        b"agent:\n  grace_period: " + b"9" * 5000 + b"\n",
        "2: a number written with 5000 characters (column 17): no setting takes a number "
        "longer than 64 characters; quote it if it is meant as text",
    ),
    (
        "400 digits for seconds",
        b"connect_timeout: " + b"9" * 400 + b"\n",
        "1: a number written with 400 characters (column 18): no setting takes a number "
        "longer than 64 characters; quote it if it is meant as text",
    ),
    (
        "a float of 4300 digits",
        b"max_frame_bytes: 1" + b"0" * 4299 + b".5\n",
        "1: a number written with 4302 characters (column 18): no setting takes a number "
        "longer than 64 characters; quote it if it is meant as text",
    ),
]


@pytest.mark.parametrize(("text", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("command", ["check-config", "run"])
def test_hostile_config_is_refused_with_file_line(
    tmp_path: Path, text: bytes, reason: str, command: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(text)
    if command == "check-config":
        argv = ["check-config", str(path)]
    else:
        argv = ["--config", str(path), "--", sys.executable, "-c", "pass"]
    done = subprocess.run(
        [sys.executable, "-m", "acp_proxy", *argv],
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr.decode()) == (
        2,
        b"",
        f"acp-proxy: {path}:{reason}\n",
    )


def test_long_numbers_in_quotes_are_text(tmp_path: Path) -> None:
    """The length rule is for numbers only: a quoted value of any length is a string."""
    path = tmp_path / "c.yaml"
    path.write_bytes(b'agent:\n  env:\n    BIG: "' + b"9" * 5000 + b'"\n')
    done = subprocess.run(
        [sys.executable, "-m", "acp_proxy", "check-config", str(path)],
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, b"")
