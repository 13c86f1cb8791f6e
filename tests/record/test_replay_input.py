"""``acp-proxy replay`` reading the live side: the project's bounded line splitter, so a long
line costs linear work and a line over ``--max-frame-bytes`` is refused as the proxy refuses it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from test_record_read import INIT, run_cli, session

from acp_proxy.cli.replay_command import read_lines
from acp_proxy.wire.framing import Line, LineSplitter, Oversize


class CountingSplitter(LineSplitter):
    """A splitter that counts what it is handed."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.calls = 0
        self.fed = 0

    def feed(self, data: bytes) -> list[Line | Oversize]:
        self.calls += 1
        self.fed += len(data)
        return super().feed(data)


def test_a_16_mib_line_without_a_newline_is_read_in_linear_work() -> None:
    data = b"x" * (16 << 20)  # no newline: the line ends at EOF
    read, write = os.pipe()

    def writer() -> None:
        with os.fdopen(write, "wb") as w:
            w.write(data)

    thread = threading.Thread(target=writer)
    thread.start()
    splitter = CountingSplitter(64 << 20)
    try:
        events = list(read_lines(read, splitter))
    finally:
        thread.join()
        os.close(read)
    assert events == [Line(data)]
    # Each byte is handed to the splitter once (the old loop split the whole pending buffer
    # again on every 64 KiB read: 256 passes over up to 16 MiB).
    assert splitter.fed == len(data)
    assert splitter.calls >= 256 and splitter.buffered == 0


def test_a_client_line_over_the_limit_gets_the_proxys_error_and_diverges(tmp_path: Path) -> None:
    record = tmp_path / "r.jsonl"
    record.write_bytes(session())
    big = {"jsonrpc": "2.0", "id": 7, "method": "session/prompt", "params": {"x": "a" * 5000}}
    line = json.dumps(big, separators=(",", ":")).encode()
    client = json.dumps(INIT).encode() + b"\n" + line + b"\n"
    done = run_cli("replay", "--speed", "0", "--max-frame-bytes", "1000", str(record), stdin=client)
    text = f"acp-proxy: message of {len(line)} bytes exceeds the 1000-byte limit; not forwarded"
    error = {"jsonrpc": "2.0", "id": 7, "error": {"code": -32600, "message": text}}
    recorded = [json.loads(x)["raw"].encode() for x in session().splitlines()[3:5]]
    assert done.stdout == b"".join(
        [
            recorded[0] + b"\n",
            recorded[1] + b"\n",
            json.dumps(error, separators=(",", ":")).encode() + b"\n",
        ]
    )
    assert done.stderr.decode().splitlines() == [
        f"acp-proxy replay: client message 2 of {len(line)} bytes exceeds the 1000-byte "
        "limit (--max-frame-bytes); not read"
    ]
    assert done.returncode == 1
