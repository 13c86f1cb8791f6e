"""A v1 agent on the official Python SDK (``agent-client-protocol``, the test extra), for the
telemetry tests: one scripted prompt turn with a thought, a tool call that asks the user's
permission, an agent message, and ``end_turn``; ``usage`` in the prompt result.

Not a test module: ``python tests/sdk_v1_agent.py`` speaks ACP v1 on stdin/stdout.
"""

from __future__ import annotations

import asyncio
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    start_tool_call,
    update_agent_message_text,
    update_agent_thought_text,
    update_tool_call,
)
from acp.schema import PermissionOption, ToolCallUpdate

SESSION_ID = "sess_v1_001"


class ScriptedAgent:
    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, **_: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=PROTOCOL_VERSION)

    async def new_session(self, cwd: str, **_: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id=SESSION_ID)

    async def prompt(self, session_id: str, prompt: list[Any], **_: Any) -> PromptResponse:
        send = self.conn.session_update
        await send(session_id, update_agent_thought_text("Reading the file first."))
        await send(session_id, start_tool_call("t1", "Read x", kind="read", status="pending"))
        await self.conn.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id="t1"),
            options=[
                PermissionOption(option_id="yes", name="Allow once", kind="allow_once"),
                PermissionOption(option_id="no", name="Reject", kind="reject_once"),
            ],
        )
        await send(session_id, update_tool_call("t1", status="completed"))
        await send(session_id, update_agent_message_text("Done."))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **_: Any) -> None:
        pass


if __name__ == "__main__":
    # The SDK's ``Agent`` protocol names every method; its router answers the ones a class does
    # not define with "method not found", which is all this script needs.
    asyncio.run(run_agent(ScriptedAgent()))  # type: ignore[arg-type]
