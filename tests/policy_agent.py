"""A scripted ACP agent for the policy tests (real process, real pipes).

Usage: ``policy_agent.py VERSION NAME``. Answers ``initialize`` with protocolVersion VERSION
and its name (v1 ``agentInfo``, v2 ``info``), ``session/new`` with ``sessionId`` "sess_1",
and ``_test/send`` ``{"frames": [...]}`` by writing those frames (its own requests and
notifications) as they are, waiting for the answer to each request among them, and then
answering ``{"got": [answer, ...]}`` in the order the requests were sent. ``_test/notes``
is answered ``{"notes": [...]}``: the notifications it received so far. Other requests are
answered ``{"echo": params}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _write(out: Any, message: Any) -> None:
    out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    out.flush()


def main(argv: list[str]) -> int:
    version, name = int(argv[0]), argv[1]
    out = sys.stdout.buffer
    waiting: dict[Any, int] = {}  # request id -> place in ``got``
    got: list[Any] = []
    send_id: Any = None
    notes: list[Any] = []  # the notifications received (session/cancel...)
    for raw in sys.stdin.buffer:
        message = json.loads(raw)
        if "method" not in message:
            if message.get("id") in waiting:
                got[waiting.pop(message["id"])] = message
                if not waiting and send_id is not None:
                    _write(out, {"jsonrpc": "2.0", "id": send_id, "result": {"got": got}})
                    send_id, got = None, []
            continue
        if "id" not in message:
            notes.append(message)
            continue
        method, params = message["method"], message.get("params")
        if method == "initialize":
            info = {"name": name, "version": "1.0.0"}
            result: Any = {"protocolVersion": version, "authMethods": []}
            if version == 1:
                result.update(agentCapabilities={}, agentInfo=info)
            else:
                result.update(capabilities={}, info=info)
        elif method == "session/new":
            result = {"sessionId": "sess_1"}
        elif method == "_test/notes":
            result = {"notes": notes}
        elif method == "_test/send":
            for frame in params["frames"]:
                if "id" in frame and "method" in frame:
                    waiting[frame["id"]] = len(got)
                    got.append(None)
                out.write(json.dumps(frame, separators=(",", ":")).encode() + b"\n")
            out.flush()
            if waiting:
                send_id = message["id"]
                continue
            result = {"got": []}
        else:
            result = {"echo": params}
        _write(out, {"jsonrpc": "2.0", "id": message["id"], "result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
