"""The reference client model: v2 and v1 receiver rules, message by message."""

from __future__ import annotations

import json
from typing import Any

import pytest
from acp_schema import validate_v1_message, validate_v2_message
from patch_fixtures import (
    SID,
    TEXT,
    TOOL_CONTENT,
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
    with_meta,
)
from proxy_harness import TESTS

from acp_proxy.base.jsontypes import OMITTED
from acp_proxy.meta.state import ClientModel

VECTORS = TESTS / "vectors" / "meta_patches.json"
TC_KEY = ("tool_call", SID, "call_001")
TCU: Msg = {"sessionUpdate": "tool_call_update", "toolCallId": "call_001"}


def _v2(*updates: Msg) -> ClientModel:
    model = ClientModel(2)
    for update in updates:
        message = session_update(update)
        validate_v2_message(message)
        model.apply(message)
    return model


def _entity(model: ClientModel, key: tuple[Any, ...]) -> dict[str, Any]:
    entity: dict[str, Any] = model.snapshot()["entities"][key]
    return entity


def test_unsupported_version() -> None:
    with pytest.raises(ValueError, match="unsupported protocol version"):
        ClientModel(3)


@pytest.mark.parametrize(
    "case",
    [c for c in json.loads(VECTORS.read_text(encoding="utf-8"))["cases"]],
    ids=lambda c: c["name"],
)
def test_vectors_through_a_real_entity(case: dict[str, Any]) -> None:
    """Every published vector, as agent_message updates (schema-valid where the vector is)."""
    model = ClientModel(2)
    base = {"sessionUpdate": "agent_message", "messageId": "m1"}
    model.apply(
        session_update(with_meta(base, OMITTED if case["stored"] is None else case["stored"]))
    )
    for incoming in case["incoming"]:
        message = session_update({**base, **incoming})
        if case["group"] != "sdk-leniency":
            validate_v2_message(message)
        model.apply(message)
    assert model.meta(("agent_message", SID, "m1")) == case["result"]


def test_v2_fields_are_three_state() -> None:
    model = _v2(
        {**TCU, "title": "A", "status": "pending", "content": [TOOL_CONTENT]},
        {**TCU, "title": None},
        {**TCU, "status": "completed"},
    )
    assert _entity(model, TC_KEY)["fields"] == {"status": "completed", "content": [TOOL_CONTENT]}
    clears: list[Any] = [[], None]
    for clear in clears:
        cleared = _v2({**TCU, "content": [TOOL_CONTENT]}, {**TCU, "content": clear})
        assert _entity(cleared, TC_KEY)["fields"] == {}
    # unknown fields are dropped, as the SDKs drop unknown keys
    dropped = ClientModel(2)
    dropped.apply(session_update({**TCU, "futureField": 1}))
    assert _entity(dropped, TC_KEY)["fields"] == {}


def test_v2_meta_is_a_patch() -> None:
    model = _v2(
        {**TCU, "_meta": {"a": 1, "b": 2}},
        {**TCU, "title": "x"},
        {**TCU, "_meta": {"a": None, "c": {"n": None}}},
    )
    assert model.meta(TC_KEY) == {"b": 2, "c": {"n": None}}
    assert model.meta(("tool_call", SID, "other")) is None


def test_chunks_append_and_upserts_replace() -> None:
    msg = ("agent_message", SID, "msg_a")
    model = _v2(
        V2_CHUNKS["agent_message_chunk"],
        V2_CHUNKS["agent_message_chunk"],
    )
    assert _entity(model, msg)["fields"] == {"content": [TEXT, TEXT]}
    model.apply(session_update({**V2_UPSERTS["agent_message"], "content": []}))
    model.apply(session_update(V2_CHUNKS["agent_message_chunk"]))
    assert _entity(model, msg)["fields"] == {"content": [TEXT]}
    summary = _v2(V2_UPSERTS["compaction_update"], V2_CHUNKS["compaction_summary_chunk"])
    assert _entity(summary, ("compaction", SID, "cmp_001"))["fields"] == {
        "status": "in_progress",
        "summary": [TEXT],
    }


def test_terminal_output_chunks_reset_by_output_snapshot() -> None:
    key = ("terminal", SID, "term_001")
    model = _v2(V2_CHUNKS["terminal_output_chunk"], V2_CHUNKS["terminal_output_chunk"])
    assert _entity(model, key)["appended"] == {"output": ["aGk=", "aGk="]}
    model.apply(
        session_update(
            {"sessionUpdate": "terminal_update", "terminalId": "term_001", "output": None}
        )
    )
    assert _entity(model, key)["appended"] == {}
    assert _entity(model, key)["fields"] == {}


def test_snapshots_replace_and_plan_removed() -> None:
    cost = {"amount": 2.0, "currency": "EUR"}
    model = _v2(
        V2_SNAPSHOTS["plan_update"],
        {"sessionUpdate": "usage_update", "used": 1, "size": 9, "cost": cost},
        {"sessionUpdate": "usage_update", "used": 2, "size": 9},
        V2_SNAPSHOTS["state_update"],
    )
    snapshots = model.snapshot()["snapshots"]
    assert snapshots[("usage", SID)] == {"used": 2, "size": 9, "cost": cost}
    assert snapshots[("state", SID)] == {"state": "idle"}
    assert ("plan", SID, "plan_1") in snapshots
    model.apply(session_update(V2_OTHERS["plan_removed"]))
    assert ("plan", SID, "plan_1") not in model.snapshot()["snapshots"]


