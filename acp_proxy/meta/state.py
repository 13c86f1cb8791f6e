"""A reference model of what an ACP client stores from the messages it receives.

Contract: this module owns an executable statement of the receiver's state rules, used to *check*
the proxy (tests, the demo, coalescing properties: "sending X gives the client the same state as
sending Y"). It is never on the proxy's forwarding path. Pure: no I/O; never mutates a message.

v2 (schema field descriptions and the RFD): an upsert applies each known field three-state
(omitted keeps, ``null`` clears, a value replaces; ``[]`` clears a collection) and its top-level
`_meta` with ``patch.apply_meta_update``. Fields the schema does not define are dropped, as the
official SDKs drop unknown keys. Chunks append to their entity's ``content`` / ``summary`` (a
later concrete array replaces what chunks appended) or, for terminal output, to a chunk list that a
later ``output`` snapshot resets. Snapshot kinds replace the previous snapshot of their entity
(except sticky fields such as ``usage_update.cost``); ``plan_removed`` deletes a plan. Notices,
unknown kinds and malformed known kinds are recorded in receive order. A
`session/request_permission` with a tool-call subject applies its ``toolCall`` like a
``tool_call_update`` (migration guide: "Apply `tool_call` subjects like ordinary tool-call
updates").

v1 (our documented choice): the conservative receiver of the RFD's Compatibility section, "a v1
receiver may replace the whole stored object and may store null values literally". A `_meta`
object replaces the entity's metadata whole (``null`` values kept as data), ``_meta: null``
clears it, omission or a non-object leaves it unchanged; v1 ``tool_call`` (re)creates the entity
from its fields and `_meta` alone. v1 fields apply like v2's (a ``null`` clears): the v1 merge in
``acp_proxy.meta.updates`` never relies on this reading, so coalescing checks stay valid for
receivers that read ``null`` as "unchanged".

v1 chunks may omit ``messageId``: a client then appends them to the message being streamed, and
a new message starts with each turn (a `session/prompt` request, or its response, ends the
session's messages without an id). ``MessageTurns`` numbers those messages per session and kind,
``#1``, ``#2``, in order; the model keys them ``(kind, sessionId, None, "#1")``. It learns the
turns from ``MessageTurns.see``, called with the messages of both directions.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from acp_proxy.base.jsontypes import OMITTED, JsonObject, JsonValue
from acp_proxy.meta.patch import apply_meta_update
from acp_proxy.meta.registry import (
    CHUNK_KINDS,
    EVENT_KINDS,
    REMOVAL_KINDS,
    SNAPSHOT_KINDS,
    UPSERT_KINDS,
    EntityKey,
    MetaRule,
    UpsertKind,
    entity_key,
    find_upsert,
    session_update_kind,
)


@dataclass(slots=True)
class _Entity:
    fields: JsonObject = field(default_factory=dict)
    meta: JsonObject | None = None
    # Appended values for targets that are not a list field (terminal output chunks).
    appended: dict[str, list[JsonValue]] = field(default_factory=dict)
    # The lists of ``fields`` this model built from chunks (so the next chunk appends in
    # place: a copy per chunk made a long message cost time quadratic in its chunks).
    chunks: dict[str, list[JsonValue]] = field(default_factory=dict)


PROMPT = "session/prompt"
MAX_PROMPTS_PENDING = 1024  # prompt requests awaiting their response, oldest forgotten first


class MessageTurns:
    """Which message a chunk without a ``messageId`` (v1) continues: the one of its session and
    kind being streamed, until a turn ends it (a `session/prompt` request or its response)."""

    __slots__ = ("_ended", "_open", "_prompts")

    def __init__(self) -> None:
        self._ended: dict[str, int] = {}  # sessionId -> turn boundaries seen
        # (kind, sessionId) -> (boundaries when its message started, the message's number)
        self._open: dict[tuple[JsonValue, JsonValue], tuple[int, int]] = {}
        self._prompts: dict[tuple[str, JsonValue], str] = {}  # request id -> sessionId

    def see(self, direction: str, message: JsonObject) -> None:
        """Note one message of either direction (``client_to_agent`` or ``agent_to_client``):
        a prompt request toward the agent, or the response to one, is a turn boundary."""
        request_id = message.get("id")
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            return
        ident = (type(request_id).__name__, request_id)
        if direction == "client_to_agent" and message.get("method") == PROMPT:
            params = message.get("params")
            session = params.get("sessionId") if isinstance(params, dict) else None
            if isinstance(session, str):
                self._boundary(session)
                self._prompts[ident] = session
                if len(self._prompts) > MAX_PROMPTS_PENDING:
                    del self._prompts[next(iter(self._prompts))]
        elif direction == "agent_to_client" and "method" not in message:
            session = self._prompts.pop(ident, None)
            if session is not None:
                self._boundary(session)

    def _boundary(self, session: str) -> None:
        self._ended[session] = self._ended.get(session, 0) + 1

    def key(self, key: EntityKey) -> EntityKey:
        """``key`` itself, or for a chunk without an id ``(kind, sessionId, None, "#N")``:
        the message it continues, or a new one after a turn boundary. Asking again for the
        same chunk gives the same key."""
        if len(key) != 3 or key[2] is not None:
            return key
        session = key[1]
        ended = self._ended.get(session, 0) if isinstance(session, str) else 0
        started, number = self._open.get((key[0], session), (-1, 0))
        if started != ended:
            number += 1
            self._open[(key[0], session)] = (ended, number)
        return (key[0], session, None, f"#{number}")


def _plain_list(base: list[JsonValue], value: JsonValue) -> list[JsonValue]:
    return [*base, value]


class ClientModel:
    """The state an ACP client holds after receiving messages, for protocol ``version`` 1 or 2.
    ``turns``: where chunks without an id learn their message (shared with a caller that
    labels them too). ``chunk_list(base, value)`` makes the list chunks append to (``base``,
    then ``value``; the model then appends to it in place) and ``events`` is the list events
    are appended to: a caller that holds a long state compactly passes lists of its own."""

    __slots__ = ("_chunk_list", "_entities", "_events", "_snapshots", "turns", "version")

    def __init__(
        self,
        version: int,
        turns: MessageTurns | None = None,
        *,
        chunk_list: Callable[[list[JsonValue], JsonValue], list[JsonValue]] | None = None,
        events: list[JsonObject] | None = None,
    ) -> None:
        if version not in UPSERT_KINDS:
            raise ValueError(f"unsupported protocol version {version!r}; expected 1 or 2")
        self.version = version
        self.turns = turns if turns is not None else MessageTurns()
        self._entities: dict[EntityKey, _Entity] = {}
        self._snapshots: dict[EntityKey, JsonObject] = {}
        self._events: list[JsonObject] = events if events is not None else []
        self._chunk_list = chunk_list or _plain_list

    def apply(self, message: JsonObject) -> EntityKey | None:
        """Apply one received JSON-RPC message (see the module docstring for the rules); the
        key of the entity it stored, if any."""
        site = find_upsert(message, self.version)
        if site is not None:
            self._apply_upsert(site.spec, site.entity, site.obj)
            return site.entity
        kind = session_update_kind(message)
        if kind is None:
            return None  # not a session/update: requests, responses, other notifications
        params = message["params"]
        assert isinstance(params, dict)
        update = params["update"]
        assert isinstance(update, dict)
        key = entity_key(message, self.version)
        chunk = CHUNK_KINDS[self.version].get(kind)
        snapshot = SNAPSHOT_KINDS[self.version].get(kind)
        if key is None or kind in EVENT_KINDS:
            # Unknown kinds, notices and malformed known kinds: kept raw, in receive order.
            self._events.append({"sessionId": params.get("sessionId"), "update": update})
            return None
        if chunk is not None:
            key = self.turns.key(key)
            entity = self._entities.setdefault(key, _Entity())
            value = update.get(chunk.value_field)
            if chunk.target == "output":
                output = entity.appended.get("output")
                if output is None:
                    entity.appended["output"] = self._chunk_list([], value)
                else:
                    output.append(value)
            else:
                current = entity.fields.get(chunk.target)
                if current is not None and current is entity.chunks.get(chunk.target):
                    current.append(value)  # its own list: appended in place, never copied
                else:
                    base = current if isinstance(current, list) else []
                    new = self._chunk_list(base, value)
                    entity.fields[chunk.target] = entity.chunks[chunk.target] = new
        elif snapshot is not None:
            stored: JsonObject = {k: v for k, v in update.items() if k != "sessionUpdate"}
            previous: JsonObject = self._snapshots.get(key, {})
            for sticky in snapshot.sticky:
                if sticky not in update and sticky in previous:
                    stored[sticky] = previous[sticky]
            self._snapshots[key] = stored
        else:
            assert kind in REMOVAL_KINDS  # entity_key() knows no other kind
            self._snapshots.pop(key, None)
        return key

    def _apply_upsert(self, spec: UpsertKind, key: EntityKey, obj: JsonObject) -> None:
        if spec.meta_rule is MetaRule.CREATE:
            self._entities[key] = _Entity()
        entity = self._entities.setdefault(key, _Entity())
        for name in spec.fields:
            value = obj.get(name, OMITTED)
            if value is OMITTED:
                continue
            if value is None or (name in spec.collections and value == []):
                entity.fields.pop(name, None)
            else:
                entity.fields[name] = value
            if name == "output":
                entity.appended.pop("output", None)  # "authoritative replacement snapshot"
        raw_meta = obj.get("_meta", OMITTED)
        if spec.meta_rule is MetaRule.PATCH:
            entity.meta = apply_meta_update(entity.meta, raw_meta)
        elif raw_meta is None:
            entity.meta = None
        elif isinstance(raw_meta, dict):
            entity.meta = dict(raw_meta) or None  # replace whole, literal nulls kept (v1)

    def meta(self, key: EntityKey) -> JsonObject | None:
        """The stored metadata of entity ``key`` (``None``: no metadata or unknown entity)."""
        entity = self._entities.get(key)
        return None if entity is None else copy.deepcopy(entity.meta)

    def snapshot(self, *, copied: bool = True) -> dict[str, Any]:
        """The whole state as a plain, comparable value: deep-copied, or with ``copied=False``
        the model's own values (read only; for a reader that prints the state once, where a
        copy would double the memory of a long session)."""
        entities = {
            key: {"fields": e.fields, "meta": e.meta, "appended": e.appended}
            for key, e in self._entities.items()
        }
        state = {"entities": entities, "snapshots": self._snapshots, "events": self._events}
        return copy.deepcopy(state) if copied else state
