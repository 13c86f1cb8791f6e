"""The cost of ``--record``: the same agent stream through the proxy with and without
a record, in one run, interleaved, best of N.

Contract: generates an agent stream (the ``initialize`` response, then MESSAGES
``session/update`` notifications of about 250 bytes, a realistic chunk size) played by
``bench/replay_agent.py``; runs ``python -m acp_proxy [--record FILE] -- replay_agent FILE``
with a client that sends ``initialize`` and reads stdout to EOF; reports wall time, messages per
second and the proxy's own CPU per message (``wait4`` of the proxy minus the agent's own
rusage), and the record's size. Usage: ``python bench/record_cost.py [MESSAGES] [ROUNDS]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def agent_file(path: Path, messages: int) -> None:
    init = {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 2, "agentCapabilities": {}}}
    lines = [json.dumps(init, separators=(",", ":"))]
    for i in range(messages):
        note = {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": "sess_1",
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "messageId": "msg_1",
                    "content": {"type": "text", "text": f"token {i} " + "lorem ipsum " * 10},
                },
            },
        }
        lines.append(json.dumps(note, separators=(",", ":")))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def once(agent: Path, record: Path | None, tmp: Path) -> dict[str, float]:
    rusage_file = tmp / "agent_rusage.json"
    env = dict(os.environ, BENCH_AGENT_RUSAGE=str(rusage_file), PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "acp_proxy"]
    if record is not None:
        record.unlink(missing_ok=True)
        cmd += ["--record", str(record)]
    cmd += ["--", sys.executable, str(HERE / "replay_agent.py"), str(agent)]
    init = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2}}\n'
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(init)
    proc.stdin.close()
    received = 0
    while chunk := proc.stdout.read(1 << 16):
        received += len(chunk)
    _, _, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    agent_usage = json.loads(rusage_file.read_text())
    cpu = (usage.ru_utime + usage.ru_stime) - (agent_usage["utime"] + agent_usage["stime"])
    return {
        "wall": wall,
        "cpu": cpu,
        "received": received,
        "record_bytes": record.stat().st_size if record is not None else 0,
    }


def main(argv: list[str]) -> int:
    messages = int(argv[1]) if len(argv) > 1 else 100_000
    rounds = int(argv[2]) if len(argv) > 2 else 3
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        agent = tmp / "agent.jsonl"
        agent_file(agent, messages)
        best: dict[str, dict[str, float]] = {}
        for _ in range(rounds):
            for label, record in (("plain", None), ("--record", tmp / "r.jsonl")):
                result = once(agent, record, tmp)
                if label not in best or result["wall"] < best[label]["wall"]:
                    best[label] = result
        print(
            f"{messages} session/update notifications ({agent.stat().st_size} bytes), "
            f"best of {rounds}"
        )
        print("| run | wall s | messages/s | proxy CPU µs/message | record bytes |")
        print("|---|---|---|---|---|")
        for label, r in best.items():
            print(
                f"| {label} | {r['wall']:.2f} | {messages / r['wall']:,.0f} "
                f"| {r['cpu'] / messages * 1e6:.1f} | {int(r['record_bytes']):,} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
