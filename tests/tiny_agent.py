"""A minimal fake ACP agent for the socket tests: only ``sys``, ``os`` and ``json``, so dozens of
them start quickly (run it with ``python -S``).

Reads NDJSON requests on stdin until EOF, then exits 0. Answers ``initialize`` with protocol
version 2, ``_test/pid`` with ``{"pid": <its pid>}``, ``_test/stream`` ``{"count": N, "tag": T}``
with N ``session/update`` notifications (text T) and then ``{"streamed": N}``, anything else with
``{"echo": <params>}``; notifications are ignored. Answers are compact JSON with raw UTF-8
(``json.dumps`` with ``separators=(",", ":")`` and ``ensure_ascii=False``). With the argument
``stubborn`` it ignores SIGTERM and does not exit at stdin EOF (for the shutdown ladder).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any


def main() -> None:
    stubborn = sys.argv[1:] == ["stubborn"]
    if stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = sys.stdout.buffer
    for raw in sys.stdin.buffer:
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(message, dict) or "id" not in message or "method" not in message:
            continue
        method = message["method"]
        params: Any = message.get("params")
        if method == "initialize":
            result: object = {"protocolVersion": 2, "agentCapabilities": {}, "authMethods": []}
        elif method == "_test/pid":
            result = {"pid": os.getpid()}
        elif method == "_test/stream":
            note = {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": "s",
                    "update": {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": params["tag"]},
                    },
                },
            }
            out.write(
                (json.dumps(note, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
                * params["count"]
            )
            result = {"streamed": params["count"]}
        else:
            result = {"echo": params}
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        out.write(json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
        out.flush()
    while stubborn:
        time.sleep(60)


if __name__ == "__main__":
    main()
