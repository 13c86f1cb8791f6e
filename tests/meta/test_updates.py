"""Combining two updates of one entity: table cases and the composition law over all fields."""

from __future__ import annotations

from typing import Any

import pytest
from acp_schema import validate_v1, validate_v2
from hypothesis import given, settings
from hypothesis import strategies as st
from patch_fixtures import (
    TEXT,
    TOOL_CONTENT,
    V2_SNAPSHOTS,
    V2_UPSERTS,
    Msg,
    frozen,
    meta_objects,
    session_update,
    v2_updates,
    with_meta,
)

from acp_proxy.base.jsontypes import OMITTED
from acp_proxy.meta.registry import UPSERT_KINDS
from acp_proxy.meta.state import ClientModel
from acp_proxy.meta.updates import merge_updates

SETTINGS = settings(max_examples=150, deadline=None)


def _model_after(version: int, *updates: Msg) -> dict[str, Any]:
    model = ClientModel(version)
    for update in updates:
        model.apply(session_update(update))
    return model.snapshot()


# --- table cases (v2) -----------------------------------------------------------------------

TCU: Msg = {"sessionUpdate": "tool_call_update", "toolCallId": "call_001"}


@pytest.mark.parametrize(
    ("u1", "u2", "expected"),
    [
        # fields: omitted keeps, null clears, value replaces; [] is a value too
        (
            {**TCU, "title": "A", "status": "pending"},
            {**TCU, "status": "completed", "content": []},
            ({**TCU, "title": "A", "status": "completed", "content": []},),
        ),
        ({**TCU, "title": "A"}, {**TCU, "title": None}, ({**TCU, "title": None},)),
        # _meta via compose: later wins, nulls kept as removals
        (
            {**TCU, "_meta": {"a": 1, "b": 2}},
            {**TCU, "_meta": {"b": None, "c": 3}},
            ({**TCU, "_meta": {"a": 1, "b": None, "c": 3}},),
        ),
        (
            {**TCU, "_meta": {"a": 1}},
            {**TCU, "title": "T"},
            ({**TCU, "_meta": {"a": 1}, "title": "T"},),
        ),
        ({**TCU, "_meta": {"a": 1}}, {**TCU, "_meta": None}, ({**TCU, "_meta": None},)),
        (
            {**TCU, "title": "T"},
            {**TCU, "status": "failed"},
            ({**TCU, "title": "T", "status": "failed"},),
        ),
        # clear then object: two updates, the second with only the key and the object
        (
            {**TCU, "title": "A", "_meta": None},
            {**TCU, "status": "completed", "_meta": {"a": None, "c": 3}},
            (
                {**TCU, "title": "A", "_meta": None, "status": "completed"},
                {**TCU, "_meta": {"c": 3}},
            ),
        ),
        # clear then an object removing only: one clear
        ({**TCU, "_meta": None}, {**TCU, "_meta": {"a": None}}, ({**TCU, "_meta": None},)),
    ],
)
def test_merge_v2_table(u1: Msg, u2: Msg, expected: tuple[Msg, ...]) -> None:
    for update in (u1, u2, *expected):
        validate_v2("SessionUpdate", update)
    before = frozen((u1, u2))
    assert merge_updates(u1, u2, 2) == expected
    assert (u1, u2) == before


def test_clear_then_object_carries_required_fields() -> None:
    u1 = {**V2_UPSERTS["compaction_update"], "summary": [TEXT], "_meta": None}
    u2 = {**V2_UPSERTS["compaction_update"], "status": "completed", "_meta": {"k": 1}}
    first, second = merge_updates(u1, u2, 2)
    assert first == {**u1, "status": "completed", "_meta": None}
    assert second == {
        "sessionUpdate": "compaction_update",
        "compactionId": "cmp_001",
        "status": "completed",
        "_meta": {"k": 1},
    }
    validate_v2("SessionUpdate", second)
    info = merge_updates(
        {"sessionUpdate": "session_info_update", "_meta": None},
        {"sessionUpdate": "session_info_update", "title": "T", "_meta": {"k": 1}},
        2,
    )
    assert info == (
        {"sessionUpdate": "session_info_update", "_meta": None, "title": "T"},
        {"sessionUpdate": "session_info_update", "_meta": {"k": 1}},
    )


