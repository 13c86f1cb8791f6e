"""The upsert registry: which messages carry a patch `_meta`, entity keys, and tables vs schema."""

from __future__ import annotations

from typing import Any

import pytest
from acp_schema import schema_defs, validate_v1_message, validate_v2_message
from patch_fixtures import (
    SID,
    V1_UPDATES,
    V2_CHUNKS,
    V2_OTHERS,
    V2_SNAPSHOTS,
    V2_UPSERTS,
    Msg,
    frozen,
    permission_v1,
    permission_v2,
    session_update,
)

from acp_proxy.meta.registry import (
    CHUNK_KINDS,
    EVENT_KINDS,
    REMOVAL_KINDS,
    SNAPSHOT_KINDS,
    UPSERT_KINDS,
    MetaRule,
    entity_key,
    find_upsert,
    session_update_kind,
)

V2_KEYS = {
    "tool_call_update": ("tool_call", SID, "call_001"),
    "terminal_update": ("terminal", SID, "term_001"),
    "user_message": ("user_message", SID, "msg_u"),
    "agent_message": ("agent_message", SID, "msg_a"),
    "agent_thought": ("agent_thought", SID, "msg_t"),
    "session_info_update": ("session_info", SID),
    "compaction_update": ("compaction", SID, "cmp_001"),
    "subagent_update": ("subagent", SID, "child"),
    "session_message": ("session_message", SID, "m_9"),
}


def _kinds_in_schema(version: int) -> set[str]:
    union = schema_defs(version)["SessionUpdate"]
    alternatives = union.get("anyOf") or union["oneOf"]
    return {
        alt["properties"]["sessionUpdate"]["const"]
        for alt in alternatives
        if "const" in alt["properties"]["sessionUpdate"]
    }


def _update_def(version: int, kind: str) -> dict[str, Any]:
    union = schema_defs(version)["SessionUpdate"]
    for alt in union.get("anyOf") or union["oneOf"]:
        if alt["properties"]["sessionUpdate"].get("const") == kind:
            ref = alt["allOf"][0]["$ref"].split("/")[-1]
            definition: dict[str, Any] = schema_defs(version)[ref]
            return definition
    raise KeyError(kind)


@pytest.mark.parametrize("kind", sorted(V2_UPSERTS))
def test_v2_upserts_are_found(kind: str) -> None:
    message = session_update(V2_UPSERTS[kind])
    validate_v2_message(message)
    before = frozen(message)
    site = find_upsert(message, 2)
    assert site is not None
    assert site.kind == kind
    assert site.entity == V2_KEYS[kind]
    assert site.path == ("params", "update")
    assert site.obj is message["params"]["update"]
    assert site.meta_rule is MetaRule.PATCH
    assert site.method == "session/update"
    assert site.session_id == SID
    assert entity_key(message, 2) == V2_KEYS[kind]
    assert session_update_kind(message) == kind
    assert message == before


def test_v2_permission_tool_call_subject() -> None:
    tool_call = {"toolCallId": "call_001", "title": "Execute setup script", "status": "pending"}
    message = permission_v2(tool_call)
    validate_v2_message(message)
    site = find_upsert(message, 2)
    assert site is not None
    assert (site.kind, site.entity, site.path) == (
        "tool_call_update",
        ("tool_call", SID, "call_001"),
        ("params", "subject", "toolCall"),
    )
    assert site.obj is tool_call
    assert site.method == "session/request_permission"
    assert entity_key(message, 2) == ("tool_call", SID, "call_001")
    assert session_update_kind(message) is None


def test_v2_permission_other_subjects_are_not_patches() -> None:
    command = permission_v2({})
    command["params"]["subject"] = {"type": "command", "command": "ls", "cwd": "/w", "_meta": {}}
    validate_v2_message(command)
    no_subject = permission_v2({})
    del no_subject["params"]["subject"]
    validate_v2_message(no_subject)
    for message in (command, no_subject):
        assert find_upsert(message, 2) is None
    broken = permission_v2({})
    broken["params"]["subject"]["toolCall"] = "not an object"
    assert find_upsert(broken, 2) is None