def test_events_unknown_and_malformed_kinds_recorded_in_order() -> None:
    model = _v2(V2_OTHERS["notice"], V2_OTHERS["_x.example/custom"])
    broken = session_update({"sessionUpdate": "tool_call_update"})
    model.apply(broken)
    assert model.snapshot()["events"] == [
        {"sessionId": SID, "update": V2_OTHERS["notice"]},
        {"sessionId": SID, "update": V2_OTHERS["_x.example/custom"]},
        {"sessionId": SID, "update": {"sessionUpdate": "tool_call_update"}},
    ]


def test_other_messages_are_ignored() -> None:
    model = ClientModel(2)
    messages: list[Msg] = [
        {"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 2}},
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": SID}},
        permission_v2({"toolCallId": "c"})
        | {"params": {"sessionId": SID, "title": "t", "options": []}},
    ]
    for message in messages:
        model.apply(message)
    assert model.snapshot() == {"entities": {}, "snapshots": {}, "events": []}


def test_permission_tool_call_applies_like_an_update() -> None:
    model = _v2({**TCU, "_meta": {"a": 1}})
    request = permission_v2({"toolCallId": "call_001", "status": "pending", "_meta": {"b": 2}})
    validate_v2_message(request)
    model.apply(request)
    assert model.meta(TC_KEY) == {"a": 1, "b": 2}
    assert _entity(model, TC_KEY)["fields"] == {"status": "pending"}


def test_snapshot_and_meta_are_copies_and_inputs_untouched() -> None:
    update = {**TCU, "_meta": {"a": {"deep": [1]}}}
    before = frozen(update)
    model = _v2(update)
    snap = model.snapshot()
    snap["entities"][TC_KEY]["meta"]["a"]["deep"].append(2)
    meta = model.meta(TC_KEY)
    assert meta is not None
    meta["a"] = 0
    assert model.meta(TC_KEY) == {"a": {"deep": [1]}}
    assert update == before


# --- v1: the conservative receiver ----------------------------------------------------------


def _v1(*messages: Msg) -> ClientModel:
    model = ClientModel(1)
    for message in messages:
        validate_v1_message(message)
        model.apply(message)
    return model


def test_v1_meta_replaces_whole_and_keeps_literal_nulls() -> None:
    tc = V1_UPDATES["tool_call"]
    tcu = V1_UPDATES["tool_call_update"]
    model = _v1(
        session_update({**tc, "_meta": {"a": 1, "b": 2}}),
        session_update(tcu),  # omitted: unchanged
    )
    assert model.meta(TC_KEY) == {"a": 1, "b": 2}
    model.apply(session_update({**tcu, "_meta": {"c": None}}))
    assert model.meta(TC_KEY) == {"c": None}
    model.apply(session_update({**tcu, "_meta": "text"}))  # non-object: unchanged
    assert model.meta(TC_KEY) == {"c": None}
    model.apply(session_update({**tcu, "_meta": {}}))
    assert model.meta(TC_KEY) is None
    model.apply(session_update({**tcu, "_meta": {"d": 1}}))
    model.apply(session_update({**tcu, "_meta": None}))
    assert model.meta(TC_KEY) is None


def test_v1_tool_call_recreates_the_entity() -> None:
    tc = V1_UPDATES["tool_call"]
    model = _v1(
        session_update({**tc, "_meta": {"a": 1}}),
        session_update({**V1_UPDATES["tool_call_update"], "title": "changed"}),
        session_update(tc),
    )
    assert model.meta(TC_KEY) is None
    assert _entity(model, TC_KEY)["fields"] == {
        "title": "Reading configuration file",
        "kind": "read",
        "status": "pending",
    }


def test_v1_permission_and_chunks() -> None:
    model = _v1(
        permission_v1({"toolCallId": "call_001", "_meta": {"x": 1}}),
        session_update(V1_UPDATES["agent_message_chunk"]),
        session_update(V1_UPDATES["agent_message_chunk"]),
        session_update(V1_UPDATES["plan"]),
    )
    assert model.meta(TC_KEY) == {"x": 1}
    snap = model.snapshot()
    # Without a messageId, the chunks of one turn make one message (numbered per session).
    key = ("agent_message", SID, None, "#1")
    assert snap["entities"][key]["fields"] == {"content": [TEXT, TEXT]}
    assert snap["snapshots"][("session_plan", SID)] == {"entries": []}


def test_message_turns_bound_pending_prompts_and_need_a_session() -> None:
    from acp_proxy.meta import state as state_module

    turns = state_module.MessageTurns()
    key = ("agent_message", "s", None)
    assert turns.key(key) == ("agent_message", "s", None, "#1")
    # A prompt whose params name no session is no turn boundary.
    turns.see("client_to_agent", {"jsonrpc": "2.0", "id": 1, "method": "session/prompt"})
    turns.see("agent_to_client", {"jsonrpc": "2.0", "id": 1, "result": {}})
    turns.see("client_to_agent", {"jsonrpc": "2.0", "id": 2, "method": "session/new"})
    assert turns.key(key) == ("agent_message", "s", None, "#1")
    # Past MAX_PROMPTS_PENDING prompts awaiting their response, the oldest is forgotten: its
    # response is then no boundary; a remembered one's is.
    limit = state_module.MAX_PROMPTS_PENDING
    for rid in range(limit + 1):
        prompt: dict[str, Any] = {"sessionId": "s", "prompt": []}
        turns.see("client_to_agent", {"id": rid, "method": "session/prompt", "params": prompt})
    assert turns.key(key) == ("agent_message", "s", None, "#2")
    turns.see("agent_to_client", {"id": 0, "result": {}})  # forgotten
    assert turns.key(key) == ("agent_message", "s", None, "#2")
    turns.see("agent_to_client", {"id": limit, "result": {}})  # remembered
    assert turns.key(key) == ("agent_message", "s", None, "#3")
