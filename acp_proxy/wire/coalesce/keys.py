"""What a waiting line is to the coalescer: its merge class and its entity, from one parse.

Contract: a pure function of a parsed message and the protocol version, ``classify``, that says
whether a ``session/update`` may ever merge (its ``Spec``: kind, class) and which entity it is
about (the key the queue's per-entity index uses). Everything it needs is looked up in tables
built once from ``acp_proxy.meta.registry`` (a handful of dict lookups a line), so a line that
cannot merge costs one parse and these lookups, nothing else. Never mutates the message.

Barriers (``classify`` gives ``None``): anything but a JSON-RPC 2.0 ``session/update``
notification with a string ``sessionId`` and an object ``update`` whose ``sessionUpdate`` is a
known chunk, upsert or snapshot kind of the version with its entity id present ("unknown kinds
are never merged"); removals and events (``plan_removed``, ``notice``); unknown versions.
Entities of different kinds that share an id (a tool call and its content chunks, a message and
its chunks, a terminal and its output chunks) are one entity, so per-entity order is kept across
them (digest section 3.3: clients apply updates "in the order they are received for each" id).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Final

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.base.values import value
from acp_proxy.meta.registry import (
    CHUNK_KINDS,
    SESSION_UPDATE,
    SNAPSHOT_KINDS,
    SUPPORTED_VERSIONS,
    UPSERT_KINDS,
    ChunkKind,
    MetaRule,
)

# The index key of an entity: (entity type, sessionId, id...). The version is not in it: the
# queue starts a new index whenever the version changes.
EntityKey = tuple[object, ...]


class Class(enum.Enum):
    """How a waiting entry may combine with a later one of the same entity and kind."""

    UPSERT = "upsert"  # updates.merge_updates (RFD: removals and clears kept)
    TEXT_CHUNK = "text_chunk"  # plain text blocks concatenate
    B64_CHUNK = "b64_chunk"  # terminal output bytes concatenate
    SNAPSHOT = "snapshot"  # the later replaces the earlier (updates.merge_updates decides)
    OPAQUE = "opaque"  # a run member with a known entity that never merges


@value
class Spec:
    """One mergeable kind of one version (one shared instance per kind: compared by identity)."""

    kind: str
    cls: Class
    version: int


# v1 message chunks may omit messageId, and a change of kind or messageId starts a new message,
# so every v1 message chunk of a session belongs to one stream entity: nothing reorders among them.
V1_STREAM: Final = "v1_message_stream"
V1_STREAM_KINDS: Final = frozenset(
    {"user_message_chunk", "agent_message_chunk", "agent_thought_chunk"}
)

# How to find the entity of an update of one kind: (update, sessionId) -> key or None.
_KeyOf = Callable[[JsonObject, str], EntityKey | None]


def _by_session(entity: str) -> _KeyOf:
    def key_of(update: JsonObject, session_id: str) -> EntityKey | None:
        return (entity, session_id)

    return key_of


def _by_field(entity: str, field: str, optional: bool) -> _KeyOf:
    def key_of(update: JsonObject, session_id: str) -> EntityKey | None:
        key = update.get(field)
        if type(key) is str or (key is None and optional):
            return (entity, session_id, key)
        return None

    return key_of


def _by_path(entity: str, path: tuple[str, ...]) -> _KeyOf:
    def key_of(update: JsonObject, session_id: str) -> EntityKey | None:
        found: object = update
        for step in path:
            found = found.get(step) if isinstance(found, dict) else None
        return (entity, session_id, found) if isinstance(found, str) else None

    return key_of


def _chunk_class(chunk: ChunkKind) -> Class:
    if chunk.value_field == "data":
        return Class.B64_CHUNK  # terminal_output_chunk: bytes appended to a byte stream
    if chunk.entity == "tool_call":
        # A tool_call_content_chunk appends one ToolCallContent *item*: two items are not one.
        return Class.OPAQUE
    return Class.TEXT_CHUNK  # one ContentBlock appended to a message / summary


def _table(version: int) -> dict[str, tuple[Spec, _KeyOf]]:
    """kind -> (spec, how to find its entity), the same answers as the registry's
    ``upsert_entity_key`` / ``entity_key`` (``test_coalesce_keys.py`` compares them)."""
    table: dict[str, tuple[Spec, _KeyOf]] = {}
    for kind, upsert in UPSERT_KINDS[version].items():
        # v1 tool_call (re)creates the entity: a run member that never merges.
        cls = Class.OPAQUE if upsert.meta_rule is MetaRule.CREATE else Class.UPSERT
        key_of = (
            _by_session(upsert.entity)
            if upsert.key_field is None
            else _by_field(upsert.entity, upsert.key_field, optional=False)
        )
        table[kind] = (Spec(kind, cls, version), key_of)
    for kind, chunk in CHUNK_KINDS[version].items():
        if version == 1 and kind in V1_STREAM_KINDS:
            key_of = _by_session(V1_STREAM)
        else:
            key_of = _by_field(chunk.entity, chunk.key_field, optional=not chunk.key_required)
        table.setdefault(kind, (Spec(kind, _chunk_class(chunk), version), key_of))
    for kind, snapshot in SNAPSHOT_KINDS[version].items():
        key_of = (
            _by_session(snapshot.entity)
            if snapshot.key_path is None
            else _by_path(snapshot.entity, snapshot.key_path)
        )
        table.setdefault(kind, (Spec(kind, Class.SNAPSHOT, version), key_of))
    return table


# The mergeable kinds of one version: kind -> (spec, how to find its entity).
Table = dict[str, tuple[Spec, _KeyOf]]
_TABLES: Final[dict[int | None, Table]] = {v: _table(v) for v in SUPPORTED_VERSIONS}


def table_of(version: int | None) -> Table | None:
    """The kinds a connection of ``version`` may merge; ``None``: nothing merges (the version
    is not known yet, or not supported)."""
    return _TABLES.get(version)


def classify(message: object, table: Table) -> tuple[Spec, EntityKey] | None:
    """The spec and entity of a mergeable ``session/update`` notification, else ``None``."""
    if type(message) is not dict:
        return None
    if message.get("method") != SESSION_UPDATE or "id" in message:
        return None
    if message.get("jsonrpc") != "2.0":
        return None
    params = message.get("params")
    if type(params) is not dict:
        return None
    session_id = params.get("sessionId")
    update = params.get("update")
    if type(session_id) is not str or type(update) is not dict:
        return None
    kind = update.get("sessionUpdate")
    found = table.get(kind) if type(kind) is str else None
    if found is None:
        return None
    spec, key_of = found
    key = key_of(update, session_id)
    return None if key is None else (spec, key)


def plain_envelope(message: JsonObject) -> bool:
    """Whether ``message`` (classified) is exactly ``jsonrpc``, ``method`` and ``params`` holding
    exactly ``sessionId`` and ``update``: then two such messages of one entity (hence one
    session) have equal envelopes without comparing anything (``params._meta`` absent on both;
    RFD: notification ``params._meta`` "is not a patch" and is never merged)."""
    params = message["params"]
    return len(message) == 3 and type(params) is dict and len(params) == 2
