"""The permission policy's Prometheus metrics: its decisions and the tool calls that ran unasked.

Contract: owns the ``policy_decisions_total`` and ``policy_unasked_tool_calls_total`` families,
fed with the policy's marks (``policy.middleware.AuditEntry``, one per decision, as the audit
file has them). Labels are bounded: a rule is named by the config file, so there are as many
as it has rules; past ``labels.MAX_RULES`` distinct names (a file of thousands of rules) the
others are ``other``. Pure; the same threading rule as ``metrics.Metrics`` (one event loop).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from acp_proxy.policy.middleware import UNASKED, AuditEntry
from acp_proxy.telemetry import labels as L
from acp_proxy.telemetry.families import bump, counter_family

# What became of a decided request (``outcome``).
ANSWERED: Final = "answered"  # a permission request the proxy answered (an option, cancelled)
REFUSED: Final = "refused"  # a JSON-RPC error to the sender (fs, terminal, a forbidden mode)
FORWARDED: Final = "forwarded"  # it went on to its receiver (ask, monitor, an allowed fs call)
PERMISSION: Final = "session/request_permission"


def outcome_of(entry: AuditEntry) -> str:
    if entry.forwarded:
        return FORWARDED
    return ANSWERED if entry.method == PERMISSION else REFUSED


class PolicyStats:
    """The process-wide policy metrics (one per ``Metrics``)."""

    def __init__(self) -> None:
        self.decisions: dict[tuple[str, ...], int] = {}  # (rule, decision, outcome)
        self.unasked: dict[tuple[str, ...], int] = {}  # (rule, action)
        self.rules: set[str] = set()  # the rule names given a label of their own

    def record(self, entry: AuditEntry) -> None:
        """One mark of the policy."""
        rule = L.rule_label(entry.rule, self.rules)
        if entry.method == UNASKED:
            bump(self.unasked, (rule, "cancelled" if entry.cancelled else "audited"))
        else:
            bump(self.decisions, (rule, entry.decision, outcome_of(entry)))

    def collect(self) -> Iterator[Any]:
        yield counter_family(
            "policy_decisions_total",
            "Requests the permission policy decided, by rule (default: no rule matched; "
            "forbid_modes: the mode guard; other: past the first 100 rule names), decision "
            "(allow, deny, ask) and outcome (answered: a permission request the proxy answered; "
            "refused: a JSON-RPC error; forwarded: it went on to its receiver).",
            ["rule", "decision", "outcome"],
            self.decisions,
        )
        yield counter_family(
            "policy_unasked_tool_calls_total",
            "Tool calls that ran without a permission request and that a deny rule matches, by "
            "rule and action (audited; cancelled: session/cancel was sent, on_unasked: cancel).",
            ["rule", "action"],
            self.unasked,
        )
