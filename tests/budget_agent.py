"""A scripted ACP agent for the budgets tests (real process, real pipes).

Usage: ``budget_agent.py VERSION``. Answers ``initialize`` with protocolVersion VERSION,
``session/new`` with the next of "sess_1", "sess_2"... A ``session/prompt`` whose first text
block is a JSON script ``{"updates": [...], "usage": {...}?, "await_cancel": bool?}`` runs a
turn: v2 answers the prompt ``{}`` and reports ``running``; the updates are written as
``session/update`` notifications of the prompt's session; with ``await_cancel`` the agent then
reads until a ``session/cancel`` comes; the turn ends (v1: the prompt's result with its
``stopReason`` and ``usage``; v2: the idle ``state_update`` with them). ``_test/stats`` answers
``{"prompts": N, "cancels": M}``: the prompts and session/cancel notifications that reached it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any


def _write(out: Any, message: Any) -> None:
    out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    out.flush()


def _update(sid: str, update: Any) -> Any:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": sid, "update": update},
    }


def main(argv: list[str]) -> int:
    version = int(argv[0])
    out = sys.stdout.buffer
    prompts = cancels = sessions = 0
    lines: Iterator[bytes] = iter(sys.stdin.buffer)
    for raw in lines:
        message = json.loads(raw)
        method = message.get("method")
        if method is None:
            continue
        if "id" not in message:
            cancels += method == "session/cancel"
            continue
        rid, params = message["id"], message.get("params") or {}
        result: Any
        if method == "initialize":
            info = {"name": "budget-agent", "version": "1.0.0"}
            result = {"protocolVersion": version, "authMethods": []}
            if version == 1:
                result.update(agentCapabilities={}, agentInfo=info)
            else:
                result.update(capabilities={}, info=info)
        elif method == "session/new":
            sessions += 1
            result = {"sessionId": f"sess_{sessions}"}
        elif method == "_test/stats":
            result = {"prompts": prompts, "cancels": cancels}
        elif method == "session/prompt":
            prompts += 1
            sid = params["sessionId"]
            script = json.loads(params["prompt"][0]["text"])
            if version == 2:
                _write(out, {"jsonrpc": "2.0", "id": rid, "result": {}})
                _write(out, _update(sid, {"sessionUpdate": "state_update", "state": "running"}))
            for update in script.get("updates", []):
                _write(out, _update(sid, update))
            stop = "end_turn"
            if script.get("await_cancel"):
                for line in lines:
                    if json.loads(line).get("method") == "session/cancel":
                        cancels += 1
                        stop = "cancelled"
                        break
            end: Any = {"stopReason": stop}
            if "usage" in script:
                end["usage"] = script["usage"]
            if version == 1:
                _write(out, {"jsonrpc": "2.0", "id": rid, "result": end})
            else:
                idle = {"sessionUpdate": "state_update", "state": "idle", **end}
                _write(out, _update(sid, idle))
            continue
        else:
            result = {}
        _write(out, {"jsonrpc": "2.0", "id": rid, "result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
