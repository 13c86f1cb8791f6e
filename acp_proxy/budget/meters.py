"""What one connection's messages spend: turns, their tokens and seconds, tool calls, the runs
of identical tool calls, and the cumulative cost each session reports.

Contract: pure (no clock: the time is given). ``Meters`` reads decoded messages in the order
the proxy forwards them and returns ``Spend`` values (meter, session, amount); it never
decides anything about limits (``budget.middleware``). The rules (acp-digest §3, §8.3; the
v1/v2 schemas):

* A turn starts with a ``session/prompt`` the proxy forwards. It ends, in v1, with that
  prompt's response (an error response too); in v2 with the ``state_update`` that returns the
  session to ``idle`` (an error response to the prompt also ends it). A repeated idle snapshot
  with no turn open counts nothing (the v2 schema: it "MUST NOT be counted as ... additional
  usage").
* Tokens: ``usage.totalTokens`` of the v1 prompt result or of the v2 idle ``state_update``
  (unstable in both schemas); known when the turn ends.
* Tool calls: one per new ``toolCallId`` of a ``tool_call`` / ``tool_call_update``.
* Repeated tool calls: a tool call counts once it is known by its ``rawInput`` (the first
  update that carries one), or else when it ends; calls of one session whose kind, title and
  ``rawInput`` are equal, one after the other, make a run; a different call starts a new one.
* Cost: ``usage_update.cost.amount`` is the session's cumulative cost; the ledger turns it into
  the increase since the last report (``Ledger.cost_delta``).

Bounded: at most ``MAX_OPEN`` turns, pending prompts and tool calls per connection (the oldest
forgotten first).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import orjson

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.base.values import value
from acp_proxy.budget.model import Meter

MAX_OPEN: Final = 10_000
_TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})


@value
class Spend:
    """``amount`` of ``meter`` spent by ``session`` (for ``REPEATED_TOOL_CALL``: the length of
    its current run)."""

    meter: Meter
    session: str
    amount: float


@value
class CostSeen:
    """A session's cumulative cost as reported (``None``: cleared with ``cost: null``)."""

    session: str
    amount: float | None


@dataclass(slots=True, eq=False)
class Turn:
    start: float
    request_id: JsonValue
    cancelled: bool = False  # session/cancel sent by the proxy for this turn


@dataclass(slots=True, eq=False)
class _Tool:
    kind: JsonValue = None
    title: JsonValue = None
    counted: bool = False


def _bounded_put(table: OrderedDict[object, object], key: object, item: object) -> None:
    table.pop(key, None)
    table[key] = item
    if len(table) > MAX_OPEN:
        table.popitem(last=False)


def _total_tokens(usage: JsonValue) -> int | None:
    if not isinstance(usage, dict):
        return None
    total = usage.get("totalTokens")
    return total if type(total) is int and total >= 0 else None


def signature(kind: JsonValue, title: JsonValue, raw_input: JsonValue) -> bytes:
    """What makes two tool calls the same call (key order does not matter)."""
    try:
        return orjson.dumps([kind, title, raw_input], option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return repr((kind, title, raw_input)).encode()


class Meters:
    """The spend of one connection's messages (see the module)."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.turns: dict[str, Turn] = {}  # sessionId -> its open turn
        self._prompts: OrderedDict[object, str] = OrderedDict()  # request id -> sessionId
        self._tools: OrderedDict[object, _Tool] = OrderedDict()  # (sessionId, toolCallId)
        self._runs: dict[str, tuple[bytes, int]] = {}  # sessionId -> (signature, run length)

    def prompt(self, session: str, request_id: JsonValue, now: float) -> list[Spend]:
        """A ``session/prompt`` forwarded: its turn starts (one ``turns``)."""
        if len(self.turns) >= MAX_OPEN and session not in self.turns:
            del self.turns[next(iter(self.turns))]
        self.turns[session] = Turn(now, request_id)
        if request_id is not None and type(request_id) in (str, int, float):
            _bounded_put(self._prompts, request_id, session)  # type: ignore[arg-type]
        return [Spend(Meter.TURNS, session, 1.0)]

    def response(self, message: JsonObject, now: float) -> list[Spend]:
        """A response from the agent: the end of a v1 turn (or of a refused v2 prompt)."""
        rid = message.get("id")
        if rid is None or type(rid) not in (str, int, float):
            return []
        session = self._prompts.pop(rid, None)
        if session is None:
            return []
        turn = self.turns.get(session)
        if turn is None or turn.request_id != rid:
            return []
        if self.version == 2 and "error" not in message:
            return []  # v2: the prompt was accepted; the turn ends when the session is idle
        result = message.get("result")
        usage = result.get("usage") if isinstance(result, dict) else None
        return self._end(session, turn, usage, now)

    def _end(self, session: str, turn: Turn, usage: JsonValue, now: float) -> list[Spend]:
        del self.turns[session]
        out = [Spend(Meter.TURN_SECONDS, session, max(now - turn.start, 0.0))]
        tokens = _total_tokens(usage)
        if tokens:
            out.append(Spend(Meter.TOKENS, session, float(tokens)))
        return out

    def update(self, session: str, update: JsonObject, now: float) -> list[Spend | CostSeen]:
        """One ``session/update`` of ``session``."""
        kind = update.get("sessionUpdate")
        if kind == "usage_update":
            if "cost" not in update:
                return []
            cost = update["cost"]
            if cost is None:
                return [CostSeen(session, None)]
            amount = cost.get("amount") if isinstance(cost, dict) else None
            if isinstance(amount, bool) or not isinstance(amount, (int, float)):
                return []
            if not math.isfinite(amount):
                return []
            return [CostSeen(session, float(amount))]
        if kind in ("tool_call", "tool_call_update"):
            return list(self._tool(session, update))
        if kind == "state_update" and update.get("state") == "idle":
            turn = self.turns.get(session)
            if turn is None:
                return []
            return list(self._end(session, turn, update.get("usage"), now))
        return []

    def _tool(self, session: str, update: JsonObject) -> list[Spend]:
        tid = update.get("toolCallId")
        if not isinstance(tid, str):
            return []
        out: list[Spend] = []
        slot = (session, tid)
        tool = self._tools.get(slot)
        if tool is None:
            tool = _Tool()
            _bounded_put(self._tools, slot, tool)  # type: ignore[arg-type]
            out.append(Spend(Meter.TOOL_CALLS, session, 1.0))
        if "kind" in update:
            tool.kind = update["kind"]
        if "title" in update:
            tool.title = update["title"]
        if tool.counted:
            return out
        has_input = update.get("rawInput") is not None
        if has_input or update.get("status") in _TERMINAL:
            tool.counted = True
            sig = signature(tool.kind, tool.title, update.get("rawInput"))
            last = self._runs.get(session)
            run = last[1] + 1 if last is not None and last[0] == sig else 1
            if session not in self._runs and len(self._runs) >= MAX_OPEN:
                del self._runs[next(iter(self._runs))]
            self._runs[session] = (sig, run)
            out.append(Spend(Meter.REPEATED_TOOL_CALL, session, float(run)))
        return out
