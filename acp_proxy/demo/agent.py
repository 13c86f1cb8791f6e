"""A scripted ACP v2 agent for ``acp-proxy demo``: ``python -m acp_proxy.demo.agent``.

Contract: speaks newline-delimited JSON-RPC 2.0 on stdin/stdout and plays one fixed script that
exercises every case of the v2 Metadata Patches RFD a proxy must get right. It never reads a
clock, a file or the network, so two runs produce the same bytes (the demo runs it twice: once
directly, once behind the proxy, and pairs the updates). Stdlib and orjson only.

What a prompt produces, in order (all real ACP v2 shapes, validated by tests/test_demo.py
against schema.unstable.json):

* ``state_update`` running, the ``user_message`` echo, then the ``session/prompt`` response
  (v2: the response acknowledges that the user message was inserted; completion is reported by
  the idle ``state_update``, see ``PromptResponse`` in the schema);
* a ``plan_update`` (a whole snapshot whose ``_meta`` is *not* a patch: a proxy leaves it alone);
* ``tool_call_update`` ``call_001`` creating the tool call with the agent's own ``_meta``;
* ``tool_call_update`` without ``_meta`` (omitted = unchanged: a proxy's annotation must not
  erase the agent's keys);
* ``terminal_update`` ``term_001`` (create, with ``_meta``), later one without ``_meta``;
* ``tool_call_update`` with a key set to ``null`` (RFD: "a key set to null is removed");
* ``tool_call_update`` with ``_meta: null`` (RFD: clears all stored metadata; a proxy must keep
  the clear and send its keys in a follow-up update);
* ``agent_message`` (an upsert) and an ``agent_message_chunk`` with chunk-scoped ``_meta``;
* ``state_update`` idle with ``stopReason: end_turn``.

With ``--ask-permission``, the agent asks the client ``session/request_permission`` (v2 shape,
``subject.toolCall`` naming ``call_001``) right after creating the tool call, and goes on with
the rest of the script once the client answers (whatever the answer): what the telemetry tests
use to see a permission wait inside a turn. The default script is unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Final

import orjson

from acp_proxy import __version__
from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.wire.errors import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RESOURCE_NOT_FOUND,
    error_object,
)
from acp_proxy.wire.framing import Line, LineSplitter, Oversize

PROTOCOL_VERSION: Final = 2
SESSION_ID: Final = "sess_demo_001"
USER_MESSAGE_ID: Final = "msg_user_001"
AGENT_MESSAGE_ID: Final = "msg_agent_001"
TOOL_CALL_ID: Final = "call_001"
TERMINAL_ID: Final = "term_001"
PLAN_ID: Final = "plan_001"
PERMISSION_REQUEST_ID: Final = "perm_001"


def _text(text: str) -> JsonObject:
    return {"type": "text", "text": text}


def scripted_updates(cwd: str) -> list[JsonObject]:
    """The ``update`` objects sent after the prompt response, in order (before the idle state)."""
    return [
        {
            "sessionUpdate": "plan_update",
            "plan": {
                "type": "items",
                "planId": PLAN_ID,
                "entries": [
                    {"content": "Read config.yaml", "priority": "high", "status": "in_progress"},
                    {"content": "Run the tests", "priority": "medium", "status": "pending"},
                ],
            },
            "_meta": {"acme.dev/planner": "v1"},
        },
        {
            # The first tool_call_update for a toolCallId creates the tool call (v2 migration).
            "sessionUpdate": "tool_call_update",
            "toolCallId": TOOL_CALL_ID,
            "title": "Read config.yaml",
            "kind": "read",
            "status": "pending",
            "_meta": {
                "zed.dev/progress": 0,
                "acme.dev/review": {"state": "pending"},
                "zed.dev/debugMode": True,
            },
        },
        {
            # `_meta` omitted: the client keeps the stored metadata as it is.
            "sessionUpdate": "tool_call_update",
            "toolCallId": TOOL_CALL_ID,
            "status": "in_progress",
        },
        {
            "sessionUpdate": "terminal_update",
            "terminalId": TERMINAL_ID,
            "command": "pytest -q",
            "cwd": cwd,
            "_meta": {"acme.dev/shell": "bash"},
        },
        {
            # RFD example: `null` removes one key, any other value replaces that key whole.
            "sessionUpdate": "tool_call_update",
            "toolCallId": TOOL_CALL_ID,
            "_meta": {"zed.dev/progress": None, "acme.dev/review": {"reviewer": "sam"}},
        },
        {
            "sessionUpdate": "terminal_update",
            "terminalId": TERMINAL_ID,
            "output": {"data": "MyBwYXNzZWQK"},  # base64 of "3 passed\n"
            "exitStatus": {"exitCode": 0, "signal": None},
        },
        {
            # `_meta: null` clears every stored key (RFD: "`_meta: null` clears all stored
            # metadata"); no single object can say "clear, then set k".
            "sessionUpdate": "tool_call_update",
            "toolCallId": TOOL_CALL_ID,
            "status": "completed",
            "content": [{"type": "content", "content": _text("3 settings, all valid.")}],
            "_meta": None,
        },
        {
            "sessionUpdate": "agent_message",
            "messageId": AGENT_MESSAGE_ID,
            "content": [_text("config.yaml looks good.")],
            "_meta": {"acme.dev/model": "demo-1"},
        },
        {
            # Chunk `_meta` is scoped to the chunk: not a patch (RFD: "chunks ... keep their
            # current meaning").
            "sessionUpdate": "agent_message_chunk",
            "messageId": AGENT_MESSAGE_ID,
            "content": _text(" All 3 tests passed."),
            "_meta": {"acme.dev/chunk": 1},
        },
    ]


def _notification(update: JsonObject) -> JsonObject:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": SESSION_ID, "update": update},
    }


def _result(request_id: JsonValue, result: JsonObject) -> JsonObject:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


class DemoAgent:
    """The agent's state machine: one message in, the messages to write out (pure)."""

    def __init__(self, *, ask_permission: bool = False) -> None:
        self.cwd: str | None = None
        self.ask_permission = ask_permission
        self.after_permission: list[JsonObject] = []  # the script's rest, once answered

    def handle(self, message: JsonValue) -> list[JsonObject]:
        """Answer one decoded JSON-RPC message; notifications and responses get no answer."""
        if not isinstance(message, dict):
            return []
        method = message.get("method")
        if method is None and message.get("id") == PERMISSION_REQUEST_ID:
            rest, self.after_permission = self.after_permission, []
            return rest  # the client answered the permission request: the turn goes on
        if "id" not in message or not isinstance(method, str):
            return []  # a notification (session/cancel, ...) or a response: nothing to say
        request_id = message["id"]
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if method == "initialize":
            # v2 shape: role-agnostic `info` and `capabilities` (acp-digest §2.3). This agent
            # speaks only v2, so it answers 2 whatever the client asked (initialization.mdx).
            return [
                _result(
                    request_id,
                    {
                        "protocolVersion": PROTOCOL_VERSION,
                        "info": {
                            "name": "acp-proxy-demo-agent",
                            "title": "acp-proxy demo agent",
                            "version": __version__,
                        },
                        "capabilities": {"session": {}},
                    },
                )
            ]
        if method == "session/new":
            cwd = params.get("cwd")
            self.cwd = cwd if isinstance(cwd, str) else "/"
            return [_result(request_id, {"sessionId": SESSION_ID})]
        if method == "session/list":
            sessions: list[JsonValue] = []
            if self.cwd is not None:
                sessions.append({"sessionId": SESSION_ID, "cwd": self.cwd})
            return [_result(request_id, {"sessions": sessions})]
        if method == "session/close":
            return [_result(request_id, {})]
        if method == "session/prompt":
            return self._prompt(request_id, params)
        return [error_object(request_id, METHOD_NOT_FOUND, f"Method not found: {method}")]

    def _prompt(self, request_id: JsonValue, params: JsonObject) -> list[JsonObject]:
        if params.get("sessionId") != SESSION_ID or self.cwd is None:
            return [error_object(request_id, RESOURCE_NOT_FOUND, "Resource not found: session")]
        prompt = params.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            return [error_object(request_id, INVALID_PARAMS, "prompt must be a non-empty array")]
        out = [
            _notification({"sessionUpdate": "state_update", "state": "running"}),
            # The user message echo carries the id the prompt response names.
            _notification(
                {"sessionUpdate": "user_message", "messageId": USER_MESSAGE_ID, "content": prompt}
            ),
            _result(request_id, {"messageId": USER_MESSAGE_ID}),
        ]
        updates = [_notification(update) for update in scripted_updates(self.cwd)]
        updates.append(
            _notification(
                {"sessionUpdate": "state_update", "state": "idle", "stopReason": "end_turn"}
            )
        )
        if not self.ask_permission:
            return out + updates
        cut = 2  # after the plan and the tool call's creation
        self.after_permission = updates[cut:]
        return [*out, *updates[:cut], _permission_request()]


