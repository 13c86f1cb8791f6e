"""Budgets as values: the validated ``budgets:`` section, one limit, what it measures and does.

Contract: frozen values and enums only; no parsing (``budget.parse``), no counting
(``budget.ledger``), no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import Field, field
from typing import Any, ClassVar

from acp_proxy.base.values import value


class Per(enum.StrEnum):
    """Whose spend a limit adds up."""

    SESSION = "session"  # each ACP session on its own (keyed by its sessionId)
    PROCESS = "process"  # every session of this proxy (all its connections) together
    LABEL = "label"  # every session of every proxy sharing the state file with the same label


class Meter(enum.StrEnum):
    """What a limit measures."""

    COST = "cost"  # usage_update.cost.amount (cumulative per session), in its currency
    TOKENS = "tokens"  # the turn's usage.totalTokens (v1 prompt result, v2 idle state_update)
    TURNS = "turns"  # prompts forwarded to the agent
    TOOL_CALLS = "tool_calls"  # tool calls started (a new toolCallId)
    TURN_SECONDS = "turn_seconds"  # seconds from a prompt to the end of its turn
    # The longest run of identical tool calls (kind, title and rawInput) back to back.
    REPEATED_TOOL_CALL = "repeated_tool_call"


class Action(enum.StrEnum):
    """What a limit does once crossed."""

    REFUSE_NEXT_PROMPT = "refuse_next_prompt"  # the running turn finishes; the next is refused
    CANCEL_TURN = "cancel_turn"  # session/cancel for the running turn, then refuse


@value
class Limit:
    """One named limit. ``window``: seconds after its first spend when its spend starts again
    from zero (``None``: never); ``label``: the key of a ``per: label`` limit."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    name: str
    meter: Meter
    max: float
    per: Per = Per.SESSION
    window: float | None = None
    window_text: str | None = None  # as written (P1D), for messages and ``budgets show``
    warn_at: tuple[float, ...] = ()  # fractions of max, ascending, each in (0, 1)
    action: Action = Action.REFUSE_NEXT_PROMPT
    label: str | None = None
    line: int | None = field(default=None, compare=False)


@value
class Budgets:
    """The validated ``budgets:`` section. ``state``: the state file (absolute)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    state: str
    limits: tuple[Limit, ...] = ()