def test_both_omitted_meta_stays_omitted() -> None:
    tcu: Msg = TCU
    assert merge_updates(tcu, tcu, 2) == (tcu,)
    assert "_meta" not in merge_updates(tcu, tcu, 2)[0]


@pytest.mark.parametrize(
    ("u1", "u2"),
    [
        (TCU, {"sessionUpdate": "terminal_update", "terminalId": "call_001"}),
        (TCU, {**TCU, "toolCallId": "call_002"}),
        ({**TCU, "x.example/unknown": 1}, TCU),
        (TCU, {**TCU, "futureField": True}),
        ({**TCU, "_meta": "text"}, TCU),
        (TCU, {**TCU, "_meta": [1]}),
        ({"sessionUpdate": "_custom"}, {"sessionUpdate": "_custom"}),
        ({"sessionUpdate": 3}, {"sessionUpdate": 3}),
        ({"sessionUpdate": "tool_call_update"}, {"sessionUpdate": "tool_call_update"}),
        (V2_SNAPSHOTS["plan_update"], {**V2_SNAPSHOTS["plan_update"], "plan": {"planId": "p2"}}),
        ({"sessionUpdate": "notice"}, {"sessionUpdate": "notice"}),
    ],
)
def test_merge_refuses(u1: Msg, u2: Msg) -> None:
    assert merge_updates(u1, u2, 2) == (u1, u2)


def test_merge_unknown_version() -> None:
    tcu: Msg = TCU
    assert merge_updates(tcu, tcu, 3) == (tcu, tcu)


def test_merge_snapshots() -> None:
    plan2: Msg = {
        **V2_SNAPSHOTS["plan_update"],
        "plan": {
            "type": "items",
            "planId": "plan_1",
            "entries": [{"content": "x", "priority": "high", "status": "pending"}],
        },
    }
    validate_v2("SessionUpdate", plan2)
    assert merge_updates(V2_SNAPSHOTS["plan_update"], plan2, 2) == (plan2,)
    idle: Msg = V2_SNAPSHOTS["state_update"]
    running: Msg = {"sessionUpdate": "state_update", "state": "running"}
    assert merge_updates(idle, running, 2) == (running,)
    cost = {"amount": 1.5, "currency": "USD"}
    u1: Msg = {"sessionUpdate": "usage_update", "used": 1, "size": 10, "cost": cost}
    u2: Msg = {"sessionUpdate": "usage_update", "used": 2, "size": 10}
    merged = merge_updates(u1, u2, 2)
    assert merged == ({**u2, "cost": cost},)
    validate_v2("SessionUpdate", merged[0])
    assert _model_after(2, *merged) == _model_after(2, u1, u2)
    assert merge_updates(u1, u2, 1) == (u1, u2)
    assert merge_updates(u2, u1, 1) == (u1,)


# --- table cases (v1) -----------------------------------------------------------------------

V1_TCU: Msg = {"sessionUpdate": "tool_call_update", "toolCallId": "call_001"}
V1_TC: Msg = {"sessionUpdate": "tool_call", "toolCallId": "call_001", "title": "T"}


