"""A tiny ACP agent answering every request at once, for round-trip latency (scenario 3).

Contract: reads newline-delimited JSON-RPC from stdin and writes one response per request:
``initialize`` -> the client's version (v1 or v2 result shape), ``session/new`` -> a session id,
``session/prompt`` -> the v2 ``{"messageId": ...}`` or v1 ``{"stopReason": "end_turn"}`` result,
anything else -> ``{}``. Notifications and responses get no answer. Exits at EOF.
Usage: ``python bench/echo_agent.py [--boot-ms N]``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import orjson
from replay_agent import report_rusage


def answer(msg: Any, version: list[int]) -> bytes | None:
    if not isinstance(msg, dict) or "method" not in msg or "id" not in msg:
        return None
    method, rid = msg["method"], msg["id"]
    result: dict[str, Any]
    if method == "initialize":
        version[0] = 2 if msg.get("params", {}).get("protocolVersion", 1) >= 2 else 1
        info = {"name": "bench-echo-agent", "version": "1.0.0"}
        result = (
            {"protocolVersion": 2, "info": info, "capabilities": {}}
            if version[0] == 2
            else {"protocolVersion": 1, "agentCapabilities": {}, "agentInfo": info}
        )
    elif method == "session/new":
        result = {"sessionId": "sess_echo"}
    elif method == "session/prompt":
        result = {"messageId": f"msg_{rid}"} if version[0] == 2 else {"stopReason": "end_turn"}
    else:
        result = {}
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result}) + b"\n"


def main() -> int:
    # ``--boot-ms N``: sleep N ms before serving, like an agent that loads a runtime first (a
    # Node agent: several hundred ms); bench/startup.py --first-response uses it.
    if len(sys.argv) == 3 and sys.argv[1] == "--boot-ms":
        time.sleep(int(sys.argv[2]) / 1000)
    version = [2]
    tail = b""
    while True:
        data = os.read(0, 1 << 16)
        if not data:
            break
        lines = (tail + data).split(b"\n")
        tail = lines.pop()
        out: list[bytes] = []
        for line in lines:
            if line.strip():
                try:
                    reply = answer(orjson.loads(line), version)
                except orjson.JSONDecodeError:
                    continue
                if reply is not None:
                    out.append(reply)
        if out:
            data = b"".join(out)
            view = memoryview(data)
            while view:
                view = view[os.write(1, view) :]
    report_rusage()
    return 0


if __name__ == "__main__":
    sys.exit(main())
