"""Pairing what the agent sent with what the client received, update by update.

Contract: owns matching the session updates of the direct run with those of the proxied run
(same entity, same order; what the proxy inserted or merged under backpressure) and the status
of each pair (unchanged, annotated, inserted...). Pure: it reads two ``SessionRecord``s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from acp_proxy.base.jsontypes import OMITTED, Field, JsonObject
from acp_proxy.demo.session import Frame, SessionRecord


def _update_of(frame: Frame) -> JsonObject | None:
    message = frame.message
    if not isinstance(message, dict) or message.get("method") != "session/update":
        return None
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    update = params.get("update")
    return update if isinstance(update, dict) else None


def entity_of(update: JsonObject, session_id: str) -> str:
    """A readable name for the entity an update is about (``tool call call_001``)."""
    kind = update.get("sessionUpdate")
    for key, label in (
        ("toolCallId", "tool call"),
        ("terminalId", "terminal"),
        ("messageId", "message"),
        ("compactionId", "compaction"),
    ):
        value = update.get(key)
        if isinstance(value, str):
            return f"{label} {value}"
    if kind == "plan_update":
        plan = update.get("plan")
        if isinstance(plan, dict) and isinstance(plan.get("planId"), str):
            return f"plan {plan['planId']}"
    if kind == "subagent_update" and isinstance(update.get("sessionId"), str):
        return f"session {update['sessionId']}"
    return f"session {session_id}"


def _without_meta(update: JsonObject) -> JsonObject:
    return {k: v for k, v in update.items() if k != "_meta"}


def is_follow_up(candidate: JsonObject, original: JsonObject) -> bool:
    """True when ``candidate`` only restates fields of ``original`` and carries a ``_meta``.

    That is the shape of the update a proxy inserts after a kept clear: a second update for the
    same entity carrying only the annotation, with the entity key and required fields.
    """
    if "_meta" not in candidate or candidate.get("sessionUpdate") != original.get("sessionUpdate"):
        return False
    return all(original.get(k, OMITTED) == v for k, v in _without_meta(candidate).items())


@dataclass(slots=True)
class Row:
    """What the client received, and the agent update(s) it stands for."""

    kind: str
    entity: str
    # The agent's updates this row stands for: one, several when the proxy coalesced them (under
    # backpressure), none for an update the agent never sent as such.
    sent: list[tuple[bytes, JsonObject]] = field(default_factory=list)
    received: tuple[bytes, JsonObject] | None = None
    # Updates the proxy inserted right after this one (its keys after a kept clear).
    inserted: list[JsonObject] = field(default_factory=list)

    @property
    def status(self) -> str:
        """unchanged | rewritten | merged | extra | missing."""
        if self.received is None:
            return "missing"
        if not self.sent:
            return "extra"
        if len(self.sent) > 1:
            return "merged"
        return "unchanged" if self.sent[0][0] == self.received[0] else "rewritten"


def pair_updates(direct: SessionRecord, proxied: SessionRecord) -> list[Row]:
    """Align the agent's updates (direct run) with the client's (proxied run).

    Rows follow the client's receive order. Per entity, a received update stands for the agent's
    next update(s) of that entity whose fields, applied in order, equal the received fields
    (``_meta`` aside): one update, unless the proxy coalesced several (see ``_absorbed``). After
    a received ``_meta: null``, an update that only restates fields of that update plus a
    ``_meta`` object is the follow-up the proxy inserted to carry its keys after the kept clear.
    """
    session_id = direct.session_id
    pending: dict[str, list[tuple[bytes, JsonObject]]] = {}
    for frame in direct.received:
        update = _update_of(frame)
        if update is not None:
            pending.setdefault(entity_of(update, session_id), []).append((frame.raw, update))
    got = [
        (frame.raw, update, entity_of(update, session_id))
        for frame in proxied.received
        if (update := _update_of(frame)) is not None
    ]
    rows: list[Row] = []
    last_row: dict[str, Row] = {}
    for index, (raw, update, entity) in enumerate(got):
        previous = last_row.get(entity)
        if (
            previous is not None
            and previous.sent
            and previous.received is not None
            and previous.received[1].get("_meta", OMITTED) is None
            and not previous.inserted
            and is_follow_up(update, previous.sent[-1][1])
            and not _may_stand_for(update, pending.get(entity, []))
        ):
            # Only a kept clear calls for a follow-up: no single `_meta` object can say "clear,
            # then set k" (acp-digest §7.3).
            previous.inserted.append(update)
            continue
        queue_ = pending.get(entity, [])
        following = next((u for _r, u, e in got[index + 1 :] if e == entity), None)
        taken = _absorbed(queue_, update, following)
        row = Row(str(update.get("sessionUpdate")), entity, queue_[:taken], (raw, update))
        del queue_[:taken]
        rows.append(row)
        last_row[entity] = row
    for entity, left in pending.items():
        rows.extend(Row(str(u.get("sessionUpdate")), entity, [(r, u)]) for r, u in left)
    return rows


def _may_stand_for(received: JsonObject, queue_: list[tuple[bytes, JsonObject]]) -> bool:
    """True when ``received`` may be the agent's next update of the entity, annotated.

    Same fields, and a ``_meta`` holding at least the keys the agent's ``_meta`` object names.
    """
    if not queue_ or _without_meta(queue_[0][1]) != _without_meta(received):
        return False
    sent_meta = queue_[0][1].get("_meta", OMITTED)
    got_meta = received.get("_meta", OMITTED)
    if not isinstance(sent_meta, dict):
        return sent_meta is got_meta or sent_meta == got_meta
    return isinstance(got_meta, dict) and all(k in got_meta for k in sent_meta)


def _field_matches(queue_: list[tuple[bytes, JsonObject]], received: JsonObject) -> list[int]:
    """Each ``n`` such that the first ``n`` updates' fields, applied in order, equal ``received``'s.

    v2 patch fields: a later value replaces an earlier one (``_meta`` aside).
    """
    target = _without_meta(received)
    fields: JsonObject = {}
    out: list[int] = []
    for count, (_raw, update) in enumerate(queue_, 1):
        if update.get("sessionUpdate") != received.get("sessionUpdate"):
            break
        fields.update(_without_meta(update))
        if fields == target:
            out.append(count)
    return out


def _absorbed(
    queue_: list[tuple[bytes, JsonObject]], received: JsonObject, following: JsonObject | None
) -> int:
    """How many of the entity's next agent updates ``received`` stands for (0: none).

    Several runs can match when updates carry only a ``_meta``; the run must end the way the
    received ``_meta`` does (a received clear ends with the agent's clear: the RFD keeps "clear,
    then object" as two updates), and it must leave the entity's next received update something
    to stand for. Among those, the longest.
    """
    counts = _field_matches(queue_, received)
    received_meta: Field = received.get("_meta", OMITTED)

    def last_meta(count: int) -> Field:
        metas = [u["_meta"] for _r, u in queue_[:count] if "_meta" in u]
        return metas[-1] if metas else OMITTED

    consistent = [n for n in counts if (last_meta(n) is None) == (received_meta is None)] or counts
    if following is not None:
        leaving = [n for n in consistent if _field_matches(queue_[n:], following)]
        if leaving:
            return leaving[-1]
    return consistent[-1] if consistent else 0
