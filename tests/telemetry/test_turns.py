"""Prompt turns per protocol version (``acp_proxy.telemetry.turns``), as synchronous tables: each
script is a list of (time, direction, message); every message is validated against the official
v1 or v2 schema first, so the tables are real ACP shapes."""

from __future__ import annotations

from typing import Any

import pytest
from acp_schema import validate_v1, validate_v2

from acp_proxy.telemetry import labels as L
from acp_proxy.telemetry.turn_metrics import TurnStats
from acp_proxy.telemetry.turns import (
    A2C,
    C2A,
    MAX_OPEN,
    Cancelled,
    CostReported,
    FirstOutput,
    PermissionAnswered,
    ToolEnded,
    ToolStarted,
    TurnEnded,
    TurnEvent,
    TurnStarted,
    TurnTracker,
)

S = "sess_1"
Step = tuple[float, str, dict[str, Any]]


def prompt(rid: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "session/prompt",
        "params": {"sessionId": S, "prompt": [{"type": "text", "text": "hi"}]},
    }


def result(rid: Any, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": value}


def update(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": S, "update": body},
    }


def cancel() -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": S}}


OPTIONS = [
    {"optionId": "yes", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
]


def validate(version: int, message: dict[str, Any], answers: str | None = None) -> None:
    check = validate_v1 if version == 1 else validate_v2
    method = message.get("method")
    if method == "session/prompt":
        check("PromptRequest", message["params"])
    elif method == "session/update":
        check(
            "SessionNotification" if version == 1 else "UpdateSessionNotification",
            message["params"],
        )
    elif method == "session/request_permission":
        check("RequestPermissionRequest", message["params"])
    elif method == "session/cancel":
        check(
            "CancelNotification" if version == 1 else "CancelSessionNotification", message["params"]
        )
    elif answers == "session/prompt" and "result" in message:
        check("PromptResponse", message["result"])
    elif answers == "session/request_permission" and "result" in message:
        check("RequestPermissionResponse", message["result"])
    elif "error" not in message:
        raise AssertionError(f"no schema for {message}")


def run(version: int, steps: list[Step], end: float | None = None) -> list[TurnEvent]:
    tracker = TurnTracker()
    tracker.version = version
    asked: dict[Any, str] = {}
    events: list[TurnEvent] = []
    for now, direction, message in steps:
        if "method" in message and "id" in message:
            asked[message["id"]] = message["method"]
        validate(
            version, message, asked.get(message.get("id")) if "method" not in message else None
        )
        events.extend(tracker.feed(direction, message, now))
    if end is not None:
        events.extend(tracker.end(end))
    return events


def summary(events: list[TurnEvent]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for e in events:
        if isinstance(e, TurnStarted):
            out.append(("turn", e.turn.start))
        elif isinstance(e, TurnEnded):
            out.append(("turn_end", e.stop_reason, e.end - e.turn.start, e.turn.tokens))
        elif isinstance(e, FirstOutput):
            out.append(("first_output", e.kind, e.at - e.turn.start))
        elif isinstance(e, ToolStarted):
            out.append(("tool", e.tool.tool_call_id, e.tool.turn is not None))
        elif isinstance(e, ToolEnded):
            out.append(
                ("tool_end", e.tool.tool_call_id, e.tool.kind, e.status, e.end - e.tool.start)
            )
        elif isinstance(e, PermissionAnswered):
            out.append(
                ("permission", e.outcome, e.end - e.permission.start, e.permission.tool_call_id)
            )
        elif isinstance(e, Cancelled):
            out.append(("cancel", e.turn is not None))
        elif isinstance(e, CostReported):
            out.append(("cost", e.amount, e.currency))
    return out


V1_TURN: list[Step] = [
    (1.0, C2A, prompt(2)),
    (
        1.5,
        A2C,
        update({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hm"}}),
    ),
    (
        2.0,
        A2C,
        update({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "ok"}}),
    ),
    (
        3.0,
        A2C,
        update(
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "t1",
                "title": "Read",
                "kind": "read",
                "status": "pending",
            }
        ),
    ),
    (
        3.5,
        A2C,
        {
            "jsonrpc": "2.0",
            "id": "p1",
            "method": "session/request_permission",
            "params": {"sessionId": S, "toolCall": {"toolCallId": "t1"}, "options": OPTIONS},
        },
    ),
    (5.5, C2A, result("p1", {"outcome": {"outcome": "selected", "optionId": "yes"}})),
    (
        6.0,
        A2C,
        update({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"}),
    ),
    (
        6.5,
        A2C,
        update(
            {
                "sessionUpdate": "usage_update",
                "used": 10,
                "size": 100,
                "cost": {"amount": 0.5, "currency": "USD"},
            }
        ),
    ),
    (
        7.0,
        A2C,
        result(
            2,
            {
                "stopReason": "end_turn",
                "usage": {"totalTokens": 30, "inputTokens": 20, "outputTokens": 10},
            },
        ),
    ),
]

V2_TURN: list[Step] = [
    (1.0, C2A, prompt(2)),
    (1.1, A2C, update({"sessionUpdate": "state_update", "state": "running"})),
    (1.2, A2C, result(2, {"messageId": "m_user"})),  # v2: accepted, not ended
    (
        1.3,
        A2C,
        update({"sessionUpdate": "agent_message", "messageId": "m1", "_meta": {"x": 1}}),
    ),  # no content
    (
        2.0,
        A2C,
        update(
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "t1",
                "title": "Run",
                "kind": "execute",
                "status": "pending",
            }
        ),
    ),
    (
        2.5,
        A2C,
        {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "session/request_permission",
            "params": {
                "sessionId": S,
                "title": "Run it?",
                "subject": {"type": "tool_call", "toolCall": {"toolCallId": "t1"}},
                "options": OPTIONS,
            },
        },
    ),
    (4.0, C2A, result(7, {"outcome": {"outcome": "selected", "optionId": "no"}})),
    (
        4.5,
        A2C,
        update({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "failed"}),
    ),
    (
        5.0,
        A2C,
        update(
            {
                "sessionUpdate": "agent_message",
                "messageId": "m1",
                "content": [{"type": "text", "text": "done"}],
            }
        ),
    ),
    (
        6.0,
        A2C,
        update(
            {
                "sessionUpdate": "state_update",
                "state": "idle",
                "stopReason": "end_turn",
                "usage": {"totalTokens": 5, "inputTokens": 3, "outputTokens": 2},
            }
        ),
    ),
]


def test_v1_turn_ends_with_the_prompt_response() -> None:
    assert summary(run(1, V1_TURN)) == [
        ("turn", 1.0),
        ("first_output", "thought", 0.5),
        ("tool", "t1", True),
        ("permission", "allow_once", 2.0, "t1"),
        ("tool_end", "t1", "read", "completed", 3.0),
        ("cost", 0.5, "USD"),
        ("turn_end", "end_turn", 6.0, {"input": 20, "output": 10}),
    ]


def test_v2_turn_ends_with_the_idle_state_update_not_the_response() -> None:
    assert summary(run(2, V2_TURN)) == [
        ("turn", 1.0),
        ("tool", "t1", True),
        ("permission", "reject_once", 1.5, "t1"),
        ("tool_end", "t1", "execute", "failed", 2.5),
        ("first_output", "message", 4.0),
        ("turn_end", "end_turn", 5.0, {"input": 3, "output": 2}),
    ]


def test_v2_cancel_then_idle_cancelled() -> None:
    steps: list[Step] = [
        (0.0, C2A, prompt(1)),
        (0.1, A2C, update({"sessionUpdate": "state_update", "state": "running"})),
        (
            0.2,
            A2C,
            update(
                {"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "in_progress"}
            ),
        ),
        (1.0, C2A, cancel()),
        (
            1.2,
            A2C,
            update({"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "cancelled"}),
        ),
        (
            1.5,
            A2C,
            update({"sessionUpdate": "state_update", "state": "idle", "stopReason": "cancelled"}),
        ),
        (2.0, A2C, result(1, {"messageId": "m"})),  # a late acceptance changes nothing
    ]
    assert summary(run(2, steps)) == [
        ("turn", 0.0),
        ("tool", "t", True),
        ("cancel", True),
        ("tool_end", "t", None, "cancelled", 1.0),
        ("turn_end", "cancelled", 1.5, {}),
    ]


def test_session_end_closes_everything_open() -> None:
    steps: list[Step] = V2_TURN[:6]  # up to the permission request
    events = run(2, steps, end=9.0)
    assert summary(events)[-3:] == [
        ("permission", "no_answer", 6.5, "t1"),
        ("tool_end", "t1", "execute", "unfinished", 7.0),
        ("turn_end", "session_end", 8.0, {}),
    ]


def test_v2_rejected_prompt_that_started_no_work_ends_the_turn() -> None:
    steps: list[Step] = [
        (0.0, C2A, prompt(1)),
        (0.5, A2C, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}}),
    ]
    assert summary(run(2, steps)) == [("turn", 0.0), ("turn_end", "error", 0.5, {})]


def test_a_new_prompt_supersedes_an_open_turn_and_proxy_answers_end_waits() -> None:
    tracker = TurnTracker()
    tracker.version = 2
    events = tracker.feed(C2A, prompt(1), 0.0)
    events += tracker.feed(C2A, prompt(2), 1.0)
    events += tracker.answered_by_proxy(C2A, 2, 3.0)
    assert [(type(e).__name__, getattr(e, "stop_reason", None)) for e in events] == [
        ("TurnStarted", None),
        ("TurnEnded", "superseded"),
        ("TurnStarted", None),
        ("TurnEnded", "session_end"),
    ]


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        (result(5, {"outcome": {"outcome": "cancelled"}}), "cancelled"),
        (
            {"jsonrpc": "2.0", "id": 5, "error": {"code": -32800, "message": "cancelled"}},
            "cancelled",
        ),
        ({"jsonrpc": "2.0", "id": 5, "error": {"code": -32603, "message": "x"}}, "error"),
        (result(5, {"outcome": {"outcome": "selected", "optionId": "nope"}}), "other"),
        (result(5, {"outcome": {"outcome": "selected", "optionId": ["x"]}}), "other"),
        (result(5, {"outcome": "weird"}), "other"),
    ],
)
def test_permission_outcomes(answer: dict[str, Any], outcome: str) -> None:
    tracker = TurnTracker()
    ask = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "session/request_permission",
        "params": {"sessionId": S, "toolCall": {"toolCallId": "t"}, "options": OPTIONS},
    }
    tracker.feed(A2C, ask, 0.0)
    (event,) = tracker.feed(C2A, answer, 2.0)
    assert isinstance(event, PermissionAnswered) and event.outcome == outcome


def test_cost_is_reported_as_increases() -> None:
    tracker = TurnTracker()
    costs = [0.5, 0.5, 1.25, 0.25, "x", -1.0, float("inf")]
    events: list[TurnEvent] = []
    for amount in costs:
        u = update(
            {
                "sessionUpdate": "usage_update",
                "used": 1,
                "size": 2,
                "cost": {"amount": amount, "currency": "USD"},
            }
        )
        events += tracker.feed(A2C, u, 0.0)
    # 0.5, then +0.75; 0.25 is lower than 1.25: the agent restarted its count.
    assert [e.amount for e in events if isinstance(e, CostReported)] == [0.5, 0.75, 0.25]


def test_hostile_input_keeps_tables_and_labels_bounded() -> None:
    tracker = TurnTracker()
    stats = TurnStats()
    n = MAX_OPEN + 500
    events: list[TurnEvent] = []
    events += tracker.feed(C2A, prompt(1), 0.0)
    for i in range(n):
        tool = update(
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": f"t{i}",
                "kind": f"k{i}",
                "status": "pending",
            }
        )
        events += tracker.feed(A2C, tool, 0.0)
        done = update(
            {"sessionUpdate": "tool_call_update", "toolCallId": f"t{i}", "status": f"s{i}"}
        )
        events += tracker.feed(A2C, done, 0.0)
    for i in range(3000):
        idle = update({"sessionUpdate": "state_update", "state": "idle", "stopReason": f"r{i}"})
        events += tracker.feed(
            C2A, {**prompt(i + 2), "params": {"sessionId": S, "prompt": []}}, 0.0
        )
        events += tracker.feed(A2C, idle, 0.0)
        cost = {"amount": float(i), "currency": f"C{chr(65 + i % 26)}{i}"}
        events += tracker.feed(
            A2C, update({"sessionUpdate": "usage_update", "used": 0, "size": 0, "cost": cost}), 0.0
        )
    stats.record(events)
    stats.record(tracker.end(1.0))
    assert len(tracker.tools) <= MAX_OPEN
    assert set(stats.tools) == {("other", "unfinished")}
    assert set(stats.turns) <= {("other",), ("superseded",), ("session_end",)}
    assert len(stats.cost) <= L.MAX_CURRENCIES + 1
