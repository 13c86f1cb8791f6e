"""Prompt turns of an ACP connection as they really are, per protocol version.

Contract: owns when a turn, a tool call and a permission wait start and end, and what they
report; turns the decoded messages of one connection (in the order the proxy reads them, with
the time the shell passes in) into ``TurnEvent`` values that metrics and tracing consume. Pure:
no clock, no I/O; every table it holds is bounded (``MAX_OPEN``).

The rules (acp-digest §3, §8.3; the v1/v2 schemas in tests/schemas):

* A turn starts with a ``session/prompt`` request the proxy forwards to the agent. It ends, in
  v1, with the prompt's response (``stopReason`` in its result; an error response ends it with
  ``error``); in v2 the response only acknowledges the user message (``PromptResponse``) and the
  turn ends with the ``state_update`` that returns the session to ``idle`` (its ``stopReason``).
  A v2 error response ends the turn only when no ``running``/``requires_action`` state was seen
  since the prompt (a rejected prompt that started no work). An idle ``state_update`` ends an
  open turn whatever the version. A new prompt for a session whose turn is open ends that turn
  (``superseded``); the end of the connection ends every open turn (``session_end``).
* First agent output: the first ``agent_message_chunk`` / ``agent_thought_chunk`` of the turn, or
  ``agent_message`` / ``agent_thought`` (v2 upserts) with non-empty ``content``; reported as
  ``message`` or ``thought``.
* A tool call starts at the first ``tool_call`` or ``tool_call_update`` for its ``toolCallId``
  (v1 creates with ``tool_call``; v2 upserts) and ends at a terminal status (``completed``,
  ``failed``; v2 also ``cancelled``), or ``unfinished`` when its turn or the session ends.
* A permission wait runs from ``session/request_permission`` to the client's answer; its outcome
  is the selected option's kind, ``cancelled``, ``error`` or ``no_answer``.
* ``session/cancel`` is reported as a cancellation of the session's open turn (if any).
* Tokens: ``usage`` of a v1 prompt result or of a v2 idle ``state_update`` (both unstable in the
  schemas). Cost: ``usage_update``'s cumulative ``cost``, reported as the increase since the
  session's last report.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

from acp_proxy.telemetry import labels as L
from acp_proxy.wire.errors import REQUEST_CANCELLED

MAX_OPEN: Final = 10_000  # open turns, tool calls and permission waits per connection (each)

C2A: Final = "client_to_agent"
A2C: Final = "agent_to_client"

# What a frame must name for this module to look at it (the shell's cheap pre-check).
UPDATE_KINDS: Final = frozenset(
    {
        "agent_message_chunk",
        "agent_thought_chunk",
        "agent_message",
        "agent_thought",
        "tool_call",
        "tool_call_update",
        "state_update",
        "usage_update",
    }
)
METHODS: Final = frozenset({"session/prompt", "session/request_permission", "session/cancel"})
_OUTPUT: Final = {
    "agent_message_chunk": L.OUTPUT_MESSAGE,
    "agent_message": L.OUTPUT_MESSAGE,
    "agent_thought_chunk": L.OUTPUT_THOUGHT,
    "agent_thought": L.OUTPUT_THOUGHT,
}


@dataclass(slots=True, eq=False)
class Turn:
    session_id: str
    request_id: Any
    start: float
    version: int | None
    accepted: float | None = None  # v2: the prompt response (the user message was inserted)
    working: bool = False  # v2: a running/requires_action state_update was seen
    first_output: float | None = None
    first_output_kind: str | None = None
    cancelled: bool = False
    tools: int = 0
    tokens: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class Tool:
    session_id: str
    tool_call_id: str
    start: float
    turn: Turn | None
    kind: str | None = None
    name: str | None = None  # v2 ``name`` (unstable): the tool's name
    title: str | None = None  # what the user sees (free text)
    status: str | None = None


@dataclass(slots=True, eq=False)
class Permission:
    session_id: str
    request_id: Any
    start: float
    turn: Turn | None
    tool_call_id: str | None
    options: dict[str, str]  # optionId -> kind


@dataclass(frozen=True, slots=True)
class TurnStarted:
    turn: Turn


@dataclass(frozen=True, slots=True)
class TurnEnded:
    turn: Turn
    end: float
    stop_reason: str  # a bounded label (``labels.stop_reason_label``)
    raw_stop_reason: object  # what the agent sent, for a span attribute


@dataclass(frozen=True, slots=True)
class FirstOutput:
    turn: Turn
    at: float
    kind: str  # OUTPUT_MESSAGE or OUTPUT_THOUGHT


@dataclass(frozen=True, slots=True)
class ToolStarted:
    tool: Tool


@dataclass(frozen=True, slots=True)
class ToolUpdated:
    tool: Tool


@dataclass(frozen=True, slots=True)
class ToolEnded:
    tool: Tool
    end: float
    status: str  # a bounded label (``labels.tool_status_label``)


@dataclass(frozen=True, slots=True)
class PermissionAnswered:
    permission: Permission
    end: float
    outcome: str  # a bounded label


@dataclass(frozen=True, slots=True)
class Cancelled:
    session_id: str
    at: float
    turn: Turn | None


@dataclass(frozen=True, slots=True)
class CostReported:
    session_id: str
    amount: float  # the increase since this session's previous report (>= 0)
    currency: object  # as sent; label it with ``labels.currency_label``


TurnEvent = (
    TurnStarted
    | TurnEnded
    | FirstOutput
    | ToolStarted
    | ToolUpdated
    | ToolEnded
    | PermissionAnswered
    | Cancelled
    | CostReported
)


def _hashable_id(value: object) -> bool:
    return value is not None and type(value) in (str, int, float)


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _tokens(usage: object) -> dict[str, int]:
    if not isinstance(usage, dict):
        return {}
    out: dict[str, int] = {}
    for wire, label in L.TOKEN_FIELDS:
        n = usage.get(wire)
        if type(n) is int and n >= 0:
            out[label] = n
    return out


class TurnTracker:
    """The turns of one connection (see the module). ``feed`` one decoded message at a time;
    ``end`` once when the connection ends. ``version`` is the negotiated protocol version."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.turns: dict[str, Turn] = {}  # sessionId -> its open turn
        self.prompts: dict[Any, Turn] = {}  # prompt request id -> its turn (until answered)
        self.tools: OrderedDict[tuple[str, str], Tool] = OrderedDict()
        self.permissions: OrderedDict[Any, Permission] = OrderedDict()
        self.costs: dict[str, float] = {}  # sessionId -> last cumulative cost
        self.evicted = 0  # entries dropped because a table was full (oldest first)

    # -- input ----------------------------------------------------------------------------------

    def feed(self, direction: str, message: dict[str, Any], now: float) -> list[TurnEvent]:
        """The events one message causes. ``direction``: ``C2A`` or ``A2C``."""
        out: list[TurnEvent] = []
        method = message.get("method")
        rid = message.get("id")
        if isinstance(method, str):
            params = message.get("params")
            if not isinstance(params, dict):
                return out
            session_id = _str(params.get("sessionId"))
            if session_id is None:
                return out
            if not _hashable_id(rid):
                if method == "session/update" and direction == A2C:
                    self._update(session_id, params.get("update"), now, out)
                elif method == "session/cancel" and direction == C2A:
                    turn = self.turns.get(session_id)
                    if turn is not None:
                        turn.cancelled = True
                    out.append(Cancelled(session_id, now, turn))
            elif method == "session/prompt" and direction == C2A:
                self._prompt(session_id, rid, now, out)
            elif method == "session/request_permission" and direction == A2C:
                self._permission(session_id, rid, params, now)
        elif _hashable_id(rid):
            if direction == A2C:
                turn = self.prompts.pop(rid, None)
                if turn is not None:
                    self._prompt_answered(turn, message, now, out)
            else:
                permission = self.permissions.pop(rid, None)
                if permission is not None:
                    outcome = _outcome(message, permission.options)
                    out.append(PermissionAnswered(permission, now, outcome))
        return out

    def answered_by_proxy(self, direction: str, rid: Any, now: float) -> list[TurnEvent]:
        """The proxy answered a request that went ``direction`` with an error of its own (its
        receiver went away): a permission wait ends with ``no_answer``, a turn with
        ``session_end``."""
        out: list[TurnEvent] = []
        if direction == A2C:
            permission = self.permissions.pop(rid, None)
            if permission is not None:
                out.append(PermissionAnswered(permission, now, L.NO_ANSWER))
        else:
            turn = self.prompts.get(rid)
            if turn is not None and self.turns.get(turn.session_id) is turn:
                self._end_turn(turn, now, L.SESSION_END, None, out)
        return out

    def answered_by_policy(self, session_id: str, rid: Any, now: float) -> list[TurnEvent]:
        """The proxy's policy answered the agent's permission request ``rid``: no user waited
        (outcome ``policy``, no time)."""
        turn = self.turns.get(session_id)
        return [PermissionAnswered(Permission(session_id, rid, now, turn, None, {}), now, L.POLICY)]

    def end(self, now: float) -> list[TurnEvent]:
        """The connection ended: every open wait, tool call and turn ends here."""
        out: list[TurnEvent] = []
        for permission in self.permissions.values():
            out.append(PermissionAnswered(permission, now, L.NO_ANSWER))
        self.permissions.clear()
        for turn in list(self.turns.values()):
            self._end_turn(turn, now, L.SESSION_END, None, out)
        for tool in self.tools.values():
            out.append(ToolEnded(tool, now, L.UNFINISHED))
        self.tools.clear()
        self.prompts.clear()
        return out

    # -- rules ----------------------------------------------------------------------------------

    def _prompt(self, session_id: str, rid: Any, now: float, out: list[TurnEvent]) -> None:
        old = self.turns.get(session_id)
        if old is not None:
            self._end_turn(old, now, L.SUPERSEDED, None, out)
        turn = Turn(session_id, rid, now, self.version)
        self.turns[session_id] = turn
        self.prompts[rid] = turn
        if len(self.turns) > MAX_OPEN:
            oldest = next(iter(self.turns.values()))
            self._end_turn(oldest, now, L.SUPERSEDED, None, out)
            self.evicted += 1
        if len(self.prompts) > MAX_OPEN:
            del self.prompts[next(iter(self.prompts))]
            self.evicted += 1
        out.append(TurnStarted(turn))

    def _prompt_answered(
        self, turn: Turn, message: dict[str, Any], now: float, out: list[TurnEvent]
    ) -> None:
        if self.turns.get(turn.session_id) is not turn:
            return  # already ended (an idle state_update came first, or superseded)
        error = message.get("error")
        if self.version == 2:
            turn.accepted = now
            if error is not None and not turn.working:
                self._end_turn(turn, now, L.ERROR, "error", out)
            return
        if error is not None:
            self._end_turn(turn, now, L.ERROR, "error", out)
            return
        result = message.get("result")
        result = result if isinstance(result, dict) else {}
        turn.tokens.update(_tokens(result.get("usage")))
        reason = result.get("stopReason")
        self._end_turn(turn, now, L.stop_reason_label(reason), reason, out)

    def _end_turn(
        self, turn: Turn, now: float, label: str, raw: object, out: list[TurnEvent]
    ) -> None:
        self.turns.pop(turn.session_id, None)
        self.prompts.pop(turn.request_id, None)
        for key in [k for k, tool in self.tools.items() if tool.turn is turn]:
            out.append(ToolEnded(self.tools.pop(key), now, L.UNFINISHED))
        out.append(TurnEnded(turn, now, label, raw))

    def _update(self, session_id: str, update: object, now: float, out: list[TurnEvent]) -> None:
        if not isinstance(update, dict):
            return
        kind = update.get("sessionUpdate")
        turn = self.turns.get(session_id)
        if kind in _OUTPUT:
            if turn is not None and turn.first_output is None and _has_content(kind, update):
                turn.first_output = now
                turn.first_output_kind = _OUTPUT[kind]
                out.append(FirstOutput(turn, now, _OUTPUT[kind]))
        elif kind in ("tool_call", "tool_call_update"):
            self._tool(session_id, update, turn, now, out)
        elif kind == "state_update":
            state = update.get("state")
            if state in ("running", "requires_action"):
                if turn is not None:
                    turn.working = True
            elif state == "idle" and turn is not None:
                turn.tokens.update(_tokens(update.get("usage")))
                reason = update.get("stopReason")
                self._end_turn(turn, now, L.stop_reason_label(reason), reason, out)
        elif kind == "usage_update":
            cost = update.get("cost")
            amount = cost.get("amount") if isinstance(cost, dict) else None
            if isinstance(cost, dict) and type(amount) in (int, float):
                self._cost(session_id, float(amount), cost.get("currency"), out)  # type: ignore[arg-type]

    def _cost(self, session_id: str, amount: float, currency: object, out: list[TurnEvent]) -> None:
        if not 0 <= amount < float("inf"):
            return
        last = self.costs.get(session_id, 0.0)
        # A lower cumulative cost than before: the agent restarted its count.
        delta = amount - last if amount >= last else amount
        if session_id in self.costs or len(self.costs) < MAX_OPEN:
            self.costs[session_id] = amount
        if delta > 0:
            out.append(CostReported(session_id, delta, currency))

    def _tool(
        self,
        session_id: str,
        update: dict[str, Any],
        turn: Turn | None,
        now: float,
        out: list[TurnEvent],
    ) -> None:
        tool_id = _str(update.get("toolCallId"))
        if tool_id is None:
            return
        key = (session_id, tool_id)
        tool = self.tools.get(key)
        if tool is None:
            tool = Tool(session_id, tool_id, now, turn)
            _merge(tool, update)
            self.tools[key] = tool
            if turn is not None:
                turn.tools += 1
            out.append(ToolStarted(tool))
            if len(self.tools) > MAX_OPEN:
                _, oldest = self.tools.popitem(last=False)
                out.append(ToolEnded(oldest, now, L.UNFINISHED))
                self.evicted += 1
        else:
            _merge(tool, update)
            out.append(ToolUpdated(tool))
        if tool.status in L.TOOL_DONE:
            del self.tools[key]
            out.append(ToolEnded(tool, now, L.tool_status_label(tool.status)))

    def _permission(self, session_id: str, rid: Any, params: dict[str, Any], now: float) -> None:
        options: dict[str, str] = {}
        raw_options = params.get("options")
        if isinstance(raw_options, list):
            for option in raw_options[:64]:
                if isinstance(option, dict):
                    oid, kind = option.get("optionId"), option.get("kind")
                    if isinstance(oid, str) and isinstance(kind, str):
                        options[oid] = kind
        # v1: params.toolCall; v2: params.subject.toolCall when subject.type is tool_call.
        call = params.get("toolCall")
        subject = params.get("subject")
        if isinstance(subject, dict) and subject.get("type") == "tool_call":
            call = subject.get("toolCall")
        tool_id = _str(call.get("toolCallId")) if isinstance(call, dict) else None
        self.permissions[rid] = Permission(
            session_id, rid, now, self.turns.get(session_id), tool_id, options
        )
        if len(self.permissions) > MAX_OPEN:
            self.permissions.popitem(last=False)
            self.evicted += 1


def _merge(tool: Tool, update: dict[str, Any]) -> None:
    for key in ("kind", "status", "name", "title"):
        value = update.get(key)
        if isinstance(value, str):
            setattr(tool, key, value)


def _has_content(kind: str, update: dict[str, Any]) -> bool:
    content = update.get("content")
    if kind.endswith("_chunk"):
        return isinstance(content, dict)
    return isinstance(content, list) and bool(content)


def _outcome(message: dict[str, Any], options: dict[str, str]) -> str:
    if "error" in message:
        code = message["error"].get("code") if isinstance(message["error"], dict) else None
        return L.CANCELLED if code == REQUEST_CANCELLED else L.ERROR
    result = message.get("result")
    outcome = result.get("outcome") if isinstance(result, dict) else None
    if not isinstance(outcome, dict):
        return L.OTHER
    if outcome.get("outcome") == "cancelled":
        return L.CANCELLED
    if outcome.get("outcome") == "selected":
        option = outcome.get("optionId")
        kind = options.get(option) if isinstance(option, str) else None
        return kind if kind in L.OPTION_KINDS else L.OTHER
    return L.OTHER
