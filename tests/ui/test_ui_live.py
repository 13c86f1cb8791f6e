"""The live view on live sessions through real processes: what it shows is redacted, and every
connection of a ``--listen`` proxy is a session of its own."""

from __future__ import annotations

import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import orjson
import pytest
from http_client import http
from proxy_harness import REPO, end_process, proxy_env

TINY = [sys.executable, "-S", str(REPO / "tests" / "tiny_agent.py")]
UI_URL = re.compile(r"live view at (http://\S+)")
SECRET = "sk-" + "A1b2C3d4" * 4


@contextmanager
def proxy(*options: str) -> Iterator[tuple[subprocess.Popen[bytes], queue.Queue[str]]]:
    argv = [sys.executable, "-m", "acp_proxy", "--log-format", "json", "--ui", "tcp://127.0.0.1:0"]
    proc = subprocess.Popen(
        [*argv, *options, "--", *TINY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=proxy_env(),
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    stderr = proc.stderr

    def pump() -> None:
        for raw in stderr:
            lines.put(raw.decode())

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    try:
        yield proc, lines
    finally:
        end_process(proc, 20, terminate=True)
        pumping.join(10)  # the proxy exited: its stderr is at EOF


def _wait_for(lines: queue.Queue[str], pattern: str) -> str:
    deadline = time.monotonic() + 30
    while True:
        line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
        if pattern in line:
            return line


def _history(url: str) -> list[Any]:
    token = url.split("token=")[1]
    status, body = http(url, f"/history?token={token}")
    assert status == 200
    text = body.split(b"\r\n\r\n", 1)[1]
    return [orjson.loads(line) for line in text.splitlines() if line]


def _until(check: Any) -> Any:
    deadline = time.monotonic() + 20
    while not (found := check()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return found


def test_what_the_view_shows_is_redacted() -> None:
    with proxy() as (proc, lines):
        url = UI_URL.search(_wait_for(lines, "live view at"))
        assert url is not None
        request = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "_test/echo",
            "params": {"apiKey": "plain-value", "note": f"key {SECRET} here"},
        }
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(orjson.dumps(request) + b"\n")
        proc.stdin.flush()
        echoed = proc.stdout.readline()
        assert SECRET.encode() in echoed  # the wire is untouched: only the view is redacted

        def frames() -> list[Any]:
            return [e for e in _history(url.group(1)) if e.get("dir")]

        shown = _until(lambda: len(frames()) >= 2 and frames())
        text = orjson.dumps(shown).decode()
        assert SECRET not in text and "plain-value" not in text
        assert all(e["redacted"] for e in shown)
        assert '\\"apiKey\\":\\"[REDACTED]\\"' in text


def test_each_connection_of_a_listener_is_a_session() -> None:
    with proxy("--listen", "tcp://127.0.0.1:0") as (_, lines):
        ui = UI_URL.search(_wait_for(lines, "live view at"))
        assert ui is not None
        address = orjson.loads(_wait_for(lines, '"listening"'))["address"]
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        clients = []
        for n in (1, 2):
            client = socket.create_connection((host, int(port)), timeout=10)
            init: dict[str, Any] = {"jsonrpc": "2.0", "id": n, "method": "initialize", "params": {}}
            client.sendall(orjson.dumps(init) + b"\n")
            assert client.recv(65536)
            clients.append(client)
        events = _until(
            lambda: (
                len({e["conn"] for e in _history(ui.group(1)) if e.get("dir")}) == 2
                and _history(ui.group(1))
            )
        )
        sessions = [e["conn"] for e in events if e.get("event") == "session"]
        assert len(sessions) == 2
        by_conn = {e["conn"]: e["info"]["id"] for e in events if e.get("dir") == "client_to_agent"}
        assert sorted(by_conn.values()) == [1, 2]
        for client in clients:
            client.close()


@pytest.mark.anyio
async def test_component_mode_serves_the_live_view() -> None:
    from conductor_harness import handshake, start

    comp = await start("--ui", "tcp://127.0.0.1:0")
    assert comp.process.stderr is not None
    err = b""
    with anyio.fail_after(30):
        while (found := UI_URL.search(err.decode(errors="replace"))) is None:
            err += await comp.process.stderr.receive()
    await handshake(comp, "official")
    url = found.group(1)

    def initialize() -> list[Any]:
        return [
            e
            for e in _history(url)
            if e.get("dir")
            and (e["info"].get("method") or e["info"].get("answers")) == "initialize"
        ]

    shown = await anyio.to_thread.run_sync(
        lambda: _until(lambda: len(found := initialize()) >= 2 and found)
    )
    assert [e["info"]["type"] for e in shown] == ["request", "response"]
    rc, _ = await comp.close()
    assert rc == 0


def test_the_agents_stderr_is_shown_redacted() -> None:
    script = f"import sys; sys.stderr.write('booting {SECRET}\\n'); sys.stderr.flush()"
    agent = ["sh", "-c", f'{sys.executable} -c "{script}"; exec "$@"', "agent", *TINY]
    argv = [sys.executable, "-m", "acp_proxy", "--ui", "tcp://127.0.0.1:0", "--agent-stderr", "log"]
    proc = subprocess.Popen(
        [*argv, "--", *agent],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=proxy_env(),
    )
    draining: threading.Thread | None = None
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        while (found := UI_URL.search(line.decode())) is None:
            line = proc.stderr.readline()
            assert line
        draining = threading.Thread(target=proc.stderr.read, daemon=True)
        draining.start()

        def stderr_events() -> list[Any]:
            return [e for e in _history(found.group(1)) if e.get("event") == "stderr"]

        (event,) = _until(stderr_events)
        assert event["line"] == "booting [REDACTED]"
        assert event["conn"] == 1
    finally:
        end_process(proc, 20)
        if draining is not None:
            draining.join(10)  # the proxy exited: its stderr is at EOF


# An agent that says on its stderr which request it is answering, then answers it.
ECHO_STDERR = """
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    sys.stderr.write("agent answering request %s\\n" % message["id"])
    sys.stderr.flush()
    reply = {"jsonrpc": "2.0", "id": message["id"], "result": {"protocolVersion": 1}}
    sys.stdout.write(json.dumps(reply) + "\\n")
    sys.stdout.flush()
"""


def test_each_connections_agent_stderr_is_shown_in_its_session() -> None:
    argv = [sys.executable, "-m", "acp_proxy", "--log-format", "json", "--ui", "tcp://127.0.0.1:0"]
    argv += ["--agent-stderr", "log", "--listen", "tcp://127.0.0.1:0"]
    proc = subprocess.Popen(
        [*argv, "--", sys.executable, "-c", ECHO_STDERR],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=proxy_env(),
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    stderr = proc.stderr

    def pump() -> None:
        for raw in stderr:
            lines.put(raw.decode())

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    clients: list[socket.socket] = []
    try:
        ui = UI_URL.search(_wait_for(lines, "live view at"))
        assert ui is not None
        address = orjson.loads(_wait_for(lines, '"listening"'))["address"]
        host, port = address.removeprefix("tcp://").rsplit(":", 1)

        def ask(client: socket.socket, n: int) -> None:
            request = {"jsonrpc": "2.0", "id": n, "method": "initialize", "params": {}}
            client.sendall(orjson.dumps(request) + b"\n")
            assert orjson.loads(client.recv(65536))["id"] == n

        for n in (1, 2):
            clients.append(socket.create_connection((host, int(port)), timeout=10))
            ask(clients[-1], n)
        ask(clients[0], 3)  # the first connection's agent speaks again, after the second began

        def shown() -> list[Any]:
            said = [e for e in _history(ui.group(1)) if e.get("event") == "stderr"]
            return said if len(said) == 3 else []

        said = _until(shown)
        events = _history(ui.group(1))
        asked = {e["info"]["id"]: e["conn"] for e in events if e.get("dir") == "client_to_agent"}
        assert len(set(asked.values())) == 2
        # Each line in the session of the connection whose agent wrote it.
        by_line = {e["line"]: e["conn"] for e in said}
        assert by_line == {f"agent answering request {n}": asked[n] for n in (1, 2, 3)}
        assert asked[1] == asked[3] != asked[2]
    finally:
        for client in clients:
            client.close()
        end_process(proc, 20, terminate=True)
        pumping.join(10)  # the proxy exited: its stderr is at EOF