def _permission_request() -> JsonObject:
    return {
        "jsonrpc": "2.0",
        "id": PERMISSION_REQUEST_ID,
        "method": "session/request_permission",
        "params": {
            "sessionId": SESSION_ID,
            "title": "Read config.yaml?",
            "subject": {"type": "tool_call", "toolCall": {"toolCallId": TOOL_CALL_ID}},
            "options": [
                {"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
                {"optionId": "deny", "name": "Deny", "kind": "reject_once"},
            ],
        },
    }


def _replies(agent: DemoAgent, event: Line | Oversize) -> list[JsonObject]:
    """What the agent writes for one line read (one over the bound does not parse)."""
    parse_error = [error_object(None, PARSE_ERROR, "Parse error")]
    if isinstance(event, Oversize):
        return parse_error
    try:
        message = orjson.loads(event.raw)
    except orjson.JSONDecodeError:
        return parse_error
    return agent.handle(message)


def main(argv: list[str] | None = None) -> int:
    """Serve stdin/stdout until EOF. Malformed lines get a JSON-RPC parse error (id null).

    ``--pace-ms N`` waits N ms after each frame it writes. The demo uses it so the proxy is
    never under backpressure and shows each update on its own; without it, the burst of updates
    may be coalesced by the proxy under backpressure, which ends in the same client state.
    """
    parser = argparse.ArgumentParser(prog="python -m acp_proxy.demo.agent")
    parser.add_argument("--pace-ms", type=float, default=0.0, metavar="N")
    parser.add_argument("--ask-permission", action="store_true")
    args = parser.parse_args(argv)
    agent = DemoAgent(ask_permission=args.ask_permission)
    stdout = sys.stdout.buffer
    splitter = LineSplitter()  # a line over its bound is answered as one that does not parse

    def answer(events: list[Line | Oversize]) -> None:
        for event in events:
            replies = _replies(agent, event)
            for reply in replies:
                stdout.write(orjson.dumps(reply) + b"\n")
                stdout.flush()  # one write per frame: the proxy sees each as it is produced
                if args.pace_ms > 0 and len(replies) > 1:
                    time.sleep(args.pace_ms / 1000)

    # os.read returns as soon as something is in: it does not wait for a full buffer.
    for chunk in iter(lambda: os.read(0, 65536), b""):
        answer(splitter.feed(chunk))
    answer(splitter.end())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
