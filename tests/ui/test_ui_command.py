"""``acp-proxy ui FILE``: what is not a record file is refused at once, with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _ui(path: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", "ui", path],
        capture_output=True,
        check=False,
        timeout=20,
        stdin=subprocess.DEVNULL,
    )


NOT_REGULAR = (
    b"not a regular file (acp-proxy ui reads record files written by --record; "
    b"to look at a session while it runs, use --ui)\n"
)


@pytest.mark.parametrize("path", ["/dev/zero", "{fifo}", "{dir}"])
def test_what_is_not_a_regular_file_is_refused(tmp_path: Path, path: str) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: opening it for reading would wait for one
    path = path.format(fifo=fifo, dir=tmp_path)
    ran = _ui(path)
    assert ran.returncode == 2
    assert ran.stderr == f"acp-proxy: {path}: ".encode() + NOT_REGULAR


def test_a_first_line_longer_than_a_header_is_refused(tmp_path: Path) -> None:
    record = tmp_path / "big.jsonl"
    record.write_bytes(b"x" * (3 * 1024 * 1024))  # no newline: read up to the bound only
    ran = _ui(str(record))
    assert ran.returncode == 2
    assert (
        ran.stderr
        == (
            f"acp-proxy: {record}: not a record: the first line is longer than a header can be\n"
        ).encode()
    )