@pytest.mark.parametrize(
    ("u1", "u2", "expected"),
    [
        (
            {**V1_TCU, "status": "pending"},
            {**V1_TCU, "title": "B"},
            ({**V1_TCU, "status": "pending", "title": "B"},),
        ),
        (
            {**V1_TCU, "_meta": {"a": None}},
            {**V1_TCU, "title": "B"},
            ({**V1_TCU, "_meta": {"a": None}, "title": "B"},),
        ),
        (
            {**V1_TCU, "title": "A"},
            {**V1_TCU, "_meta": {"b": 1}},
            ({**V1_TCU, "title": "A", "_meta": {"b": 1}},),
        ),
        ({**V1_TCU, "title": None}, {**V1_TCU, "title": "B"}, ({**V1_TCU, "title": "B"},)),
        ({**V1_TCU}, {**V1_TCU, "title": None}, ({**V1_TCU, "title": None},)),
        # both carry _meta: v1 defines no rule, so no merge
        ({**V1_TCU, "_meta": {"a": 1}}, {**V1_TCU, "_meta": {"b": 1}}, None),
        # u2 nulls a field u1 set: "null" may mean unchanged (v1 name) or clear
        ({**V1_TCU, "name": "x"}, {**V1_TCU, "name": None}, None),
        # a creation is never merged
        (V1_TC, V1_TC, None),
        (V1_TC, V1_TCU, None),
    ],
)
def test_merge_v1_table(u1: Msg, u2: Msg, expected: tuple[Msg, ...] | None) -> None:
    for update in (u1, u2, *(expected or ())):
        validate_v1("SessionUpdate", update)
    assert merge_updates(u1, u2, 1) == (expected if expected is not None else (u1, u2))


# --- the composition law over all fields ----------------------------------------------------


@st.composite
def v2_pairs(draw: st.DrawFn) -> tuple[Msg, Msg, Msg]:
    kind = draw(st.sampled_from(sorted(UPSERT_KINDS[2])))
    return draw(v2_updates(kind)), draw(v2_updates(kind)), draw(v2_updates(kind))


@SETTINGS
@given(v2_pairs())
def test_merge_updates_composition_law_v2(
    triple: tuple[Msg, Msg, Msg],
) -> None:
    prior, u1, u2 = triple
    for update in triple:
        validate_v2("SessionUpdate", update)
    before = frozen(triple)
    merged = merge_updates(u1, u2, 2)
    assert triple == before
    for update in merged:
        validate_v2("SessionUpdate", update)
    # for every stored state: none (first update), or whatever ``prior`` left
    assert _model_after(2, *merged) == _model_after(2, u1, u2)
    assert _model_after(2, prior, *merged) == _model_after(2, prior, u1, u2)
    two = (
        u1.get("_meta", OMITTED) is None
        and isinstance(u2.get("_meta"), dict)
        and any(v is not None for v in u2["_meta"].values())
    )
    assert len(merged) == (2 if two else 1)


V1_FIELD_POOLS: dict[str, list[Any]] = {
    "title": ["A", "B"],
    "status": ["pending", "completed"],
    "content": [[TOOL_CONTENT], []],
    "name": ["n"],
    "updatedAt": ["2026-10-13T10:00:00Z"],
}


@st.composite
def v1_updates(draw: st.DrawFn, kind: str) -> Msg:
    update: Msg = {"sessionUpdate": kind}
    if kind == "tool_call_update":
        update["toolCallId"] = "call_001"
        fields = ["title", "status", "content", "name"]
    else:
        fields = ["title", "updatedAt"]
    for field in fields:
        value = draw(st.one_of(st.just(OMITTED), st.none(), st.sampled_from(V1_FIELD_POOLS[field])))
        if value is not OMITTED:
            update[field] = value
    meta = draw(st.one_of(st.just(OMITTED), st.none(), meta_objects))
    return with_meta(update, meta)


@SETTINGS
@given(
    st.sampled_from(["tool_call_update", "session_info_update"]).flatmap(
        lambda k: st.tuples(v1_updates(k), v1_updates(k), v1_updates(k))
    )
)
def test_merge_updates_composition_law_v1(
    triple: tuple[Msg, Msg, Msg],
) -> None:
    prior, u1, u2 = triple
    for update in triple:
        validate_v1("SessionUpdate", update)
    merged = merge_updates(u1, u2, 1)
    assert _model_after(1, prior, *merged) == _model_after(1, prior, u1, u2)
    if len(merged) == 1:
        assert not ("_meta" in u1 and "_meta" in u2)
