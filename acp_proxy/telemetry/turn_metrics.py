"""Turn-level Prometheus metrics: what a team watching its agents asks about.

Contract: owns the turn, first-output, tool-call, permission-wait, cancellation, token and cost
metric families, fed with the ``TurnEvent`` values of ``acp_proxy.telemetry.turns``. Every label
is drawn from a fixed set (``acp_proxy.telemetry.labels``), so the number of series is bounded
whatever the peers send. Pure; the same threading rule as ``metrics.Metrics`` (one event loop).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from acp_proxy.telemetry import labels as L
from acp_proxy.telemetry.families import (
    Histogram,
    bump,
    counter_family,
    histogram_family,
    observe,
)
from acp_proxy.telemetry.turns import (
    Cancelled,
    CostReported,
    FirstOutput,
    PermissionAnswered,
    ToolEnded,
    TurnEnded,
    TurnEvent,
)


class TurnStats:
    """The process-wide turn metrics (one per ``Metrics``)."""

    def __init__(self) -> None:
        self.turns: dict[tuple[str, ...], Histogram] = {}  # (stop_reason,)
        self.first_output: dict[tuple[str, ...], Histogram] = {}  # (output,)
        self.tools: dict[tuple[str, ...], Histogram] = {}  # (kind, status)
        self.permissions: dict[tuple[str, ...], Histogram] = {}  # (outcome,)
        self.cancellations = 0
        self.tokens: dict[tuple[str, ...], int] = {}  # (type,)
        self.cost: dict[tuple[str, ...], float] = {}  # (currency,)
        self.currencies: set[str] = set()

    def record(self, events: list[TurnEvent]) -> None:
        for event in events:
            kind = type(event)
            if kind is TurnEnded:
                assert isinstance(event, TurnEnded)
                turn = event.turn
                observe(self.turns, (event.stop_reason,), event.end - turn.start)
                for name, n in turn.tokens.items():
                    bump(self.tokens, (name,), n)
            elif kind is FirstOutput:
                assert isinstance(event, FirstOutput)
                observe(self.first_output, (event.kind,), event.at - event.turn.start)
            elif kind is ToolEnded:
                assert isinstance(event, ToolEnded)
                tool = event.tool
                key = (L.tool_kind_label(tool.kind), event.status)
                observe(self.tools, key, event.end - tool.start)
            elif kind is PermissionAnswered:
                assert isinstance(event, PermissionAnswered)
                observe(self.permissions, (event.outcome,), event.end - event.permission.start)
            elif kind is Cancelled:
                self.cancellations += 1
            elif kind is CostReported:
                assert isinstance(event, CostReported)
                bump(self.cost, (L.currency_label(event.currency, self.currencies),), event.amount)

    def collect(self) -> Iterator[Any]:
        yield histogram_family(
            "turn_duration_seconds",
            "Prompt turns, from session/prompt to the turn's end (v1: the prompt response; v2: "
            "the state_update back to idle), by stop reason (the agent's, or none, "
            "session_end, superseded, other).",
            ["stop_reason"],
            self.turns,
        )
        yield histogram_family(
            "turn_first_output_seconds",
            "Time from session/prompt to the turn's first agent output (output=message: "
            "agent_message_chunk or agent_message; thought: agent_thought_chunk or "
            "agent_thought).",
            ["output"],
            self.first_output,
        )
        yield histogram_family(
            "tool_call_duration_seconds",
            "Tool calls, from the first tool_call/tool_call_update to a terminal status, by "
            "kind and final status (completed, failed, cancelled, unfinished, other).",
            ["kind", "status"],
            self.tools,
        )
        yield histogram_family(
            "permission_wait_seconds",
            "Time the agent waited for the user's answer to session/request_permission, by "
            "outcome (the selected option's kind, cancelled, error, no_answer, other; policy: "
            "the proxy's policy answered, no user waited, counted at 0 s).",
            ["outcome"],
            self.permissions,
        )
        yield counter_family(
            "cancellations_total",
            "session/cancel notifications sent by the client.",
            [],
            {(): self.cancellations},
        )
        yield counter_family(
            "tokens_total",
            "Tokens the agent reported for its turns (usage of a v1 prompt result or of a v2 "
            "idle state_update), by type.",
            ["type"],
            self.tokens,
        )
        yield counter_family(
            "cost_total",
            "Cost the agent reported in usage_update (increases of the cumulative cost), by "
            "currency (the first 16 distinct ones, then other).",
            ["currency"],
            self.cost,
        )