def test_v1_sites() -> None:
    create = session_update(V1_UPDATES["tool_call"])
    update = session_update(V1_UPDATES["tool_call_update"])
    permission = permission_v1({"toolCallId": "call_001"})
    for message in (create, update, permission):
        validate_v1_message(message)
    site = find_upsert(create, 1)
    assert site is not None and site.meta_rule is MetaRule.CREATE
    site = find_upsert(update, 1)
    assert site is not None and site.meta_rule is MetaRule.REPLACE
    assert site.entity == ("tool_call", SID, "call_001")
    site = find_upsert(permission, 1)
    assert site is not None and site.path == ("params", "toolCall")
    assert site.kind == "tool_call_update"
    # v1's permission shape is not v2's, and vice versa
    assert find_upsert(permission, 2) is None
    assert find_upsert(permission_v2({"toolCallId": "c"}), 1) is None
    # v1 tool_call is no v2 kind
    assert find_upsert(create, 2) is None


@pytest.mark.parametrize(
    "update",
    [*V2_CHUNKS.values(), *V2_SNAPSHOTS.values(), *V2_OTHERS.values()],
    ids=lambda u: str(u["sessionUpdate"]),
)
def test_v2_non_patches(update: dict[str, Any]) -> None:
    message = session_update(update)
    validate_v2_message(message)
    assert find_upsert(message, 2) is None
    assert session_update_kind(message) == update["sessionUpdate"]


