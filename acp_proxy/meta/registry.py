"""The upsert registry: which ACP messages carry an entity's `_meta`, per protocol version, as data.

Contract: this module owns the knowledge of message *shapes*: which `session/update` kinds are
upserts (and where their entity key and `_meta` live), which are chunks appended to an entity,
which are whole snapshots, and which fields each upsert kind has. It never interprets `_meta`
values (that is ``acp_proxy.meta.patch``) and never mutates a message. Pure: no I/O.

v2 (RFD "v2 Metadata Patches", "The rule applies to the top-level `_meta` of"): the top-level
`_meta` of ``tool_call_update`` (also the ``toolCall`` of a ``session/request_permission`` whose
``subject.type`` is ``tool_call``), ``terminal_update``, ``user_message``, ``agent_message``,
``agent_thought``, ``session_info_update``, ``compaction_update``, and the draft
``subagent_update`` and ``session_message`` is a *patch*. Nothing else is: chunks,
``plan_update``, ``params._meta``, content items and nested snapshot `_meta` "keep their current
meaning". Unknown kinds are not upserts and pass untouched.

v1 has no patch rule (RFD "Implementation details", item 4: "Leave v1 unchanged"). We model the
conservative v1 receiver the RFD's Compatibility section describes ("a v1 receiver may replace the
whole stored object and may store null values literally"): for a v1 upsert, a `_meta` object
replaces the entity's metadata whole, ``null`` clears it, omission leaves it unchanged
(``MetaRule.REPLACE``); v1 ``tool_call`` creates the entity with exactly its `_meta`
(``MetaRule.CREATE``). The v1 ``session/request_permission`` carries its ``ToolCallUpdate`` at
``params.toolCall``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeAlias, TypeVar

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.base.values import value

# An entity's identity on a connection: (entity type, params.sessionId, id...). ``None`` only for
# v1 message chunks without a ``messageId``.
EntityKey: TypeAlias = tuple[str | None, ...]

SESSION_UPDATE: Final = "session/update"
REQUEST_PERMISSION: Final = "session/request_permission"
SUPPORTED_VERSIONS: Final = (1, 2)


class MetaRule(enum.StrEnum):
    """How a receiver applies an upsert's top-level `_meta`."""

    PATCH = "patch"  # v2: the RFD's key-wise patch (acp_proxy.meta.patch.apply_meta_update)
    REPLACE = "replace"  # v1 model: object replaces whole, null clears, omitted unchanged
    CREATE = "create"  # v1 tool_call: (re)creates the entity; its `_meta` is the whole metadata


class V1Mode(enum.StrEnum):
    """How `_meta` annotations are applied on a v1 connection (v1 has no patch rule; see
    ``acp_proxy.meta.annotate``, which applies them and re-exports this name). It lives here so
    that ``Config`` can name its default without importing the annotation code (start-up)."""

    SAFE = "safe"  # annotate only where it cannot erase agent metadata; report the rest skipped
    STATEFUL = "stateful"  # keep merged metadata per entity (bounded LRU), send the whole object
    OFF = "off"  # never annotate v1 entities


@value
class UpsertKind:
    """One upsert kind: its entity, key, fields and schema requirements."""

    kind: str
    entity: str  # the entity type named in the entity key
    key_field: str | None  # field of the update naming the entity; None: keyed by params.sessionId
    # Every other field of the update (three-state in v2), excluding sessionUpdate/key/_meta.
    fields: tuple[str, ...]
    # Collection fields where `[]` and `null` both clear (ToolCallUpdate: "both `null` and `[]`
    # clear the collection"). Not subagent_update.additionalDirectories: its `[]` "reports no
    # additional directories" while `null` un-reports it.
    collections: frozenset[str]
    # Fields the schema requires (besides sessionUpdate), including the key field.
    required: tuple[str, ...]
    meta_rule: MetaRule


@value
class ChunkKind:
    """A chunk kind: appended, in order, to a field of an upserted entity."""

    kind: str
    entity: str  # the entity it belongs to (same entity key as the upsert of that entity)
    key_field: str
    value_field: str  # the chunk's field holding what is appended ("content" or "data")
    target: str  # the entity field it appends to ("content", "summary", "output")
    key_required: bool  # v1 message chunks may omit messageId


