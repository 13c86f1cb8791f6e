"""Budgets as a link of the chain: one connection's prompts checked, its spend recorded, its
turns cancelled, and the editor told.

Contract: ``BudgetMiddleware`` applies the limits of a process-wide ``Ledger`` to one
connection. Client to agent: a ``session/prompt`` is answered with a ``quotaExceeded``-shaped
JSON-RPC error (never sent to the agent) when a limit that applies to its session is crossed,
or when the ledger cannot be written (fail closed: the reason is in the error); otherwise its
turn is counted and written before it is forwarded. Agent to client: what the messages spend
(``budget.meters``) goes to the ledger, written at most every ``FLUSH_S`` and at each
crossing; a ``warn_at`` fraction or a limit crossed is told to the editor as a
``session/update`` that follows the message (``notice``, or a marked ``agent_message_chunk``,
see ``notice``); a crossed ``cancel_turn`` limit sends one ``session/cancel`` to the agent for
the session's running turn. It never closes a session or stops an agent. Each warning, limit
reached, refusal, cancellation and failed write goes to ``sink`` as a ``BudgetEvent`` (the
shell logs, counts and audits it). Pure: the clock, the state file's writing (``persist``) and
the sink are given.

The needles keep it off every other frame: frames that name none of its methods, update kinds
or a stop reason or an error are never parsed for it.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import Field
from typing import Any, ClassVar

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.base.values import value
from acp_proxy.budget.ledger import Crossing, Ledger, Status, key_of
from acp_proxy.budget.meters import CostSeen, Meters, Spend
from acp_proxy.budget.model import Action, Limit, Meter
from acp_proxy.wire.chain import FORWARD, Direction, MessageContext, Replace, Reply
from acp_proxy.wire.chain import Verdict as Action_
from acp_proxy.wire.errors import QUOTA_EXCEEDED, error_object

NAME = "budgets"
NOTICE_META = "acp-proxy/notice"
# Spend between prompts is written at most this often (and whenever a threshold is crossed):
# an atomic replace of the file costs milliseconds (a rename over a file flushes it on ext4),
# and each prompt writes what is pending before it is forwarded anyway.
FLUSH_S = 1.0
POOL_PREFIX = "acp-proxy/"
_A2C = Direction.AGENT_TO_CLIENT


@value
class BudgetEvent:
    """One thing the budgets did or saw, for the log, the metrics and the audit file.

    ``kind``: ``warning`` (a ``warn_at`` fraction reached), ``reached`` (a limit crossed),
    ``refused`` (a prompt answered with an error), ``cancelled`` (``session/cancel`` sent),
    ``unrecorded`` (the state file could not be written: ``reason``)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    kind: str
    session: str | None
    limit: str | None = None
    meter: str | None = None
    key: str | None = None
    spent: float | None = None
    max: float | None = None
    fraction: float | None = None
    reason: str | None = None


Sink = Callable[[BudgetEvent], None]
# Reads the state file and writes the ledger's changes (``durable``: fsynced, before a prompt
# is forwarded); the reason it could not, or None.
Persist = Callable[[bool], str | None]


def iso(seconds: float | None) -> str | None:
    """An epoch time as ISO 8601 (UTC, seconds)."""
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="seconds")


def amount_text(meter: Meter, amount: float) -> str:
    if meter is Meter.COST:
        return f"{amount:.2f}"
    if meter is Meter.TURN_SECONDS:
        return f"{amount:.0f} s"
    return f"{amount:g}"


def quota_error(rid: JsonValue, status: Status, now: float) -> JsonObject:
    """The error a refused prompt gets: shaped like the Quotas and Limits RFD's
    ``quotaExceeded`` (``data: {poolId, meterId, resetsAt, retryAfter}``)."""
    limit = status.limit
    spent = amount_text(limit.meter, status.spent)
    until = f"; it resets at {iso(status.resets_at)}" if status.resets_at is not None else ""
    retry = None if status.resets_at is None else max(0, round(status.resets_at - now))
    data: JsonObject = {
        "poolId": POOL_PREFIX + limit.name,
        "meterId": limit.meter.value,
        "resetsAt": iso(status.resets_at),
        "retryAfter": retry,
        "spent": status.spent,
        "max": status.max,
    }
    text = (
        f'acp-proxy budgets: prompt refused: the limit "{limit.name}" is reached '
        f"({limit.meter.value} {spent} of {amount_text(limit.meter, status.max)}){until}"
    )
    return error_object(rid, QUOTA_EXCEEDED, text, data=data)


def unrecorded_error(rid: JsonValue, reason: str) -> JsonObject:
    """The error a prompt gets while the budgets cannot be recorded (fail closed)."""
    text = f"acp-proxy budgets: prompt refused: the budget state cannot be recorded ({reason})"
    return error_object(
        rid, QUOTA_EXCEEDED, text, data={"poolId": POOL_PREFIX + "state", "reason": reason}
    )


