"""Shared data for the patch-core tests: real ACP examples and hypothesis strategies.

Every example below is valid against the official schema (tests check it). Strategy keys mix a
small fixed pool (so patches collide with stored keys often) with unicode text; values are
arbitrary JSON with nested nulls, arrays and empty objects.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from acp_proxy.base.jsontypes import OMITTED, JsonObject, JsonValue
from acp_proxy.meta.registry import UPSERT_KINDS

# Test data is typed loosely: tests index into nested messages freely.
Msg = dict[str, Any]

KEY_POOL = ("a", "b", "c", "zed.dev/progress", "proxy.dev/route", "ключ", "🔑", "")

keys: st.SearchStrategy[str] = st.one_of(st.sampled_from(KEY_POOL), st.text(max_size=4))

scalars: st.SearchStrategy[JsonValue] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)

json_values: st.SearchStrategy[JsonValue] = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(keys, children, max_size=3),
    ),
    max_leaves=8,
)

# A `_meta` object as sent: top-level values may be null (removals) or any JSON.
meta_objects: st.SearchStrategy[JsonObject] = st.dictionaries(keys, json_values, max_size=5)

# A `_meta` field: omitted, null, an object, or (rarely) a non-object the SDKs read as omitted.
meta_fields: st.SearchStrategy[Any] = st.one_of(
    st.just(OMITTED),
    st.none(),
    meta_objects,
    meta_objects,
    st.one_of(st.text(max_size=3), st.lists(scalars, max_size=2), st.integers()),
)

# Stored metadata: no metadata, or an object holding no null values.
stored_meta: st.SearchStrategy[JsonObject | None] = st.one_of(
    st.none(),
    st.dictionaries(keys, json_values.filter(lambda v: v is not None), min_size=1, max_size=5),
)


def frozen(value: Any) -> Any:
    """A deep copy used to check that a function did not mutate its input."""
    return copy.deepcopy(value)


def has_null_key(meta: JsonObject | None) -> bool:
    """True when stored metadata holds a key whose value is ``null``."""
    return meta is not None and any(v is None for v in meta.values())


# --- real ACP messages ------------------------------------------------------------------------

SID = "sess_abc123def456"
TEXT: Msg = {"type": "text", "text": "Can you analyze this code for potential issues?"}
TOOL_CONTENT: Msg = {"type": "content", "content": {"type": "text", "text": "Found 3"}}
OPTIONS: list[Any] = [
    {"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "deny", "name": "Deny", "kind": "reject_once"},
]

# One full v2 example per upsert kind (from the spec's examples where one exists).
V2_UPSERTS: dict[str, Msg] = {
    "tool_call_update": {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "call_001",
        "title": "Reading configuration file",
        "name": "read_file",
        "kind": "read",
        "status": "pending",
    },
    "terminal_update": {
        "sessionUpdate": "terminal_update",
        "terminalId": "term_001",
        "command": "cargo test",
        "cwd": "/workspace/project",
        "output": {"data": "cnVubmluZyAxMjMgdGVzdHMNCg=="},
        "exitStatus": {"exitCode": 0, "signal": None},
    },
    "user_message": {"sessionUpdate": "user_message", "messageId": "msg_u", "content": [TEXT]},
    "agent_message": {"sessionUpdate": "agent_message", "messageId": "msg_a", "content": [TEXT]},
    "agent_thought": {"sessionUpdate": "agent_thought", "messageId": "msg_t", "content": [TEXT]},
    "session_info_update": {
        "sessionUpdate": "session_info_update",
        "title": "Implement user authentication",
        "_meta": {"tags": ["feature", "auth"], "priority": "high"},
    },
    "compaction_update": {
        "sessionUpdate": "compaction_update",
        "compactionId": "cmp_001",
        "status": "in_progress",
    },
    "subagent_update": {"sessionUpdate": "subagent_update", "sessionId": "child"},
    "session_message": {
        "sessionUpdate": "session_message",
        "messageId": "m_9",
        "senderSessionId": "child",
        "recipientSessionId": SID,
        "content": [{"type": "text", "text": "done"}],
        "_meta": {"x.example/k": 1},
    },
}

V2_CHUNKS: dict[str, Msg] = {
    "user_message_chunk": {"messageId": "msg_u", "content": TEXT},
    "agent_message_chunk": {"messageId": "msg_a", "content": TEXT},
    "agent_thought_chunk": {"messageId": "msg_t", "content": TEXT},
    "tool_call_content_chunk": {"toolCallId": "call_001", "content": TOOL_CONTENT},
    "terminal_output_chunk": {"terminalId": "term_001", "data": "aGk="},
    "compaction_summary_chunk": {"compactionId": "cmp_001", "content": TEXT},
    "session_message_chunk": {"messageId": "m_9", "content": TEXT},
}
V2_CHUNKS = {k: {"sessionUpdate": k, **v} for k, v in V2_CHUNKS.items()}

V2_SNAPSHOTS: dict[str, Msg] = {
    "plan_update": {
        "sessionUpdate": "plan_update",
        "plan": {"type": "items", "planId": "plan_1", "entries": []},
    },
    "state_update": {"sessionUpdate": "state_update", "state": "idle"},
    "usage_update": {"sessionUpdate": "usage_update", "used": 10, "size": 100},
    "available_commands_update": {
        "sessionUpdate": "available_commands_update",
        "availableCommands": [],
    },
    "config_option_update": {"sessionUpdate": "config_option_update", "configOptions": []},
}

V2_OTHERS: dict[str, Msg] = {
    "plan_removed": {"sessionUpdate": "plan_removed", "planId": "plan_1"},
    "notice": {"sessionUpdate": "notice", "severity": "info", "title": "Heads up"},
    "_x.example/custom": {"sessionUpdate": "_x.example/custom", "anything": [1, None]},
}

V1_UPDATES: dict[str, Msg] = {
    "tool_call": {
        "sessionUpdate": "tool_call",
        "toolCallId": "call_001",
        "title": "Reading configuration file",
        "kind": "read",
        "status": "pending",
    },
    "tool_call_update": {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "call_001",
        "status": "in_progress",
        "content": [TOOL_CONTENT],
    },
    "session_info_update": V2_UPSERTS["session_info_update"],
    "compaction_update": V2_UPSERTS["compaction_update"],
    "subagent_update": V2_UPSERTS["subagent_update"],
    "session_message": V2_UPSERTS["session_message"],
    "agent_message_chunk": {"sessionUpdate": "agent_message_chunk", "content": TEXT},
    "user_message_chunk": {
        "sessionUpdate": "user_message_chunk",
        "messageId": "u1",
        "content": TEXT,
    },
    "compaction_summary_chunk": V2_CHUNKS["compaction_summary_chunk"],
    "session_message_chunk": V2_CHUNKS["session_message_chunk"],
    "plan": {"sessionUpdate": "plan", "entries": []},
    "plan_update": V2_SNAPSHOTS["plan_update"],
    "plan_removed": V2_OTHERS["plan_removed"],
    "available_commands_update": V2_SNAPSHOTS["available_commands_update"],
    "current_mode_update": {"sessionUpdate": "current_mode_update", "currentModeId": "ask"},
    "config_option_update": V2_SNAPSHOTS["config_option_update"],
    "usage_update": V2_SNAPSHOTS["usage_update"],
    "notice": V2_OTHERS["notice"],
}


def session_update(update: Msg, session_id: str = SID) -> Msg:
    """A `session/update` notification carrying ``update``."""
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": session_id, "update": update},
    }


def permission_v2(tool_call: Msg, session_id: str = SID, id_: int = 5) -> Msg:
    """A v2 `session/request_permission` request with a tool-call subject."""
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "method": "session/request_permission",
        "params": {
            "sessionId": session_id,
            "title": "Run this script?",
            "subject": {"type": "tool_call", "toolCall": tool_call},
            "options": OPTIONS,
        },
    }


def permission_v1(tool_call: Msg, session_id: str = SID, id_: int = 5) -> Msg:
    """A v1 `session/request_permission` request (the tool call at ``params.toolCall``)."""
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "method": "session/request_permission",
        "params": {"sessionId": session_id, "toolCall": tool_call, "options": OPTIONS},
    }


def with_meta(update: Msg, meta: Any) -> Msg:
    """``update`` with its top-level `_meta` set to ``meta`` (removed when ``OMITTED``)."""
    out = {k: v for k, v in update.items() if k != "_meta"}
    if meta is not OMITTED:
        out["_meta"] = meta
    return out


# --- schema-valid v2 upserts with three-state fields -------------------------------------

# Schema-valid values per field (a value, and for collections also `[]`).
POOLS: dict[str, list[Any]] = {
    "name": ["read_file", "edit_file"],
    "title": ["Reading", "Editing"],
    "kind": ["read", "edit"],
    "status": ["pending", "completed"],
    "content": [[TOOL_CONTENT], []],
    "locations": [[{"path": "/w/a.py", "line": 3}], []],
    "rawInput": [{"path": "/w"}, [1, None], "raw"],
    "rawOutput": [{"ok": True}, {"nested": {"x": None}}],
    "capabilities": [{"cancel": None}, {}],
    "command": ["ls", "cargo test"],
    "cwd": ["/w", "/x"],
    "output": [{"data": "aGk="}, {"data": ""}],
    "exitStatus": [{"exitCode": 0, "signal": None}, {"exitCode": 1}],
    "size": [{"cols": 80, "rows": 24}],
    "updatedAt": ["2026-10-13T10:00:00Z"],
    "summary": [[TEXT], []],
    "error": ["failed"],
    "description": ["helper"],
    "state": [{"state": "idle"}, {"state": "running"}],
    "additionalDirectories": [["/a"], []],
    "senderSessionId": ["child"],
    "recipientSessionId": [SID],
    "senderMessageId": ["m_1"],
    "recipientMessageId": ["m_2"],
}
MESSAGE_CONTENT = [[TEXT], []]
COMPACTION_STATUS = ["in_progress", "completed"]


def field_values(kind: str, field: str) -> st.SearchStrategy[Any]:
    if kind == "compaction_update" and field == "status":
        return st.sampled_from(COMPACTION_STATUS)  # required, not nullable
    message_kind = kind in ("user_message", "agent_message", "agent_thought", "session_message")
    pool = MESSAGE_CONTENT if message_kind and field == "content" else POOLS[field]
    return st.one_of(st.just(OMITTED), st.none(), st.sampled_from(pool))


@st.composite
def v2_updates(draw: st.DrawFn, kind: str, meta: bool = True) -> Msg:
    """A schema-valid v2 update of ``kind`` for the example entity, fields three-state."""
    spec = UPSERT_KINDS[2][kind]
    update: Msg = {"sessionUpdate": kind}
    if spec.key_field is not None:
        update[spec.key_field] = V2_UPSERTS[kind][spec.key_field]
    for field in spec.fields:
        value = draw(field_values(kind, field))
        if value is not OMITTED:
            update[field] = value
    if meta:
        value = draw(st.one_of(st.just(OMITTED), st.none(), meta_objects))
        if value is not OMITTED:
            update["_meta"] = value
    return update