@value
class SnapshotKind:
    """A kind whose update replaces the previous one for its entity as a whole."""

    kind: str
    entity: str
    # Path inside the update to the entity id (plan_update: ("plan", "planId")); None: per session.
    key_path: tuple[str, ...] | None
    # Fields where omission keeps the previous value (v2 usage_update.cost: "Omitted leaves the
    # last reported cost unchanged"), so a later snapshot is not a complete replacement.
    sticky: tuple[str, ...] = ()


def _upsert(
    kind: str,
    entity: str,
    key_field: str | None,
    fields: tuple[str, ...],
    *,
    collections: tuple[str, ...] = (),
    required: tuple[str, ...] = (),
    meta_rule: MetaRule = MetaRule.PATCH,
) -> UpsertKind:
    return UpsertKind(kind, entity, key_field, fields, frozenset(collections), required, meta_rule)


_TOOL_FIELDS_V2 = (
    "name",
    "title",
    "kind",
    "status",
    "content",
    "locations",
    "rawInput",
    "rawOutput",
    "capabilities",
)
_TOOL_FIELDS_V1 = (
    "title",
    "name",
    "kind",
    "status",
    "content",
    "locations",
    "rawInput",
    "rawOutput",
)
_SUBAGENT_FIELDS = ("title", "description", "capabilities", "state", "cwd", "additionalDirectories")
_SESSION_MESSAGE_FIELDS = (
    "senderSessionId",
    "recipientSessionId",
    "senderMessageId",
    "recipientMessageId",
    "content",
)

_V2_UPSERTS = (
    _upsert(
        "tool_call_update",
        "tool_call",
        "toolCallId",
        _TOOL_FIELDS_V2,
        collections=("content", "locations"),
        required=("toolCallId",),
    ),
    _upsert(
        "terminal_update",
        "terminal",
        "terminalId",
        ("command", "cwd", "output", "exitStatus", "size", "capabilities"),
        required=("terminalId",),
    ),
    *(
        _upsert(k, k, "messageId", ("content",), collections=("content",), required=("messageId",))
        for k in ("user_message", "agent_message", "agent_thought")
    ),
    _upsert("session_info_update", "session_info", None, ("title", "updatedAt")),
    _upsert(
        "compaction_update",
        "compaction",
        "compactionId",
        ("status", "summary", "error"),
        collections=("summary",),
        required=("compactionId", "status"),
    ),
    _upsert("subagent_update", "subagent", "sessionId", _SUBAGENT_FIELDS, required=("sessionId",)),
    _upsert(
        "session_message",
        "session_message",
        "messageId",
        _SESSION_MESSAGE_FIELDS,
        collections=("content",),
        required=("messageId",),
    ),
)

_R = MetaRule.REPLACE
_V1_UPSERTS = (
    _upsert(
        "tool_call",
        "tool_call",
        "toolCallId",
        _TOOL_FIELDS_V1,
        collections=("content", "locations"),
        required=("toolCallId", "title"),
        meta_rule=MetaRule.CREATE,
    ),
    _upsert(
        "tool_call_update",
        "tool_call",
        "toolCallId",
        _TOOL_FIELDS_V1,
        collections=("content", "locations"),
        required=("toolCallId",),
        meta_rule=_R,
    ),
    _upsert("session_info_update", "session_info", None, ("title", "updatedAt"), meta_rule=_R),
    _upsert(
        "compaction_update",
        "compaction",
        "compactionId",
        ("status", "summary", "error"),
        collections=("summary",),
        required=("compactionId", "status"),
        meta_rule=_R,
    ),
    _upsert(
        "subagent_update",
        "subagent",
        "sessionId",
        _SUBAGENT_FIELDS,
        required=("sessionId",),
        meta_rule=_R,
    ),
    _upsert(
        "session_message",
        "session_message",
        "messageId",
        _SESSION_MESSAGE_FIELDS,
        collections=("content",),
        required=("messageId",),
        meta_rule=_R,
    ),
)


def _chunk(kind: str, entity: str, key: str, fields: tuple[str, str], req: bool) -> ChunkKind:
    return ChunkKind(kind, entity, key, fields[0], fields[1], req)


