"""A session whose client pauses, for the live-view tests of coalescing: the proxy with ``--ui``
on stdio, an agent that answers a ``stream`` request with ``CHUNKS`` text chunks of one message
as fast as it can, and a client that reads nothing until the view shows the session read more
of them than the pipe to the client holds; then it reads everything. The chunks that waited in
the proxy's queue meanwhile were merged."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from proxy_harness import end_process, proxy_env
from ui_session import URL

CHUNKS = 6000
TEXT = "w" * 500  # 6000 chunks of about 640 bytes: 3.8 MB, more than any pipe holds

AGENT = f"""
import json, sys
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    message = json.loads(line)
    if message.get("method") == "stream":
        for n in range({CHUNKS}):
            update = {{"sessionUpdate": "agent_message_chunk", "messageId": "m1",
                       "content": {{"type": "text", "text": "{TEXT}%05d" % n}}}}
            note = {{"jsonrpc": "2.0", "method": "session/update",
                     "params": {{"sessionId": "s", "update": update}}}}
            out.write(json.dumps(note, separators=(",", ":")).encode() + b"\\n")
    result = {{"protocolVersion": 2}} if message["method"] == "initialize" else {{}}
    reply = {{"jsonrpc": "2.0", "id": message["id"], "result": result}}
    out.write(json.dumps(reply).encode() + b"\\n")
    out.flush()
"""


@dataclass
class PausedClient:
    url: str
    received: list[bytes] = field(default_factory=list)  # every line the client read


def _history(url: str) -> list[Any]:
    from http_client import http

    token = url.split("token=")[1]
    status, body = http(url, f"/history?token={token}")
    assert status == 200
    return [orjson.loads(line) for line in body.split(b"\r\n\r\n", 1)[1].splitlines() if line]


def shown(url: str, check: Any, timeout_s: float = 20.0) -> list[Any]:
    """The view's history once ``check`` holds for it."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = _history(url)
        if check(events):
            return events
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def chunks_read(events: list[Any]) -> int:
    return sum(1 for e in events if e.get("info", {}).get("update") == "agent_message_chunk")


@contextmanager
def paused_client() -> Iterator[PausedClient]:
    argv = [sys.executable, "-m", "acp_proxy", "--ui", "tcp://127.0.0.1:0"]
    proc = subprocess.Popen(
        [*argv, "--", sys.executable, "-c", AGENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=proxy_env(),
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    draining = threading.Thread(target=proc.stderr.read, daemon=True)
    try:
        line = proc.stderr.readline()
        while (found := URL.search(line.decode())) is None:
            line = proc.stderr.readline()
            assert line, "the proxy exited before serving the live view"
        draining.start()
        session = PausedClient(found.group(1))
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        stream = {"jsonrpc": "2.0", "id": 2, "method": "stream", "params": {}}
        proc.stdin.write(orjson.dumps(initialize) + b"\n" + orjson.dumps(stream) + b"\n")
        proc.stdin.flush()
        # Paused: the session reads on while the pipe to the client is full; its queue holds
        # the rest (and merges it).
        shown(session.url, lambda events: chunks_read(events) >= CHUNKS // 2)
        while True:  # now the client reads everything, up to the answer to "stream"
            line = proc.stdout.readline()
            assert line, "the proxy closed its output early"
            session.received.append(line)
            if line.startswith(b'{"jsonrpc": "2.0", "id": 2'):
                break
        yield session
    finally:
        end_process(proc, 20)
        if draining.is_alive():
            draining.join(10)  # the proxy exited: its stderr is at EOF
