"""A v1 ACP agent for the detach tests: a turn that goes on while its client is away.

Answers ``initialize`` (protocol 1; ``agentCapabilities.loadSession`` true with the argument
``load``), ``session/new`` (``{"sessionId": "sess-1"}``), ``session/load`` (``{}``, after one
replayed chunk ``"history"``), ``_test/pid`` (``{"pid": N}``). A ``session/prompt`` whose first
text block is a JSON object ``{"before": N, "after": M, "go": PATH, "done": PATH, "size": S,
"ask": BOOL}`` sends N chunks ``before-I``, waits until the file ``go`` exists, sends M chunks
``after-I`` (padded to S bytes of text), then, with ``ask``, a ``session/request_permission``
(id ``"perm-1"``) and a chunk ``permission: OUTCOME`` once it is answered, then answers the
prompt ``{"stopReason": "end_turn"}`` and creates the file ``done``. Exits at stdin EOF.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

OUT = sys.stdout.buffer
IN = sys.stdin.buffer


def send(message: dict[str, Any]) -> None:
    OUT.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    OUT.flush()


def chunk(text: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "sess-1",
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text},
            },
        },
    }


def wait_file(path: str) -> None:
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def permission() -> str:
    send(
        {
            "jsonrpc": "2.0",
            "id": "perm-1",
            "method": "session/request_permission",
            "params": {
                "sessionId": "sess-1",
                "toolCall": {"toolCallId": "call-1", "title": "write a file"},
                "options": [{"optionId": "ok", "name": "Allow", "kind": "allow_once"}],
            },
        }
    )
    for raw in IN:
        message = json.loads(raw)
        if message.get("id") == "perm-1" and "method" not in message:
            result = message.get("result") or {}
            return str(result.get("outcome", {}).get("outcome", "error"))
    return "eof"


def turn(rid: object, spec: dict[str, Any]) -> None:
    for i in range(spec.get("before", 0)):
        send(chunk(f"before-{i}"))
    wait_file(spec["go"])
    size = spec.get("size", 0)
    for i in range(spec.get("after", 0)):
        send(chunk(f"after-{i}".ljust(size, ".")))
    if spec.get("ask"):
        send(chunk(f"permission: {permission()}"))
    send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
    with open(spec["done"], "w"):
        pass


def main() -> None:
    load = sys.argv[1:] == ["load"]
    for raw in IN:
        message = json.loads(raw)
        if "method" not in message or "id" not in message:
            continue
        rid, method, params = message["id"], message["method"], message.get("params") or {}
        if method == "initialize":
            caps = {"loadSession": load}
            send(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {"protocolVersion": 1, "agentCapabilities": caps},
                }
            )
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": "sess-1"}})
        elif method == "session/load":
            send(chunk("history"))
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "_test/pid":
            send({"jsonrpc": "2.0", "id": rid, "result": {"pid": os.getpid()}})
        elif method == "session/prompt":
            turn(rid, json.loads(params["prompt"][0]["text"]))
        else:
            send({"jsonrpc": "2.0", "id": rid, "result": {}})


if __name__ == "__main__":
    main()
