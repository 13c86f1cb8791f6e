"""Contracts of the patch core and of coalescing, one rule per test, exact outputs.

Each test states one rule of the specs or the RFD and asserts the exact result, so that a change
of behaviour fails here. Every v2 message built below is validated against the official schema.
Pure and synchronous: no I/O, no clock, no hypothesis (deterministic and fast).
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from acp_schema import validate_v1_message, validate_v2, validate_v2_message
from patch_fixtures import (
    SID,
    TEXT,
    TOOL_CONTENT,
    V1_UPDATES,
    V2_UPSERTS,
    Msg,
    frozen,
    permission_v1,
    permission_v2,
    session_update,
    with_meta,
)

from acp_proxy.base.jsontypes import OMITTED, JsonObject
from acp_proxy.config import CoalesceConfig
from acp_proxy.meta.annotate import (
    AnnotateStatus,
    Annotation,
    V1MetaStore,
    V1Mode,
    annotate_message,
)
from acp_proxy.meta.patch import apply_meta_patches, apply_meta_update, compose
from acp_proxy.meta.registry import UPSERT_KINDS, find_upsert
from acp_proxy.meta.state import ClientModel
from acp_proxy.meta.updates import merge_updates
from acp_proxy.wire.coalesce import OutboundQueue, OutFrame
from acp_proxy.wire.coalesce_take import FRAME_OVERHEAD

APPLIED = AnnotateStatus.APPLIED
UNCHANGED = AnnotateStatus.UNCHANGED
TCU: Msg = {"sessionUpdate": "tool_call_update", "toolCallId": "call_001"}
TC_KEY = ("tool_call", SID, "call_001")
ROUTE = Annotation(set={"proxy.dev/route": "edge"}, remove=("secret.dev/token",))

# Stored states every algebraic check below is run against (no metadata, disjoint and
# overlapping keys, a nested null that is data).
STORED: list[JsonObject | None] = [
    None,
    {"a": 1},
    {"b": 2},
    {"a": 1, "b": 2, "c": 3},
    {"z": {"x": None}},
]


def _model(version: int, *messages: Msg) -> dict[str, Any]:
    model = ClientModel(version)
    for message in messages:
        model.apply(message)
    return model.snapshot()


# --- the RFD's three extra cases, stated independently of the vectors file -----------------


@pytest.mark.parametrize(
    ("stored", "patches", "result"),
    [
        # unknown keys: namespaced keys the receiver never saw patch independently
        (
            {"zed.dev/progress": 0.5, "acme.dev/review": {"state": "pending"}},
            ({"zed.dev/progress": None, "acme.dev/review": {"reviewer": "sam"}, "x.dev/n": 1},),
            {"acme.dev/review": {"reviewer": "sam"}, "x.dev/n": 1},
        ),
        (None, ({"x.example/new": [None, {}]},), {"x.example/new": [None, {}]}),
        # a clear followed by an object: only the object's keys, its nulls remove nothing
        ({"a": 1, "b": 2}, (None, {"c": 3}), {"c": 3}),
        ({"a": 1, "b": 2}, (None, {"a": None, "c": 3}), {"c": 3}),
        ({"a": 1}, (None, {"a": None}), None),
        # replay over stale metadata: replay never resets implicitly, stale keys stay
        ({"old": 1, "a": 0}, ({"a": 1}, {"b": 2}, {"a": None}), {"old": 1, "b": 2}),
        (None, ({"a": 1}, {"b": 2}, {"a": None}), {"b": 2}),
        ({"old": 1}, ({"b": 2}, OMITTED, {}), {"old": 1, "b": 2}),
        # resynchronization, form 1 (stale keys set to null) and form 2 (null, then object)
        ({"old": 1, "a": 0}, ({"old": None, "a": None, "b": 2},), {"b": 2}),
        ({"old": 1, "a": 0}, (None, {"b": 2}), {"b": 2}),
    ],
)
def test_rfd_extra_cases(stored: Any, patches: tuple[Any, ...], result: Any) -> None:
    before = frozen((stored, patches))
    assert apply_meta_patches(stored, patches) == result
    assert (stored, patches) == before


def test_the_naive_clear_then_object_merge_is_observably_wrong() -> None:
    """RFD: replacing a clear followed by an object with just that object keeps stale keys."""
    stored: JsonObject = {"stale": 1}
    assert apply_meta_patches(stored, (None, {"k": 1})) == {"k": 1}
    assert apply_meta_update(stored, {"k": 1}) == {"stale": 1, "k": 1}
    assert compose(None, {"k": 1}) == (None, {"k": 1})


# --- compose over every pair of the four shapes -------------------------------------------

SHAPES: dict[str, Any] = {
    "omitted": OMITTED,
    "null": None,
    "empty": {},
    "nulls": {"a": None, "b": 1},
}
COMPOSE_TABLE: dict[tuple[str, str], tuple[Any, ...]] = {
    ("omitted", "omitted"): (OMITTED,),
    ("omitted", "null"): (None,),
    ("omitted", "empty"): ({},),
    ("omitted", "nulls"): ({"a": None, "b": 1},),
    ("null", "omitted"): (None,),
    ("null", "null"): (None,),
    ("null", "empty"): (None,),
    ("null", "nulls"): (None, {"b": 1}),
    ("empty", "omitted"): ({},),
    ("empty", "null"): (None,),
    ("empty", "empty"): ({},),
    ("empty", "nulls"): ({"a": None, "b": 1},),
    ("nulls", "omitted"): ({"a": None, "b": 1},),
    ("nulls", "null"): (None,),
    ("nulls", "empty"): ({"a": None, "b": 1},),
    ("nulls", "nulls"): ({"a": None, "b": 1},),
}


def test_compose_table_covers_every_pair() -> None:
    assert set(COMPOSE_TABLE) == {(a, b) for a in SHAPES for b in SHAPES}


@pytest.mark.parametrize(("pair", "expected"), COMPOSE_TABLE.items(), ids=str)
def test_compose_every_shape_pair(pair: tuple[str, str], expected: tuple[Any, ...]) -> None:
    a, b = frozen(SHAPES[pair[0]]), frozen(SHAPES[pair[1]])
    result = compose(a, b)
    assert result == expected
    assert (a, b) == (SHAPES[pair[0]], SHAPES[pair[1]])  # inputs untouched
    for stored in STORED:
        assert apply_meta_patches(stored, result) == apply_meta_patches(stored, (a, b))


def test_compose_later_nulls_remove_keys_the_earlier_patch_did_not_mention() -> None:
    assert compose({"a": 1, "b": 2}, {"b": None, "c": None}) == ({"a": 1, "b": None, "c": None},)
    assert compose({"a": None}, {"a": {"x": None}}) == ({"a": {"x": None}},)


# --- merge_updates: collections, `_meta` shapes, clear-then-object for every kind ----------

X = [TOOL_CONTENT]
LOC = [{"path": "/w/a.py", "line": 3}]


@pytest.mark.parametrize(
    ("u1", "u2", "expected"),
    [
        ({**TCU, "content": X}, {**TCU, "content": []}, {**TCU, "content": []}),
        ({**TCU, "content": []}, {**TCU, "content": None}, {**TCU, "content": None}),
        ({**TCU, "content": None}, {**TCU, "content": []}, {**TCU, "content": []}),
        ({**TCU, "content": []}, {**TCU, "content": X}, {**TCU, "content": X}),
        (
            {**TCU, "content": X},
            {**TCU, "status": "completed"},
            {**TCU, "content": X, "status": "completed"},
        ),
        ({**TCU, "locations": LOC}, {**TCU, "locations": None}, {**TCU, "locations": None}),
        ({**TCU, "locations": None}, {**TCU, "locations": LOC}, {**TCU, "locations": LOC}),
        (
            {"sessionUpdate": "agent_message", "messageId": "msg_a", "content": [TEXT]},
            {"sessionUpdate": "agent_message", "messageId": "msg_a", "content": []},
            {"sessionUpdate": "agent_message", "messageId": "msg_a", "content": []},
        ),
        (
            {**V2_UPSERTS["compaction_update"], "summary": []},
            {**V2_UPSERTS["compaction_update"], "status": "completed", "summary": None},
            {**V2_UPSERTS["compaction_update"], "status": "completed", "summary": None},
        ),
        # subagent additionalDirectories: `[]` reports none, `null` un-reports: both are values
        (
            {
                "sessionUpdate": "subagent_update",
                "sessionId": "child",
                "additionalDirectories": ["/a"],
            },
            {"sessionUpdate": "subagent_update", "sessionId": "child", "additionalDirectories": []},
            {"sessionUpdate": "subagent_update", "sessionId": "child", "additionalDirectories": []},
        ),
    ],
)
def test_merge_collections_empty_vs_null(u1: Msg, u2: Msg, expected: Msg) -> None:
    for update in (u1, u2, expected):
        validate_v2("SessionUpdate", update)
    before = frozen((u1, u2))
    assert merge_updates(u1, u2, 2) == (expected,)
    assert (u1, u2) == before
    kind = u1["sessionUpdate"]
    prior = with_meta(V2_UPSERTS[kind], {"p": 1})
    for start in ((), (session_update(prior),)):
        assert _model(2, *start, session_update(expected)) == _model(
            2, *start, session_update(u1), session_update(u2)
        )


@pytest.mark.parametrize("field", ["content", "locations"])
def test_client_model_clears_a_collection_with_empty_list_or_null(field: str) -> None:
    """ToolCallUpdate: "both `null` and `[]` clear the collection" (the model the laws use)."""
    full = session_update({**TCU, field: X if field == "content" else LOC})
    assert _model(2, full, session_update({**TCU, field: []})) == _model(
        2, full, session_update({**TCU, field: None})
    )
    sub = {"sessionUpdate": "subagent_update", "sessionId": "child"}
    reported = _model(2, session_update({**sub, "additionalDirectories": []}))
    unreported = _model(2, session_update({**sub, "additionalDirectories": None}))
    assert reported != unreported  # not a collection that `[]` clears


@pytest.mark.parametrize(("pair", "expected_meta"), COMPOSE_TABLE.items(), ids=str)
def test_merge_meta_every_shape_pair(pair: tuple[str, str], expected_meta: tuple[Any, ...]) -> None:
    u1 = with_meta({**TCU, "status": "pending"}, SHAPES[pair[0]])
    u2 = with_meta({**TCU, "title": "T"}, SHAPES[pair[1]])
    merged = merge_updates(u1, u2, 2)
    fields = {**TCU, "status": "pending", "title": "T"}
    if len(expected_meta) == 2:
        expected: tuple[Msg, ...] = (
            {**fields, "_meta": None},
            {**TCU, "_meta": expected_meta[1]},
        )
    else:
        expected = (with_meta(fields, expected_meta[0]),)
    assert merged == expected
    for update in (u1, u2, *merged):
        validate_v2("SessionUpdate", update)
    for stored in STORED:
        prior = session_update(with_meta(TCU, stored))
        assert _model(2, prior, *map(session_update, merged)) == _model(
            2, prior, session_update(u1), session_update(u2)
        )


@pytest.mark.parametrize("kind", sorted(V2_UPSERTS))
def test_merge_clear_then_object_for_every_kind(kind: str) -> None:
    spec = UPSERT_KINDS[2][kind]
    base = with_meta(V2_UPSERTS[kind], OMITTED)
    u1 = {**base, "_meta": None}
    u2 = {
        "sessionUpdate": kind,
        **{f: base[f] for f in spec.required},
        "_meta": {"gone": None, "k": 1},
    }
    first, follow = merge_updates(u1, u2, 2)
    assert first == {**base, "_meta": None}
    assert follow == {
        "sessionUpdate": kind,
        **{f: base[f] for f in spec.required},
        "_meta": {"k": 1},
    }
    for update in (u1, u2, first, follow):
        validate_v2("SessionUpdate", update)
    for stored in STORED:
        prior = session_update(with_meta(base, stored))
        assert _model(2, prior, session_update(first), session_update(follow)) == _model(
            2, prior, session_update(u1), session_update(u2)
        )


# --- annotate -----------------------------------------------------------------------------


def test_permission_clear_gets_a_tool_call_update_follow_up_after_the_request() -> None:
    tool_call = {
        "toolCallId": "call_042",
        "title": "Run setup",
        "status": "pending",
        "content": [TOOL_CONTENT],
        "_meta": None,
    }
    request = permission_v2(tool_call, session_id="sess_other", id_=99)
    request["params"]["_meta"] = {"traceparent": "00-1"}
    validate_v2_message(request)
    before = frozen(request)
    result = annotate_message(request, 2, ROUTE)
    assert request == before
    assert result.status is APPLIED
    assert isinstance(result.messages, tuple) and len(result.messages) == 2
    assert result.messages[0] is request  # the clear is forwarded as sent, first
    assert result.messages[1] == {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "sess_other",
            "update": {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "call_042",
                "_meta": {"proxy.dev/route": "edge"},
            },
        },
    }
    for out in result.messages:
        assert isinstance(out, dict)  # never a JSON-RPC batch
        validate_v2_message(out)
    # On a client holding stale metadata: cleared, then only the annotation.
    key = ("tool_call", "sess_other", "call_042")
    stale = session_update(
        {"sessionUpdate": "tool_call_update", "toolCallId": "call_042", "_meta": {"old": 1}},
        "sess_other",
    )
    model = ClientModel(2)
    for message in (stale, *result.messages):
        model.apply(message)
    assert model.meta(key) == {"proxy.dev/route": "edge"}
    # Removals only: the clear already satisfies them, nothing is added.
    only_remove = annotate_message(request, 2, Annotation(remove=("x",)))
    assert only_remove.status is UNCHANGED and only_remove.messages == (request,)


def test_permission_without_meta_is_annotated_in_place() -> None:
    request = permission_v2({"toolCallId": "call_001", "title": "Run"})
    validate_v2_message(request)
    result = annotate_message(request, 2, ROUTE)
    expected = permission_v2(
        {
            "toolCallId": "call_001",
            "title": "Run",
            "_meta": {"proxy.dev/route": "edge", "secret.dev/token": None},
        }
    )
    assert result.messages == (expected,)
    validate_v2_message(expected)


META_SHAPES: list[Any] = [
    OMITTED,
    None,
    {},
    {"proxy.dev/route": "agent", "zed.dev/progress": 0.5},
    {"secret.dev/token": None},
]
ANNOTATIONS = [
    ROUTE,
    Annotation(set={"proxy.dev/route": "edge"}, overwrite=True),
    Annotation(remove=("zed.dev/progress",)),
    Annotation(set={"a": {"x": None}, "b": None}),
]


def _cases() -> list[tuple[Msg, str]]:
    cases = []
    for kind, update in sorted(V2_UPSERTS.items()):
        for i, meta in enumerate(META_SHAPES):
            cases.append((session_update(with_meta(update, meta)), f"{kind}-{i}"))
    for i, meta in enumerate(META_SHAPES):
        tool_call = with_meta({"toolCallId": "call_001", "title": "Run"}, meta)
        cases.append((permission_v2(tool_call), f"permission-{i}"))
    return cases


@pytest.mark.parametrize("annotation", ANNOTATIONS, ids=str)
@pytest.mark.parametrize(("message", "name"), _cases(), ids=[n for _, n in _cases()])
def test_annotation_adds_no_key_but_meta(message: Msg, name: str, annotation: Annotation) -> None:
    validate_v2_message(message)
    before = frozen(message)
    result = annotate_message(message, 2, annotation)
    assert message == before
    site = find_upsert(message, 2)
    assert site is not None
    outs: list[Any] = list(result.messages)
    first, *rest = outs
    assert len(rest) <= 1
    assert first.keys() == message.keys()
    assert first["params"].keys() == message["params"].keys()
    out_site = find_upsert(first, 2)
    assert out_site is not None
    assert set(out_site.obj) <= set(site.obj) | {"_meta"}
    assert {k: v for k, v in out_site.obj.items() if k != "_meta"} == {
        k: v for k, v in site.obj.items() if k != "_meta"
    }
    for follow in rest:
        assert follow.keys() == {"jsonrpc", "method", "params"}
        assert follow["params"].keys() == {"sessionId", "update"}
        update = follow["params"]["update"]
        allowed = set(site.obj) | {"_meta", "sessionUpdate"}
        assert set(update) <= allowed
        assert update["sessionUpdate"] == site.kind
        follow_site = find_upsert(follow, 2)
        assert follow_site is not None and follow_site.entity == site.entity
    for out in result.messages:
        validate_v2_message(out)


UNKNOWN_V2: Msg = {
    "sessionUpdate": "_x.example/tool_call_update",
    "toolCallId": "call_001",
    "_meta": None,
}


def test_unknown_kinds_are_untouched_everywhere() -> None:
    message = session_update(UNKNOWN_V2)
    validate_v2_message(message)
    for version in (1, 2):
        for mode in V1Mode:
            store = V1MetaStore(4)
            result = annotate_message(message, version, ROUTE, v1_mode=mode, v1_store=store)
            assert result.status is AnnotateStatus.NOT_UPSERT
            assert result.messages[0] is message and len(result.messages) == 1
            assert len(store) == 0
        assert merge_updates(UNKNOWN_V2, UNKNOWN_V2, version) == (UNKNOWN_V2, UNKNOWN_V2)
        assert merge_updates(UNKNOWN_V2, UNKNOWN_V2, version)[0] is UNKNOWN_V2
    raw = orjson.dumps(message)
    assert _run([raw, raw, raw]) == [raw + b"\n"] * 3


# --- v1: safe / stateful / off ------------------------------------------------------------

V1_TC, V1_TCU = V1_UPDATES["tool_call"], V1_UPDATES["tool_call_update"]


@pytest.mark.parametrize(
    ("update", "mode", "status", "meta"),
    [
        # safe: an object is replaced whole anyway, so the annotation joins it (removals dropped)
        (
            {**V1_TCU, "_meta": {"a": 1, "secret.dev/token": "t"}},
            V1Mode.SAFE,
            APPLIED,
            {"a": 1, "proxy.dev/route": "edge"},
        ),
        # safe: a creation defines the whole metadata
        (V1_TC, V1Mode.SAFE, APPLIED, {"proxy.dev/route": "edge"}),
        ({**V1_TC, "_meta": {"a": 1}}, V1Mode.SAFE, APPLIED, {"a": 1, "proxy.dev/route": "edge"}),
        # safe: omitted or null would turn "unchanged"/"clear" into "replace": skipped
        (V1_TCU, V1Mode.SAFE, AnnotateStatus.SKIPPED_V1_UNSAFE, OMITTED),
        ({**V1_TCU, "_meta": None}, V1Mode.SAFE, AnnotateStatus.SKIPPED_V1_UNSAFE, None),
        # off: never annotated, even where safe
        (V1_TC, V1Mode.OFF, AnnotateStatus.V1_OFF, OMITTED),
        ({**V1_TCU, "_meta": {"a": 1}}, V1Mode.OFF, AnnotateStatus.V1_OFF, {"a": 1}),
        # stateful, unknown entity without an object: skipped rather than guessed
        (V1_TCU, V1Mode.STATEFUL, AnnotateStatus.SKIPPED_V1_UNSAFE, OMITTED),
        # stateful, an explicit clear: the client holds nothing, so the annotation alone
        ({**V1_TCU, "_meta": None}, V1Mode.STATEFUL, APPLIED, {"proxy.dev/route": "edge"}),
    ],
)
def test_v1_modes(update: Msg, mode: V1Mode, status: AnnotateStatus, meta: Any) -> None:
    message = session_update(update)
    validate_v1_message(message)
    before = frozen(message)
    store = V1MetaStore(4)
    result = annotate_message(message, 1, ROUTE, v1_mode=mode, v1_store=store)
    assert message == before
    assert result.status is status
    assert len(result.messages) == 1
    out = result.messages[0]
    validate_v1_message(out)
    if status is APPLIED:
        assert out == session_update(with_meta(update, meta))
    else:
        assert out is message
    if mode is not V1Mode.STATEFUL:
        assert len(store) == 0  # only stateful mode records


def test_v1_stateful_sends_the_complete_merged_object() -> None:
    store = V1MetaStore(4)
    mode = V1Mode.STATEFUL

    def send(message: Msg) -> tuple[Msg, AnnotateStatus]:
        result = annotate_message(message, 1, ROUTE, v1_mode=mode, v1_store=store)
        (out,) = result.messages
        validate_v1_message(out)
        return out, result.status

    out, status = send(session_update({**V1_TC, "_meta": {"agent": 1}}))
    assert out["params"]["update"]["_meta"] == {"agent": 1, "proxy.dev/route": "edge"}
    # The agent later replaces its metadata without the annotation: the merged object is sent.
    out, status = send(session_update({**V1_TCU, "_meta": {"agent": 2}}))
    assert (status, out["params"]["update"]["_meta"]) == (
        APPLIED,
        {"agent": 2, "proxy.dev/route": "edge"},
    )
    # No `_meta`: the client still holds the annotation; nothing to send.
    out, status = send(session_update(V1_TCU))
    assert status is UNCHANGED and "_meta" not in out["params"]["update"]
    assert store.get(TC_KEY) == {"agent": 2, "proxy.dev/route": "edge"}
    # A v1 permission request's toolCall is the same entity.
    out, status = send(permission_v1({"toolCallId": "call_001", "_meta": {"agent": 3}}))
    assert out["params"]["toolCall"]["_meta"] == {"agent": 3, "proxy.dev/route": "edge"}
    assert store.get(TC_KEY) == {"agent": 3, "proxy.dev/route": "edge"}


def test_v1_store_get_refreshes_recency_and_the_bound_holds() -> None:
    store = V1MetaStore(max_entities=2)
    k1, k2, k3 = (("tool_call", SID, c) for c in ("c1", "c2", "c3"))
    store.record(k1, {"n": 1})
    store.record(k2, None)
    assert store.get(k1) == {"n": 1}  # k1 is now the most recently used
    store.record(k3, {"n": 3})
    assert len(store) == 2
    assert store.get(k2) is OMITTED  # the least recently used went
    assert store.get(k1) == {"n": 1} and store.get(k3) == {"n": 3}
    store.record(k1, {"n": 11})  # re-recording does not grow the store
    assert len(store) == 2 and store.get(k1) == {"n": 11}
    single = V1MetaStore(max_entities=1)
    single.record(k1, None)
    single.record(k2, None)
    assert len(single) == 1 and single.get(k1) is OMITTED and single.get(k2) is None


def test_v1_stateful_store_stays_bounded_and_forgets_the_oldest() -> None:
    store = V1MetaStore(max_entities=3)
    ids = [f"call_{i}" for i in range(5)]
    for call in ids:
        message = session_update({**V1_TC, "toolCallId": call})
        annotate_message(message, 1, ROUTE, v1_mode=V1Mode.STATEFUL, v1_store=store)
        assert len(store) <= 3
    assert len(store) == 3
    for call, known in zip(ids, [False, False, True, True, True], strict=True):
        message = session_update({**V1_TCU, "toolCallId": call})
        held = store.get(("tool_call", SID, call))
        assert (held is not OMITTED) == known
        if known:
            assert held == {"proxy.dev/route": "edge"}
        else:
            result = annotate_message(message, 1, ROUTE, v1_mode=V1Mode.STATEFUL, v1_store=store)
            assert result.status is AnnotateStatus.SKIPPED_V1_UNSAFE
            assert result.messages == (message,)


# --- coalescing ---------------------------------------------------------------------------


def _v2_frame(message: Msg) -> bytes:
    if message.get("method") in ("session/update", "session/request_permission"):
        validate_v2_message(message)
    return orjson.dumps(message)


def tick(call: str = "call_001", **fields: Any) -> bytes:
    return _v2_frame(
        session_update({"sessionUpdate": "tool_call_update", "toolCallId": call, **fields})
    )


def lines(*frames: bytes) -> list[bytes]:
    return [f + b"\n" for f in frames]


def take(queue: OutboundQueue, now: float) -> tuple[list[bytes], float | None]:
    """``queue.take`` with its runs of lines split into one frame (ending in a newline) each."""
    out, deadline = queue.take(now)
    return [line + b"\n" for run in out for line in run[:-1].split(b"\n")], deadline


def _run(frames: list[bytes], config: CoalesceConfig | None = None) -> list[bytes]:
    queue = OutboundQueue(config or CoalesceConfig(), coalesce=True)
    for raw in frames:
        queue.push(OutFrame(raw, None, 2), 0.0)
    out, deadline = take(queue, 0.0)
    assert deadline is None and len(queue) == 0
    return out


PROMPT_RESPONSE = {"jsonrpc": "2.0", "id": 1, "result": {"messageId": "msg_u"}}
validate_v2("PromptResponse", PROMPT_RESPONSE["result"])
ELICITATION_DONE = {
    "jsonrpc": "2.0",
    "method": "elicitation/complete",
    "params": {"elicitationId": "el_1"},
}
validate_v2("CompleteElicitationNotification", ELICITATION_DONE["params"])

BARRIERS: dict[str, bytes] = {
    "permission request": _v2_frame(
        permission_v2({"toolCallId": "call_001", "title": "Run", "status": "pending"})
    ),
    "session/prompt response": orjson.dumps(PROMPT_RESPONSE),
    "error response": b'{"jsonrpc":"2.0","id":2,"error":{"code":-32603,"message":"x"}}',
    "other notification": orjson.dumps(ELICITATION_DONE),
    "batch of updates": b"[" + tick(status="in_progress") + b"," + tick(status="pending") + b"]",
    "notice": _v2_frame(
        session_update({"sessionUpdate": "notice", "severity": "info", "title": "n"})
    ),
    "unknown kind": _v2_frame(session_update(UNKNOWN_V2)),
}


@pytest.mark.parametrize("barrier", BARRIERS.values(), ids=list(BARRIERS))
def test_nothing_merges_across_a_barrier(barrier: bytes) -> None:
    before = tick(status="in_progress", rawOutput={"p": 1})
    after = [tick(rawOutput={"p": 2}), tick(rawOutput={"p": 3})]
    assert _run([before, barrier, *after]) == lines(before, barrier, tick(rawOutput={"p": 3}))
    # Updates of other entities around it are not moved across it either.
    other = tick("call_002", status="pending")
    assert _run([before, other, barrier, tick(status="completed")]) == lines(
        before, other, barrier, tick(status="completed")
    )


def test_batches_are_units_never_merged_into_or_split() -> None:
    batch = BARRIERS["batch of updates"]
    frames = [batch, tick(status="completed"), batch, batch]
    assert _run(frames) == lines(batch, tick(status="completed"), batch, batch)
    assert _run([tick(status="pending"), batch]) == lines(tick(status="pending"), batch)


def test_merges_only_while_the_queue_holds_pending_messages() -> None:
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    a, b, c = tick(rawOutput={"p": 1}), tick(rawOutput={"p": 2}), tick(rawOutput={"p": 3})
    queue.push(OutFrame(a, None, 2), 0.0)
    assert take(queue, 0.0) == (lines(a), None)  # written as it came
    queue.push(OutFrame(b, None, 2), 0.0)  # nothing pending: b is not merged into a
    queue.push(OutFrame(c, None, 2), 0.0)  # b pending: c merges into it
    assert take(queue, 0.0) == (lines(c), None)
    assert (queue.stats.pushed, queue.stats.merged, queue.stats.written) == (3, 1, 2)
    # A pending barrier is enough: the updates behind it merge among themselves.
    req = BARRIERS["permission request"]
    for raw in (req, a, b):
        queue.push(OutFrame(raw, None, 2), 0.0)
    assert take(queue, 0.0) == (lines(req, b), None)


def test_split_clear_then_object_is_exact_bytes() -> None:
    frames = [
        tick(status="in_progress", _meta={"a": 1}),
        tick(_meta=None),
        tick(status="completed", _meta={"gone": None, "b": 2}),
    ]
    assert _run(frames) == lines(
        tick(status="completed", _meta=None),
        tick(_meta={"b": 2}),
    )


def test_has_room_is_false_exactly_at_the_message_bound() -> None:
    queue = OutboundQueue(CoalesceConfig(max_queue_messages=2), coalesce=True)
    assert queue.has_room()
    queue.push(OutFrame(tick("call_001", status="pending"), None, 2), 0.0)
    assert queue.has_room()
    queue.push(OutFrame(tick("call_002", status="pending"), None, 2), 0.0)
    assert len(queue) == 2 and not queue.has_room()
    queue.push(OutFrame(tick("call_001", status="completed"), None, 2), 0.0)  # merges
    assert not queue.has_room() and len(queue) == 2  # at the bound, waiting frames merge
    queue.push(OutFrame(BARRIERS["error response"], None, 2), 0.0)  # pushed regardless
    assert len(queue) == 3 and not queue.has_room()
    out, _ = take(queue, 0.0)  # never dropped
    assert out == lines(
        tick("call_001", status="completed"),
        tick("call_002", status="pending"),
        BARRIERS["error response"],
    )
    assert queue.has_room()


@pytest.mark.parametrize(("slack", "room"), [(-1, False), (0, False), (1, True)])
def test_has_room_is_false_exactly_at_the_byte_bound(slack: int, room: bool) -> None:
    frame = tick(status="pending")
    held = len(frame) + 1 + FRAME_OVERHEAD  # its bytes and what holding them costs
    queue = OutboundQueue(CoalesceConfig(max_queue_bytes=held + slack), coalesce=True)
    queue.push(OutFrame(frame, None, 2), 0.0)
    assert queue.pending_bytes == held
    assert queue.has_room() is room


def test_min_interval_is_off_by_default() -> None:
    assert CoalesceConfig().min_interval_ms == 0
    assert not OutboundQueue(CoalesceConfig(), coalesce=True).rate_limited
    limited = CoalesceConfig(min_interval_ms=50)
    assert OutboundQueue(limited, coalesce=True).rate_limited
    assert not OutboundQueue(limited, coalesce=False).rate_limited
    assert not OutboundQueue(
        CoalesceConfig(enabled=False, min_interval_ms=50), coalesce=True
    ).rate_limited


def test_min_interval_holds_an_entity_and_merges_while_the_client_keeps_up() -> None:
    queue = OutboundQueue(CoalesceConfig(min_interval_ms=50), coalesce=True)
    t1 = [tick(rawOutput={"p": i}) for i in range(4)]
    other = tick("call_002", status="pending")
    queue.push(OutFrame(t1[0], None, 2), 0.0)
    assert take(queue, 0.0) == (lines(t1[0]), None)  # never written before: not held
    queue.push(OutFrame(t1[1], None, 2), 0.01)
    queue.push(OutFrame(other, None, 2), 0.01)
    out, deadline = take(queue, 0.01)
    assert out == lines(other) and deadline == pytest.approx(0.05)
    queue.push(OutFrame(t1[2], None, 2), 0.02)  # merges into the held one
    queue.push(OutFrame(t1[3], None, 2), 0.03)
    out, deadline = take(queue, 0.04)
    assert out == [] and deadline == pytest.approx(0.05)
    out, deadline = take(queue, 0.05)
    assert (out, deadline) == (lines(t1[3]), None)
    assert queue.stats.merged == 2 and queue.stats.written == 3
    # A barrier releases a held update before it, and the next one waits after it.
    barrier = BARRIERS["session/prompt response"]
    queue.push(OutFrame(tick(status="completed"), None, 2), 0.06)
    queue.push(OutFrame(barrier, None, 2), 0.06)
    queue.push(OutFrame(tick(status="failed"), None, 2), 0.06)
    out, deadline = take(queue, 0.07)
    assert out == lines(tick(status="completed"), barrier)
    assert deadline == pytest.approx(0.12)
    assert deadline is not None and take(queue, 0.11) == ([], deadline)
    assert take(queue, deadline) == (lines(tick(status="failed")), None)  # due at the deadline


def test_coalesced_output_reaches_the_same_client_state() -> None:
    frames = [
        tick(status="pending", _meta={"a": 1, "b": 2}),
        tick(_meta={"a": None}),
        tick("call_002", _meta=None),
        tick(content=[TOOL_CONTENT]),
        tick("call_002", _meta={"c": 3}),
        tick(content=[]),
        BARRIERS["permission request"],
        tick(status="completed", _meta={}),
    ]
    out = _run(frames)
    assert len(out) < len(frames) + 1
    prior = [
        session_update({**TCU, "_meta": {"stale": 1, "b": 0}}),
        session_update({**TCU, "toolCallId": "call_002", "_meta": {"stale": 1}}),
    ]
    assert _model(2, *prior, *(json.loads(f) for f in out)) == _model(
        2, *prior, *(json.loads(f) for f in frames)
    )
