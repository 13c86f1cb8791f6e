"""A paused client never hangs a session on a socket either: random streams and random pause
patterns through ``--listen`` over a Unix socket, over a WebSocket, and with ``detach_grace``
(each has its own write path toward the client: the socket's direct write, the WebSocket's
frames made ahead of the kernel, the held session's writer turn and its cut lines).

As ``tests/shell/streams/test_paused_client.py`` on stdio: a real proxy runs
``random_stream_agent.py`` (many entities, ``_meta`` clears and key removals, chunks, snapshots),
which streams as fast as it can and exits; this process is the client and follows a random
pattern of pauses (reading nothing from its socket) and bursts, then reads to the end. Every run
must end (EOF within a bound) with the client in exactly the state the agent's stream gives.
"""

from __future__ import annotations

import random
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from coalesce_harness import RANDOM_AGENT, random_agent_stream, v2_client_state
from proxy_harness import REPO, close_pipes
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

UPDATES = 12_000
RUN_BOUND_S = 30.0
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": 2, "clientCapabilities": {}},
}


def _pattern(seed: int) -> list[tuple[float, int]]:
    """(pause in seconds, then bytes read as fast as possible) steps, after the answer to
    ``initialize``."""
    rng = random.Random(seed ^ 0x50C)
    steps = [(rng.uniform(0.2, 0.4), rng.choice([1, 4096, 256 * 1024]))]
    for _ in range(rng.randrange(2, 5)):
        steps.append((rng.uniform(0.08, 0.25), rng.choice([1, 64 * 1024, 512 * 1024])))
    return steps


class _Lines:
    """The client's side of the connection: raw bytes read as the pattern says, turned into
    lines (a WebSocket's text frames, each one line)."""

    def __init__(self, sock: socket.socket, ws: ClientProtocol | None) -> None:
        self.sock = sock
        self.ws = ws
        self.raw = 0  # bytes read from the socket
        self.lines: list[bytes] = []
        self._partial = b""
        self.eof = False

    def feed(self, data: bytes) -> None:
        self.raw += len(data)
        if self.ws is None:
            data, self._partial = self._partial + data, b""
            *whole, self._partial = data.split(b"\n")
            self.lines += whole
            return
        if data:
            self.ws.receive_data(data)
        else:
            self.ws.receive_eof()
        for event in self.ws.events_received():
            if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                self.lines.append(bytes(event.data))

    def read(self, want: int | None, deadline: float, seed: int, stderr: Path) -> None:
        """Read until ``want`` raw bytes in all (``None``: until EOF)."""
        while (want is None or self.raw < want) and not self.eof:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                tail = stderr.read_text(errors="replace")[-4000:]
                pytest.fail(
                    f"seed {seed}: no byte for the rest of {RUN_BOUND_S} s after {self.raw} "
                    f"bytes ({len(self.lines)} lines); the proxy said:\n{tail}"
                )
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            self.eof = not chunk
            self.feed(chunk)


def _listening_address(stderr: Path, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + RUN_BOUND_S
    while time.monotonic() < deadline:
        for line in stderr.read_bytes().splitlines():
            if line.startswith(b"{") and (event := orjson.loads(line))["event"] == "listening":
                return str(event["address"])
        assert proc.poll() is None, stderr.read_text(errors="replace")
        time.sleep(0.02)
    raise AssertionError("the proxy never said where it listens")


def _connect(address: str) -> tuple[socket.socket, ClientProtocol | None]:
    if address.startswith("unix://"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address.removeprefix("unix://"))
        return sock, None
    host_port = address.removeprefix("ws://").split("/")[0]
    sock = socket.create_connection(("127.0.0.1", int(host_port.rpartition(":")[2])))
    ws = ClientProtocol(parse_uri(address))
    ws.send_request(ws.connect())
    sock.sendall(b"".join(ws.data_to_send()))
    while not (events := ws.events_received()):
        ws.receive_data(sock.recv(1 << 16))
    assert isinstance(events[0], Response) and events[0].status_code == 101
    return sock, ws


def run_paused_socket_client(
    seed: int, tmp_path: Path, listen: str, config: str
) -> tuple[list[bytes], str]:
    """One session through ``acp-proxy --listen listen`` with a paused and resumed client:
    (the lines it read after the answer to ``initialize``, the proxy's stderr)."""
    stderr = tmp_path / f"stderr-{seed}"
    config_path = tmp_path / f"proxy-{seed}.yaml"
    config_path.write_text(config or "{}\n")
    agent = [sys.executable, str(RANDOM_AGENT), "--seed", str(seed), "--updates", str(UPDATES)]
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "acp_proxy", "--log-format", "json", "--config",
             str(config_path), "--listen", listen, "--", *agent],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO,
        )  # fmt: skip
    try:
        sock, ws = _connect(_listening_address(stderr, proc))
        with sock:
            first = orjson.dumps(INIT)
            if ws is not None:
                ws.send_text(first)
                sock.sendall(b"".join(ws.data_to_send()))
            else:
                sock.sendall(first + b"\n")
            client = _Lines(sock, ws)
            deadline = time.monotonic() + RUN_BOUND_S
            client.read(1, deadline, seed, stderr)
            while not client.lines:
                client.read(client.raw + 1, deadline, seed, stderr)
            assert orjson.loads(client.lines[0])["result"]["protocolVersion"] == 2
            for pause, amount in _pattern(seed):
                time.sleep(pause)
                client.read(client.raw + amount, deadline, seed, stderr)
            client.read(None, deadline, seed, stderr)
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        close_pipes(proc)
    return client.lines[1:], stderr.read_text(errors="replace")


# Each transport with a seed (a stream and a pause pattern), the WebSocket with two (its frames
# are made ahead of the kernel: the most state between a pause and a resume), a small queue
# bound (its paused-input cap is reached sooner).
SMALL = "coalesce: {max_queue_messages: 256}\n"
CASES = [
    ("unix", SMALL, 0),
    ("ws", SMALL, 1),
    ("ws", SMALL, 2),
    ("unix", SMALL + "detach_grace: 30\n", 3),
]


@pytest.mark.parametrize(("transport", "config", "seed"), CASES)
def test_a_paused_then_resumed_socket_client_gets_the_exact_state_and_the_end(
    transport: str, config: str, seed: int, tmp_path: Path
) -> None:
    listen = f"unix://{tmp_path / 'proxy.sock'}" if transport == "unix" else "ws://127.0.0.1:0/acp"
    lines, stderr = run_paused_socket_client(seed, tmp_path, listen, config)
    assert v2_client_state(lines) == v2_client_state(random_agent_stream(seed, UPDATES))
    assert "watchdog" not in stderr