def notice(
    session: str, severity: str, title: str, detail: JsonObject, *, as_notice: bool
) -> JsonObject:
    """A ``session/update`` the editor can show: the ``notice`` update (v2, and v1 clients that
    advertise ``session.notices``), else an ``agent_message_chunk`` whose ``_meta`` says it comes
    from acp-proxy (the Session Notices RFD's fallback: an agent message)."""
    meta: JsonObject = {NOTICE_META: {"severity": severity, **detail}}
    if as_notice:
        update: JsonObject = {
            "sessionUpdate": "notice",
            "severity": severity,
            "title": title,
            "_meta": meta,
        }
    else:
        update = {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": f"\n\n[acp-proxy] {title}\n\n"},
            "_meta": meta,
        }
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": session, "update": update},
    }


class BudgetMiddleware:
    """The budgets of one connection (a fresh instance per connection; the ledger is shared)."""

    needles: tuple[bytes, ...] = (
        b'"session/prompt"',
        b'"usage_update"',
        b'"tool_call',  # tool_call, tool_call_update
        b'"state_update"',
        b'"stopReason"',  # a v1 prompt's result
        b'"error"',  # a prompt's error response
    )

    def __init__(
        self,
        ledger: Ledger,
        clock: Callable[[], float],
        persist: Persist,
        sink: Sink | None = None,
    ) -> None:
        self.ledger = ledger
        self._clock = clock
        self._persist = persist
        self._sink = sink
        self.meters = Meters()
        self.client_notices = False  # v1: the client advertised ``session.notices``
        self.last_changed_by: tuple[str, ...] = ()
        self._broken: str | None = None  # the last write's failure, until one succeeds
        self._written_at = float("-inf")

    @property
    def name(self) -> str:
        return NAME

    def on_initialize_request(self, request: JsonObject) -> None:
        """The client's ``initialize`` request: whether it can show ``notice`` updates (v1)."""
        params = request.get("params")
        caps = params.get("clientCapabilities") if isinstance(params, dict) else None
        session = caps.get("session") if isinstance(caps, dict) else None
        self.client_notices = isinstance(session, dict) and isinstance(session.get("notices"), dict)

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Action_:
        self.meters.version = ctx.protocol_version
        method = message.get("method")
        if ctx.direction is _A2C:
            if method is None:
                if "id" in message:
                    return self._spent(self.meters.response(message, self._clock()), None, message)
                return FORWARD
            if method == "session/update":
                return self._update(message)
            return FORWARD
        if method == "session/prompt" and "id" in message:
            return self._prompt(message)
        return FORWARD

    # -- client to agent

    def _prompt(self, message: JsonObject) -> Action_:
        params = message.get("params")
        sid = params.get("sessionId") if isinstance(params, dict) else None
        if not isinstance(sid, str):
            return FORWARD  # the agent answers a prompt without a session
        rid = message["id"]
        now = self._clock()
        reason = self._write(sid, durable=True)
        if reason is not None:
            return self._refuse(unrecorded_error(rid, reason))
        for limit in self.ledger.limits:
            status = self.ledger.status(limit, key_of(limit, sid), now)
            if status.crossed:
                self._emit(
                    "refused",
                    sid,
                    limit=limit,
                    key=status.key,
                    spent=status.spent,
                    maximum=status.max,
                )
                return self._refuse(quota_error(rid, status, now))
        crossings = self._apply(self.meters.prompt(sid, rid, now), now)
        if self.ledger.dirty:
            reason = self._write(sid, durable=True)
            if reason is not None:
                del self.meters.turns[sid]
                return self._refuse(unrecorded_error(rid, reason))
        notices = self._notices(sid, crossings)
        if not notices:
            return FORWARD
        self.last_changed_by = ("notice",)
        return Replace((message,), replies=tuple(notices))

    def _refuse(self, error: JsonObject) -> Action_:
        self.last_changed_by = ("refused",)
        return Reply(error)

    # -- agent to client

    def _update(self, message: JsonObject) -> Action_:
        params = message.get("params")
        if not isinstance(params, dict):
            return FORWARD
        sid = params.get("sessionId")
        update = params.get("update")
        if not isinstance(sid, str) or not isinstance(update, dict):
            return FORWARD
        got = self.meters.update(sid, update, self._clock())
        return self._spent(got, sid, message)

    def _spent(
        self, got: list[Spend] | list[Spend | CostSeen], sid: str | None, message: JsonObject
    ) -> Action_:
        now = self._clock()
        spends: list[Spend] = []
        for item in got:
            if isinstance(item, CostSeen):
                if item.amount is None:
                    self.ledger.forget_cost(item.session)
                else:
                    delta = self.ledger.cost_delta(item.session, item.amount)
                    if delta > 0:
                        spends.append(Spend(Meter.COST, item.session, delta))
            else:
                spends.append(item)
        if sid is None and spends:
            sid = spends[0].session
        crossings = self._apply(spends, now)
        if self.ledger.dirty and (crossings or now - self._written_at >= FLUSH_S):
            self._write(sid, durable=False)
        notices = self._notices(sid, crossings) if sid is not None else []
        cancel = self._cancel(sid, now) if sid is not None else None
        if not notices and cancel is None:
            return FORWARD
        self.last_changed_by = ("notice",) if cancel is None else ("cancel_turn",)
        replies = (cancel,) if cancel is not None else ()
        return Replace((message, *notices), replies=replies)

    def _cancel(self, sid: str, now: float) -> JsonObject | None:
        """``session/cancel`` for the session's running turn when a ``cancel_turn`` limit is
        crossed (once per turn); ``turn_seconds`` counts the running turn's time so far."""
        turn = self.meters.turns.get(sid)
        if turn is None or turn.cancelled:
            return None
        for limit in self.ledger.limits:
            if limit.action is not Action.CANCEL_TURN:
                continue
            status = self.ledger.status(limit, key_of(limit, sid), now)
            spent = status.spent
            if limit.meter is Meter.TURN_SECONDS:
                spent += max(now - turn.start, 0.0)
            if status.crossed or spent > status.max:
                turn.cancelled = True
                self._emit(
                    "cancelled", sid, limit=limit, key=status.key, spent=spent, maximum=status.max
                )
                return {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}
        return None

    # -- the ledger

    def _apply(self, spends: list[Spend], now: float) -> list[Crossing]:
        crossings: list[Crossing] = []
        ledger = self.ledger
        for spend in spends:
            for limit in ledger.limits:
                if limit.meter is not spend.meter:
                    continue
                key = key_of(limit, spend.session)
                if spend.meter is Meter.REPEATED_TOOL_CALL:
                    crossings += ledger.record_run(limit, key, int(spend.amount), now)
                else:
                    crossings += ledger.add(limit, key, spend.amount, now)
        for c in crossings:
            self._emit(
                "warning" if c.fraction is not None else "reached",
                spends[0].session,
                limit=c.limit,
                key=c.key,
                spent=c.spent,
                maximum=c.max,
                fraction=c.fraction,
            )
        return crossings

    def _write(self, sid: str | None, *, durable: bool) -> str | None:
        self._written_at = self._clock()
        reason = self._persist(durable)
        if reason is not None and reason != self._broken:
            self._emit("unrecorded", sid, reason=reason)
        self._broken = reason
        return reason

    def _notices(self, sid: str, crossings: list[Crossing]) -> list[JsonObject]:
        """One notice per limit: the limit reached, else its highest ``warn_at`` fraction."""
        best: dict[str, Crossing] = {}
        for c in crossings:
            had = best.get(c.limit.name)
            if had is None or (
                had.fraction is not None and (c.fraction is None or c.fraction > had.fraction)
            ):
                best[c.limit.name] = c
        as_notice = self.meters.version == 2 or self.client_notices
        out = []
        for c in best.values():
            limit = c.limit
            spent = amount_text(limit.meter, c.spent)
            maximum = amount_text(limit.meter, c.max)
            if c.fraction is None:
                then = (
                    "the running turn is cancelled"
                    if limit.action is Action.CANCEL_TURN
                    else "the running turn finishes"
                )
                title = (
                    f'Budget "{limit.name}" reached ({limit.meter.value} {spent} of {maximum}): '
                    f"{then} and the next prompt will be refused"
                )
                severity = "error"
            else:
                title = (
                    f'Budget "{limit.name}" at {c.fraction:.0%} '
                    f"({limit.meter.value} {spent} of {maximum})"
                )
                severity = "warning"
            detail: JsonObject = {
                "limit": limit.name,
                "meter": limit.meter.value,
                "spent": c.spent,
                "max": c.max,
                "resetsAt": iso(c.resets_at),
            }
            out.append(notice(sid, severity, title, detail, as_notice=as_notice))
        return out

    def _emit(
        self,
        kind: str,
        sid: str | None,
        *,
        limit: Limit | None = None,
        key: str | None = None,
        spent: float | None = None,
        maximum: float | None = None,
        fraction: float | None = None,
        reason: str | None = None,
    ) -> None:
        if self._sink is None:
            return
        self._sink(
            BudgetEvent(
                kind,
                sid,
                limit.name if limit is not None else None,
                limit.meter.value if limit is not None else None,
                key,
                spent,
                maximum,
                fraction,
                reason,
            )
        )
