"""Record files and an ``acp-proxy ui`` server for the live-view tests."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
from proxy_harness import close_pipes

URL = re.compile(rb"record\(s\) at (http://\S+)")


def big_record(path: Path, frames: int) -> Path:
    """A record of ``frames`` small frames (a request and its response, alternately)."""
    lines = [orjson.dumps({"acp-proxy-record": 1, "started": "2026-01-01T00:00:00Z"})]
    for i in range(frames // 2):
        params = {"p": f"frame-{2 * i}"}
        request = {"jsonrpc": "2.0", "id": i, "method": "fs/read", "params": params}
        response = {"jsonrpc": "2.0", "id": i, "result": {"text": f"frame-{2 * i + 1}"}}
        for direction, message in (("agent_to_client", request), ("client_to_agent", response)):
            raw = orjson.dumps(message).decode()
            lines.append(orjson.dumps({"t": i / 1000, "dir": direction, "raw": raw}))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@contextmanager
def serve_record(*paths: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """``acp-proxy ui PATH...`` running; yields the URL it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "acp_proxy", "ui", *map(str, paths)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + timeout_s
        while True:
            line = proc.stderr.readline()
            assert line, "acp-proxy ui exited before printing its URL"
            found = URL.search(line)
            if found:
                break
            assert time.monotonic() < deadline
        yield found.group(1).decode()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        close_pipes(proc)