def test_notification_meta_is_never_the_site() -> None:
    message = session_update(V2_UPSERTS["tool_call_update"])
    message["params"]["_meta"] = {"traceparent": "00-abc"}
    validate_v2_message(message)
    site = find_upsert(message, 2)
    assert site is not None and site.path == ("params", "update")


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 1, "result": {}},
        {"jsonrpc": "2.0", "method": "session/update"},
        {"jsonrpc": "2.0", "method": "session/update", "params": []},
        {"jsonrpc": "2.0", "method": "session/update", "params": {"update": {}}},
        {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": 1, "update": {}}},
        {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": 1}},
        session_update({"sessionUpdate": 7}),
        session_update({"sessionUpdate": "tool_call_update"}),  # no toolCallId
        session_update({"sessionUpdate": "tool_call_update", "toolCallId": 3}),
        {"jsonrpc": "2.0", "id": 2, "method": "session/request_permission", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "session/request_permission", "params": "x"},
        {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": "s"}},
    ],
)
def test_malformed_or_other_messages_are_not_sites(message: dict[str, Any]) -> None:
    for version in (1, 2):
        assert find_upsert(message, version) is None
        assert entity_key(message, version) is None


@pytest.mark.parametrize("version", [None, 0, 3])
def test_unknown_versions_have_no_sites(version: int | None) -> None:
    message = session_update(V2_UPSERTS["tool_call_update"])
    assert find_upsert(message, version) is None
    assert entity_key(message, version) is None
    assert entity_key(session_update(V2_CHUNKS["agent_message_chunk"]), version) is None


def test_session_update_kind() -> None:
    assert session_update_kind({"method": "session/update", "params": 1}) is None
    assert session_update_kind({"method": "session/update", "params": {"update": []}}) is None
    assert session_update_kind(session_update({"sessionUpdate": None})) is None
    assert session_update_kind({"method": "session/cancel", "params": {}}) is None


def test_entity_keys_of_chunks_match_their_entity() -> None:
    pairs = {
        "user_message_chunk": "user_message",
        "agent_message_chunk": "agent_message",
        "agent_thought_chunk": "agent_thought",
        "tool_call_content_chunk": "tool_call_update",
        "terminal_output_chunk": "terminal_update",
        "compaction_summary_chunk": "compaction_update",
        "session_message_chunk": "session_message",
    }
    for chunk, upsert in pairs.items():
        assert entity_key(session_update(V2_CHUNKS[chunk]), 2) == V2_KEYS[upsert]
    # v2 requires the chunk key; v1 message chunks may omit it
    bare = session_update({"sessionUpdate": "agent_message_chunk", "content": {}})
    assert entity_key(bare, 2) is None
    assert entity_key(bare, 1) == ("agent_message", SID, None)
    wrong = session_update({"sessionUpdate": "agent_message_chunk", "messageId": 5})
    assert entity_key(wrong, 1) is None


def test_entity_keys_of_snapshots_removals_and_events() -> None:
    key = entity_key
    assert key(session_update(V2_SNAPSHOTS["plan_update"]), 2) == ("plan", SID, "plan_1")
    assert key(session_update(V2_SNAPSHOTS["state_update"]), 2) == ("state", SID)
    assert key(session_update(V2_SNAPSHOTS["usage_update"]), 2) == ("usage", SID)
    assert key(session_update(V2_OTHERS["plan_removed"]), 2) == ("plan", SID, "plan_1")
    assert key(session_update(V1_UPDATES["plan"]), 1) == ("session_plan", SID)
    assert key(session_update(V1_UPDATES["current_mode_update"]), 1) == ("current_mode", SID)
    assert key(session_update(V2_OTHERS["notice"]), 2) is None
    assert key(session_update(V2_OTHERS["_x.example/custom"]), 2) is None
    bad_plan = session_update({"sessionUpdate": "plan_update", "plan": {"type": "items"}})
    assert key(bad_plan, 2) is None
    assert key(session_update({"sessionUpdate": "plan_update", "plan": 3}), 2) is None
    assert key(session_update({"sessionUpdate": "plan_removed"}), 2) is None
    no_session: Msg = {
        "method": "session/update",
        "params": {"update": V2_CHUNKS["agent_message_chunk"]},
    }
    assert key(no_session, 2) is None


# --- tables against the official schema ---------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_every_schema_kind_is_classified_once(version: int) -> None:
    tables = [
        set(UPSERT_KINDS[version]),
        set(CHUNK_KINDS[version]),
        set(SNAPSHOT_KINDS[version]),
        set(REMOVAL_KINDS),
        set(EVENT_KINDS),
    ]
    listed = [kind for table in tables for kind in table]
    assert len(listed) == len(set(listed))
    assert set(listed) == _kinds_in_schema(version)


@pytest.mark.parametrize("version", [1, 2])
def test_upsert_tables_match_schema(version: int) -> None:
    for kind, spec in UPSERT_KINDS[version].items():
        definition = _update_def(version, kind)
        props = set(definition["properties"]) - {"_meta"}
        assert {*spec.fields, *([spec.key_field] if spec.key_field else [])} == props, kind
        assert set(spec.required) == set(definition.get("required", [])), kind
        for name in spec.collections:
            assert "array" in definition["properties"][name]["type"], (kind, name)
        if version == 2:
            # v2 upserts (and only they) carry the Metadata Patches `_meta` description
            assert "patches the stored metadata" in definition["properties"]["_meta"]["description"]


def test_v2_non_upserts_do_not_describe_a_patch() -> None:
    for kind in _kinds_in_schema(2) - set(UPSERT_KINDS[2]):
        meta = _update_def(2, kind).get("properties", {}).get("_meta", {})
        assert "patches the stored metadata" not in meta.get("description", ""), kind


def test_chunk_tables_match_schema() -> None:
    for version in (1, 2):
        for kind, chunk in CHUNK_KINDS[version].items():
            definition = _update_def(version, kind)
            assert chunk.key_field in definition["properties"]
            assert chunk.value_field in definition["properties"]
            assert (chunk.key_field in definition.get("required", [])) == chunk.key_required