_MESSAGE_CHUNKS = ("user_message", "agent_message", "agent_thought")
_V2_CHUNKS = (
    *(_chunk(f"{m}_chunk", m, "messageId", ("content", "content"), True) for m in _MESSAGE_CHUNKS),
    _chunk("tool_call_content_chunk", "tool_call", "toolCallId", ("content", "content"), True),
    _chunk("terminal_output_chunk", "terminal", "terminalId", ("data", "output"), True),
    _chunk("compaction_summary_chunk", "compaction", "compactionId", ("content", "summary"), True),
    _chunk("session_message_chunk", "session_message", "messageId", ("content", "content"), True),
)
_V1_CHUNKS = (
    *(_chunk(f"{m}_chunk", m, "messageId", ("content", "content"), False) for m in _MESSAGE_CHUNKS),
    _chunk("compaction_summary_chunk", "compaction", "compactionId", ("content", "summary"), True),
    _chunk("session_message_chunk", "session_message", "messageId", ("content", "content"), True),
)

_V2_SNAPSHOTS = (
    SnapshotKind("plan_update", "plan", ("plan", "planId")),
    SnapshotKind("state_update", "state", None),
    SnapshotKind("usage_update", "usage", None, sticky=("cost",)),
    SnapshotKind("available_commands_update", "available_commands", None),
    SnapshotKind("config_option_update", "config_options", None),
)
_V1_SNAPSHOTS = (
    SnapshotKind("plan", "session_plan", None),
    SnapshotKind("plan_update", "plan", ("plan", "planId")),
    # v1 cost is "(optional)" with no rule for omission: kept sticky so no merge drops it.
    SnapshotKind("usage_update", "usage", None, sticky=("cost",)),
    SnapshotKind("available_commands_update", "available_commands", None),
    SnapshotKind("current_mode_update", "current_mode", None),
    SnapshotKind("config_option_update", "config_options", None),
)


_T = TypeVar("_T", UpsertKind, ChunkKind, SnapshotKind)


def _table(items: tuple[_T, ...]) -> Mapping[str, _T]:
    return MappingProxyType({item.kind: item for item in items})


# The tables, per protocol version (read-only).
UPSERT_KINDS: Final[Mapping[int, Mapping[str, UpsertKind]]] = MappingProxyType(
    {1: _table(_V1_UPSERTS), 2: _table(_V2_UPSERTS)}
)
CHUNK_KINDS: Final[Mapping[int, Mapping[str, ChunkKind]]] = MappingProxyType(
    {1: _table(_V1_CHUNKS), 2: _table(_V2_CHUNKS)}
)
SNAPSHOT_KINDS: Final[Mapping[int, Mapping[str, SnapshotKind]]] = MappingProxyType(
    {1: _table(_V1_SNAPSHOTS), 2: _table(_V2_SNAPSHOTS)}
)
# Kinds that delete an entity: kind -> (entity, key field). plan_removed is in both versions.
REMOVAL_KINDS: Final[Mapping[str, tuple[str, str]]] = MappingProxyType(
    {"plan_removed": ("plan", "planId")}
)
# Live events that are not session state ("Notices are live events rather than session history").
EVENT_KINDS: Final = frozenset({"notice"})


@value
class UpsertSite:
    """Where an upsert's patch `_meta` sits in a message, and which entity it belongs to."""

    kind: str  # sessionUpdate kind; "tool_call_update" for a permission request's toolCall
    entity: EntityKey  # e.g. ("tool_call", sessionId, toolCallId)
    path: tuple[str, ...]  # from the message to ``obj``: ("params", "update") or a permission path
    obj: JsonObject  # the object whose top-level `_meta` is the entity's metadata update
    version: int
    method: str  # "session/update" or "session/request_permission"
    session_id: str  # params.sessionId
    spec: UpsertKind

    @property
    def meta_rule(self) -> MetaRule:
        """How the receiver applies ``obj``'s `_meta` (patch in v2, replace/create in v1)."""
        return self.spec.meta_rule


def _params(message: JsonObject) -> tuple[JsonObject, str] | None:
    """``(params, sessionId)`` when ``message`` has object params with a string sessionId."""
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    session_id = params.get("sessionId")
    if not isinstance(session_id, str):
        return None
    return params, session_id


