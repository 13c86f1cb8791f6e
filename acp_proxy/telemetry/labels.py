"""The bounded label values of the proxy's metrics and span attributes.

Contract: owns every set a label value is drawn from, and the functions that map what a peer
sent onto those sets. A value outside its set is ``other``: whatever a peer sends (thousands of
methods, tool kinds, stop reasons, versions), a metric has a fixed, small number of series
(Prometheus: "do not use labels to store dimensions with high cardinality"). Pure.
"""

from __future__ import annotations

import signal
from typing import Final

from acp_proxy.wire.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    REQUEST_CANCELLED,
)

OTHER: Final = "other"

# Every method the ACP schemas name (v1 and v2, stable and unstable: the ``x-method`` values of
# tests/schemas; a test keeps this list equal to them). Anything else is counted as ``other``.
ACP_METHODS: Final = frozenset(
    {
        "$/cancel_request",
        "auth/login",
        "auth/logout",
        "auth/status",
        "auth/status_update",
        "authenticate",
        "elicitation/complete",
        "elicitation/create",
        "fs/read_text_file",
        "fs/write_text_file",
        "initialize",
        "logout",
        "mcp/message",
        "providers/disable",
        "providers/list",
        "providers/set",
        "proxy/initialize",
        "proxy/successor",
        "session/archive",
        "session/cancel",
        "session/close",
        "session/delete",
        "session/fork",
        "session/list",
        "session/load",
        "session/new",
        "session/prompt",
        "session/request_permission",
        "session/resume",
        "session/set_config_option",
        "session/set_mode",
        "session/set_title",
        "session/status",
        "session/unarchive",
        "session/update",
        "terminal/cancel",
        "terminal/create",
        "terminal/kill",
        "terminal/output",
        "terminal/release",
        "terminal/wait_for_exit",
        "tool_call/cancel",
    }
)

# JSON-RPC 2.0's codes (-32700, -32600..-32603), its implementation-defined server range
# (-32000..-32099, where ACP puts auth_required -32000 and resource_not_found -32002) and ACP's
# request_cancelled (-32800). Any other code is ``other``.
_KNOWN_CODES: Final = frozenset(
    {
        PARSE_ERROR,
        INVALID_REQUEST,
        METHOD_NOT_FOUND,
        INVALID_PARAMS,
        INTERNAL_ERROR,
        REQUEST_CANCELLED,
        *range(-32099, -31999),
    }
)

# The protocol versions ACP defines (``initialize``'s ``protocolVersion``).
PROTOCOL_VERSIONS: Final = frozenset({1, 2})

# ``StopReason`` (v1 prompt response; v2 idle ``state_update``): the same six values in both
# schemas. ``none``: the agent reported none; ``session_end``: the session ended first;
# ``superseded``: a new prompt for the session came before the turn's end.
STOP_REASONS: Final = frozenset(
    {"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled", "error"}
)
NO_STOP_REASON: Final = "none"
SESSION_END: Final = "session_end"
SUPERSEDED: Final = "superseded"

# ``ToolKind`` (same ten values in v1 and v2).
TOOL_KINDS: Final = frozenset(
    {"read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", OTHER}
)
# Terminal ``ToolCallStatus`` values: v1 has completed and failed, v2 adds cancelled.
# ``unfinished``: the turn or the session ended with the tool call still open.
TOOL_DONE: Final = frozenset({"completed", "failed", "cancelled"})
UNFINISHED: Final = "unfinished"

# A permission request's outcome: the ``PermissionOptionKind`` of the option the user selected,
# ``cancelled`` (the outcome ACP names), ``error`` (an error response) or ``no_answer`` (the
# session ended, or the proxy answered because the client went away).
OPTION_KINDS: Final = frozenset({"allow_once", "allow_always", "reject_once", "reject_always"})
CANCELLED: Final = "cancelled"
ERROR: Final = "error"
NO_ANSWER: Final = "no_answer"

# What counted as a turn's first agent output.
OUTPUT_MESSAGE: Final = "message"  # agent_message_chunk, agent_message with content
OUTPUT_THOUGHT: Final = "thought"  # agent_thought_chunk, agent_thought with content

# Token counts of ``Usage`` (v1 unstable prompt response; v2 unstable idle ``state_update``):
# the wire field and its label.
TOKEN_FIELDS: Final = (
    ("inputTokens", "input"),
    ("outputTokens", "output"),
    ("thoughtTokens", "thought"),
    ("cachedReadTokens", "cached_read"),
    ("cachedWriteTokens", "cached_write"),
)
MAX_CURRENCIES: Final = 16  # distinct ``cost.currency`` values kept per process, then ``other``
# A permission request the proxy's policy answered: no user waited (``permission_wait_seconds``).
POLICY: Final = "policy"
# Policy rule names with a label of their own (they come from the config file), then ``other``.
MAX_RULES: Final = 100
DEFAULT_RULE: Final = "default"  # no rule matched: the policy's default decided


def method_label(method: str | None) -> str:
    """The bounded label value of a method: itself when ACP defines it, else ``other``."""
    return method if method in ACP_METHODS else OTHER


def code_label(code: object) -> str:
    """The bounded label value of a JSON-RPC error code."""
    if type(code) is int and code in _KNOWN_CODES:
        return str(code)
    return OTHER


def version_label(version: object) -> str:
    """``1``, ``2``, or ``other`` for any version ACP does not define."""
    return str(version) if type(version) is int and version in PROTOCOL_VERSIONS else OTHER


def stop_reason_label(reason: object) -> str:
    if reason is None:
        return NO_STOP_REASON
    return reason if isinstance(reason, str) and reason in STOP_REASONS else OTHER


def tool_kind_label(kind: object) -> str:
    return kind if isinstance(kind, str) and kind in TOOL_KINDS else OTHER


def tool_status_label(status: object) -> str:
    if status == UNFINISHED:
        return UNFINISHED
    return status if isinstance(status, str) and status in TOOL_DONE else OTHER


def exit_status_label(returncode: int) -> str:
    """``exit_N`` for an exit code, ``signal_NAME`` for a signal (``Popen.returncode`` -N)."""
    if returncode >= 0:
        return f"exit_{min(returncode, 255)}"
    try:
        return f"signal_{signal.Signals(-returncode).name}"
    except ValueError:
        return "signal_other"


def not_parsed_label(reason: str) -> str:
    """``NotParsed.reason`` is free text (it quotes the parser); its bounded kind."""
    if "parse budget" in reason:
        return "parse_budget"
    if "batch" in reason:
        return "batch"
    return "invalid_json"


def currency_label(currency: object, seen: set[str]) -> str:
    """A cost's currency: itself if it looks like a unit (letters, at most 16) and is among the
    first ``MAX_CURRENCIES`` seen by this process (``seen`` grows), else ``other``."""
    if not isinstance(currency, str) or not (0 < len(currency) <= 16) or not currency.isalpha():
        return OTHER
    if currency in seen:
        return currency
    if len(seen) >= MAX_CURRENCIES or not currency.isascii():
        return OTHER
    seen.add(currency)
    return currency


def rule_label(rule: str | None, seen: set[str]) -> str:
    """A policy rule's label: its name among the first ``MAX_RULES`` distinct names seen by
    this process (``seen`` grows), ``default`` for the default, else ``other``."""
    if rule is None:
        return DEFAULT_RULE
    if rule in seen:
        return rule
    if len(seen) >= MAX_RULES:
        return OTHER
    seen.add(rule)
    return rule
