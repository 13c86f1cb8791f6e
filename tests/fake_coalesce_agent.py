"""A fake ACP v2 agent for the coalescing integration test (real process, real pipes).

It answers ``initialize`` with protocolVersion 2; on ``session/prompt`` it writes a burst of
``--updates N`` ``tool_call_update`` progress notifications over ``--tools K`` tool calls as fast
as the pipe takes them (``_meta`` patches with removals and one clear per tool call), then the
prompt's response. Other requests get ``{}``. Exits at stdin EOF.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def burst(n: int, tools: int) -> list[dict[str, Any]]:
    """The updates of the burst (also used by the test to compute the expected state)."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        t = i % tools
        tick = i // tools
        update: dict[str, Any] = {
            "sessionUpdate": "tool_call_update",
            "toolCallId": f"call_{t}",
            "rawOutput": {"progress": tick},
        }
        if tick == 0:
            update.update(
                title=f"tool {t}", status="in_progress", _meta={"x.dev/a": t, "x.dev/b": 1}
            )
        elif tick % 7 == 0:
            update["_meta"] = {"x.dev/tick": tick, "x.dev/b": None}  # b removed
        elif tick == n // tools // 2:
            update["_meta"] = None  # a clear in the middle
        elif tick % 5 == 0:
            update["_meta"] = {"x.dev/b": tick, "x.dev/n": {"nested": None}}
        if i >= n - tools:
            update["status"] = "completed"
        out.append(update)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=50_000)
    parser.add_argument("--tools", type=int, default=10)
    args = parser.parse_args()
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        message = json.loads(line)
        if "id" not in message or "method" not in message:
            continue
        if message["method"] == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": 2,
                "info": {"name": "fake", "version": "1"},
            }
        elif message["method"] == "session/prompt":
            sid = message["params"]["sessionId"]
            for update in burst(args.updates, args.tools):
                note = {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {"sessionId": sid, "update": update},
                }
                out.write(json.dumps(note, separators=(",", ":")).encode() + b"\n")
            result = {}
        else:
            result = {}
        response = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        out.write(json.dumps(response, separators=(",", ":")).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