def session_update_kind(message: JsonObject) -> str | None:
    """The ``params.update.sessionUpdate`` of a `session/update` message, else ``None``."""
    if message.get("method") != SESSION_UPDATE:
        return None
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    update = params.get("update")
    if not isinstance(update, dict):
        return None
    kind = update.get("sessionUpdate")
    return kind if isinstance(kind, str) else None


def upsert_entity_key(spec: UpsertKind, session_id: str, obj: JsonObject) -> EntityKey | None:
    """The entity key of upsert ``obj`` of kind ``spec`` in session ``session_id``.

    ``None`` when the key field is missing or not a string (malformed: never treated as a patch).
    """
    if spec.key_field is None:
        return (spec.entity, session_id)
    key = obj.get(spec.key_field)
    if not isinstance(key, str):
        return None
    return (spec.entity, session_id, key)


def find_upsert(message: JsonObject, version: int | None) -> UpsertSite | None:
    """The upsert whose top-level `_meta` is an entity metadata update in ``message``, if any.

    Rule: v2 and v1 upsert kinds of `session/update` (``params.update``), and
    `session/request_permission`'s tool call (v2: ``params.subject.toolCall`` when
    ``subject.type == "tool_call"``; v1: ``params.toolCall``). Everything else, an unknown
    ``version`` (``None`` or not 1/2) and malformed shapes (missing ids) give ``None``.
    """
    if version is None or version not in SUPPORTED_VERSIONS:
        return None
    kinds = UPSERT_KINDS[version]
    method = message.get("method")
    if method == SESSION_UPDATE:
        found = _params(message)
        if found is None:
            return None
        params, session_id = found
        obj = params.get("update")
        path: tuple[str, ...] = ("params", "update")
        if not isinstance(obj, dict):
            return None
        kind = obj.get("sessionUpdate")
        if not isinstance(kind, str) or kind not in kinds:
            return None
        spec = kinds[kind]
    elif method == REQUEST_PERMISSION:
        found = _params(message)
        if found is None:
            return None
        params, session_id = found
        if version == 2:
            subject = params.get("subject")
            if not isinstance(subject, dict) or subject.get("type") != "tool_call":
                return None
            obj = subject.get("toolCall")
            path = ("params", "subject", "toolCall")
        else:
            obj = params.get("toolCall")
            path = ("params", "toolCall")
        if not isinstance(obj, dict):
            return None
        spec = kinds["tool_call_update"]
    else:
        return None
    entity = upsert_entity_key(spec, session_id, obj)
    if entity is None:
        return None
    return UpsertSite(spec.kind, entity, path, obj, version, method, session_id, spec)


def entity_key(message: JsonObject, version: int | None) -> EntityKey | None:
    """The entity any known `session/update` (upsert, chunk, snapshot, removal) is about.

    Chunks share the key of the entity they append to (``agent_message_chunk`` and
    ``agent_message`` with the same ``messageId`` give the same key); `session/request_permission`
    with a tool-call gives the tool call's key. ``None`` for everything else (unknown kinds,
    events such as ``notice``, other methods, unknown versions, malformed shapes).
    """
    site = find_upsert(message, version)
    if site is not None:
        return site.entity
    kind = session_update_kind(message)
    if kind is None or version is None or version not in SUPPORTED_VERSIONS:
        return None
    found = _params(message)
    if found is None:
        return None
    params, session_id = found
    update = params["update"]
    assert isinstance(update, dict)  # session_update_kind checked it
    chunk = CHUNK_KINDS[version].get(kind)
    if chunk is not None:
        key = update.get(chunk.key_field)
        if isinstance(key, str):
            return (chunk.entity, session_id, key)
        if key is None and not chunk.key_required:
            return (chunk.entity, session_id, None)
        return None
    snapshot = SNAPSHOT_KINDS[version].get(kind)
    if snapshot is not None:
        if snapshot.key_path is None:
            return (snapshot.entity, session_id)
        value: object = update
        for step in snapshot.key_path:
            value = value.get(step) if isinstance(value, dict) else None
        return (snapshot.entity, session_id, value) if isinstance(value, str) else None
    removal = REMOVAL_KINDS.get(kind)
    if removal is not None:
        entity, key_field = removal
        key = update.get(key_field)
        return (entity, session_id, key) if isinstance(key, str) else None
    return None
