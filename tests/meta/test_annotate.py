"""Stateless annotation (v2), the v1 policy (safe / stateful / off), and the annotation law."""

from __future__ import annotations

from typing import Any

import pytest
from acp_schema import validate_v1_message, validate_v2_message
from hypothesis import given, settings
from hypothesis import strategies as st
from patch_fixtures import (
    SID,
    V1_UPDATES,
    V2_CHUNKS,
    V2_OTHERS,
    V2_SNAPSHOTS,
    V2_UPSERTS,
    Msg,
    frozen,
    json_values,
    keys,
    meta_objects,
    permission_v1,
    permission_v2,
    session_update,
    v2_updates,
    with_meta,
)

from acp_proxy.base.jsontypes import OMITTED
from acp_proxy.meta.annotate import (
    NEEDS_SPLIT,
    AnnotateStatus,
    Annotation,
    V1MetaStore,
    V1Mode,
    annotate,
    annotate_message,
    followup_fields,
    v2_meta_after,
)
from acp_proxy.meta.registry import UPSERT_KINDS, find_upsert
from acp_proxy.meta.state import ClientModel

ROUTE = Annotation(set={"proxy.dev/route": "edge"}, remove=("secret.dev/token",))
TCU: Msg = {"sessionUpdate": "tool_call_update", "toolCallId": "call_001"}
TC_KEY = ("tool_call", SID, "call_001")
APPLIED, UNCHANGED = AnnotateStatus.APPLIED, AnnotateStatus.UNCHANGED


def _v2(message: Msg, annotation: Annotation = ROUTE) -> tuple[tuple[Msg, ...], Any]:
    validate_v2_message(message)
    before = frozen(message)
    result = annotate_message(message, 2, annotation)
    assert message == before
    for out in result.messages:
        validate_v2_message(out)
    return result.messages, result.status


# --- v2 -----------------------------------------------------------------------------------


def test_v2_omitted_meta_gets_set_and_removals() -> None:
    messages, status = _v2(session_update(TCU))
    assert status is APPLIED
    assert messages == (
        session_update({**TCU, "_meta": {"proxy.dev/route": "edge", "secret.dev/token": None}}),
    )


def test_v2_object_meta_gets_keys_added() -> None:
    own = {**TCU, "_meta": {"zed.dev/progress": 0.5, "proxy.dev/route": "agent"}}
    messages, status = _v2(session_update(own))
    assert status is APPLIED
    expected_meta = {"zed.dev/progress": 0.5, "proxy.dev/route": "agent", "secret.dev/token": None}
    assert messages == (session_update({**TCU, "_meta": expected_meta}),)
    over = Annotation(set={"proxy.dev/route": "edge"}, overwrite=True)
    messages, _ = _v2(session_update(own), over)
    assert messages[0]["params"]["update"]["_meta"] == {
        "zed.dev/progress": 0.5,
        "proxy.dev/route": "edge",
    }


@pytest.mark.parametrize(
    ("meta", "annotation"),
    [
        ({"proxy.dev/route": "edge", "secret.dev/token": None}, ROUTE),
        ({"proxy.dev/route": "other", "secret.dev/token": None}, ROUTE),
        ({"k": 1}, Annotation(set={"k": 1}, overwrite=True)),
        ({"k": 1}, Annotation()),
        (None, Annotation(remove=("k",))),  # the clear already removes every key
        (OMITTED, Annotation()),
    ],
)
def test_v2_unchanged(meta: Any, annotation: Annotation) -> None:
    message = session_update(with_meta(TCU, meta))
    messages, status = _v2(message, annotation)
    assert status is UNCHANGED
    assert messages[0] is message
    # The fused path's answer for the same update: nothing to change, built alone.
    assert v2_meta_after(message["params"]["update"], [annotation]) is OMITTED
    assert v2_meta_after(message["params"]["update"], [annotation, annotation]) is OMITTED


def test_v2_overwrite_tells_json_types_apart() -> None:
    message = session_update({**TCU, "_meta": {"k": 1}})
    messages, status = _v2(message, Annotation(set={"k": True}, overwrite=True))
    assert status is APPLIED
    assert messages[0]["params"]["update"]["_meta"] == {"k": True}


@pytest.mark.parametrize("kind", sorted(V2_UPSERTS))
def test_v2_clear_survives_with_a_follow_up(kind: str) -> None:
    message = session_update(with_meta(V2_UPSERTS[kind], None))
    messages, status = _v2(message)
    assert status is APPLIED
    assert len(messages) == 2
    assert messages[0] is message  # the clear is forwarded as sent
    follow = messages[1]
    spec = UPSERT_KINDS[2][kind]
    expected_update = {
        "sessionUpdate": kind,
        **{f: V2_UPSERTS[kind][f] for f in spec.required},
        "_meta": {"proxy.dev/route": "edge"},
    }
    assert follow == session_update(expected_update)
    site = find_upsert(follow, 2)
    assert site is not None and site.entity == find_upsert(message, 2).entity  # type: ignore[union-attr]


def test_v2_compaction_follow_up_copies_status() -> None:
    message = session_update(
        {**V2_UPSERTS["compaction_update"], "status": "completed", "_meta": None}
    )
    messages, _ = _v2(message)
    assert messages[1]["params"]["update"] == {
        "sessionUpdate": "compaction_update",
        "compactionId": "cmp_001",
        "status": "completed",
        "_meta": {"proxy.dev/route": "edge"},
    }


def test_v2_permission_request() -> None:
    tool_call = {"toolCallId": "call_001", "title": "Execute setup script", "status": "pending"}
    messages, status = _v2(permission_v2(tool_call))
    assert status is APPLIED
    assert messages == (
        permission_v2(
            {**tool_call, "_meta": {"proxy.dev/route": "edge", "secret.dev/token": None}}
        ),
    )
    cleared = permission_v2({**tool_call, "_meta": None})
    messages, status = _v2(cleared)
    assert status is APPLIED
    assert messages[0] is cleared
    assert messages[1] == session_update(
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "call_001",
            "_meta": {"proxy.dev/route": "edge"},
        }
    )


@pytest.mark.parametrize(
    "message",
    [
        *(session_update(u) for u in V2_CHUNKS.values()),
        *(session_update(u) for u in V2_SNAPSHOTS.values()),
        *(session_update(u) for u in V2_OTHERS.values()),
        {"jsonrpc": "2.0", "id": 3, "result": {"_meta": {}}},
    ],
    ids=str,
)
def test_v2_not_upserts_untouched(message: Msg) -> None:
    result = annotate_message(message, 2, ROUTE)
    assert result.status is AnnotateStatus.NOT_UPSERT
    assert result.messages[0] is message


def test_notification_meta_is_never_touched() -> None:
    message = session_update(TCU)
    message["params"]["_meta"] = {"traceparent": "00-1"}
    messages, _ = _v2(message)
    assert messages[0]["params"]["_meta"] == {"traceparent": "00-1"}


@pytest.mark.parametrize("version", [None, 0, 3])
def test_unknown_version(version: int | None) -> None:
    message = session_update(TCU)
    result = annotate_message(message, version, ROUTE)
    assert result.status is AnnotateStatus.UNKNOWN_VERSION
    assert result.messages == (message,)


def test_low_level_annotate() -> None:
    assert annotate({**TCU, "_meta": "junk"}, set={"k": 1}) == ({**TCU, "_meta": {"k": 1}},)
    # None in set is a removal; a key both set and removed is removed
    assert annotate(TCU, set={"a": None, "b": 1}, remove=["b"]) == (
        {**TCU, "_meta": {"a": None, "b": None}},
    )
    follow = annotate({**TCU, "_meta": None}, set={"k": 1})
    assert follow == ({**TCU, "_meta": None}, {**TCU, "_meta": {"k": 1}})
    custom = annotate({"x": 1, "y": 2, "_meta": None}, set={"k": 1}, carry=("y",))
    assert custom[1] == {"y": 2, "_meta": {"k": 1}}
    with pytest.raises(ValueError, match="no follow-up fields"):
        annotate({"sessionUpdate": "_custom", "_meta": None}, set={"k": 1})
    with pytest.raises(ValueError, match="no follow-up fields"):
        annotate({"_meta": None}, set={"k": 1})
    assert followup_fields("compaction_update") == ("sessionUpdate", "compactionId", "status")


# --- the annotation law (v2) ----------------------------------------------------------------

annotation_strategy = st.builds(
    Annotation,
    set=st.dictionaries(keys, json_values, max_size=3),
    remove=st.lists(keys, max_size=3).map(tuple),
    overwrite=st.booleans(),
)


@st.composite
def law_cases(draw: st.DrawFn) -> tuple[Msg, Msg, bool]:
    kind = draw(st.sampled_from(sorted(UPSERT_KINDS[2])))
    prior, update = draw(v2_updates(kind)), draw(v2_updates(kind))
    as_permission = kind == "tool_call_update" and draw(st.booleans())
    return prior, update, as_permission


def _wrap(update: Msg, as_permission: bool) -> Msg:
    if as_permission:
        return permission_v2({k: v for k, v in update.items() if k != "sessionUpdate"})
    return session_update(update)


@settings(max_examples=200, deadline=None)
@given(case=law_cases(), annotation=annotation_strategy, first=st.booleans())
def test_annotation_law(case: tuple[Msg, Msg, bool], annotation: Annotation, first: bool) -> None:
    prior, update, as_permission = case
    message = _wrap(update, as_permission)
    validate_v2_message(message)
    before = frozen((message, annotation))
    result = annotate_message(message, 2, annotation)
    assert (message, annotation) == before
    site = find_upsert(message, 2)
    assert site is not None
    # never a batch, never a new top-level key at the site other than `_meta`
    for out in result.messages:
        assert isinstance(out, dict)
        validate_v2_message(out)
    out_site = find_upsert(result.messages[0], 2)
    assert out_site is not None
    assert set(out_site.obj) <= set(site.obj) | {"_meta"}
    assert {k: v for k, v in out_site.obj.items() if k != "_meta"} == {
        k: v for k, v in site.obj.items() if k != "_meta"
    }
    # apply to a client that holds nothing (first update) or ``prior``'s state
    plain, annotated = ClientModel(2), ClientModel(2)
    if not first:
        plain.apply(_wrap(prior, False))
        annotated.apply(_wrap(prior, False))
    plain.apply(message)
    for out in result.messages:
        annotated.apply(out)
    expected_meta = dict(plain.meta(site.entity) or {})
    removes = {*annotation.remove, *(k for k, v in annotation.set.items() if v is None)}
    own = site.obj.get("_meta")
    for key, value in annotation.set.items():
        if key in removes:
            continue
        if not annotation.overwrite and isinstance(own, dict) and key in own:
            continue  # the update's own value stands, as without the proxy
        expected_meta[key] = value
    for key in removes:
        expected_meta.pop(key, None)
    assert (annotated.meta(site.entity) or {}) == expected_meta
    got, want = annotated.snapshot(), plain.snapshot()
    for snap in (got, want):
        snap["entities"][site.entity].pop("meta")
    assert got == want  # every other field of every entity is as without the proxy


# --- v1 -----------------------------------------------------------------------------------


def _v1(
    message: Msg,
    annotation: Annotation = ROUTE,
    mode: V1Mode = V1Mode.SAFE,
    store: V1MetaStore | None = None,
) -> tuple[tuple[Msg, ...], AnnotateStatus]:
    validate_v1_message(message)
    before = frozen(message)
    result = annotate_message(message, 1, annotation, v1_mode=mode, v1_store=store)
    assert message == before
    for out in result.messages:
        validate_v1_message(out)
    return result.messages, result.status


V1_TC, V1_TCU = V1_UPDATES["tool_call"], V1_UPDATES["tool_call_update"]


def test_v1_safe_annotates_objects_and_creations() -> None:
    messages, status = _v1(session_update({**V1_TCU, "_meta": {"a": 1, "secret.dev/token": "t"}}))
    assert status is APPLIED
    assert messages[0]["params"]["update"]["_meta"] == {"a": 1, "proxy.dev/route": "edge"}
    messages, status = _v1(session_update(V1_TC))
    assert status is APPLIED
    assert messages[0]["params"]["update"] == {**V1_TC, "_meta": {"proxy.dev/route": "edge"}}
    messages, status = _v1(session_update({**V1_TC, "_meta": None}))
    assert messages[0]["params"]["update"]["_meta"] == {"proxy.dev/route": "edge"}
    messages, status = _v1(permission_v1({"toolCallId": "call_001", "_meta": {}}))
    assert status is APPLIED
    assert messages[0]["params"]["toolCall"] == {
        "toolCallId": "call_001",
        "_meta": {"proxy.dev/route": "edge"},
    }


@pytest.mark.parametrize("meta", [OMITTED, None, "junk"])
def test_v1_safe_skips_updates_without_an_object(meta: Any) -> None:
    message = session_update(with_meta(V1_TCU, meta))
    result = annotate_message(message, 1, ROUTE)
    assert result.status is AnnotateStatus.SKIPPED_V1_UNSAFE
    assert result.messages[0] is message
    empty = annotate_message(message, 1, Annotation())
    assert empty.status is UNCHANGED


def test_v1_safe_unchanged_and_not_upsert() -> None:
    satisfied = session_update({**V1_TCU, "_meta": {"proxy.dev/route": "edge"}})
    assert _v1(satisfied)[1] is UNCHANGED
    assert _v1(session_update(V1_UPDATES["plan"]))[1] is AnnotateStatus.NOT_UPSERT
    assert _v1(session_update(V1_TC), Annotation(remove=("x",)))[1] is UNCHANGED


def test_v1_off() -> None:
    message = session_update({**V1_TCU, "_meta": {"a": 1}})
    result = annotate_message(message, 1, ROUTE, v1_mode=V1Mode.OFF)
    assert result.status is AnnotateStatus.V1_OFF
    assert result.messages == (message,)


def test_v1_stateful_sends_the_merged_object() -> None:
    store = V1MetaStore(max_entities=8)
    mode = V1Mode.STATEFUL
    # unknown entity, no object: skipped, as in safe mode
    assert (
        _v1(session_update(V1_TCU), mode=mode, store=store)[1] is AnnotateStatus.SKIPPED_V1_UNSAFE
    )
    # the creation is annotated and recorded
    messages, status = _v1(
        session_update({**V1_TC, "_meta": {"a": 1, "secret.dev/token": "t"}}),
        mode=mode,
        store=store,
    )
    assert messages[0]["params"]["update"]["_meta"] == {"a": 1, "proxy.dev/route": "edge"}
    assert store.get(TC_KEY) == {"a": 1, "proxy.dev/route": "edge"}
    # an update without `_meta`: already satisfied on the client
    assert _v1(session_update(V1_TCU), mode=mode, store=store)[1] is UNCHANGED
    # a new key: the complete merged object is sent (v1 replaces whole)
    more = Annotation(set={"proxy.dev/hop": 2})
    messages, status = _v1(session_update(V1_TCU), more, mode=mode, store=store)
    assert status is APPLIED
    assert messages[0]["params"]["update"]["_meta"] == {
        "a": 1,
        "proxy.dev/route": "edge",
        "proxy.dev/hop": 2,
    }
    # removing the last keys sends {} (v1 `null` may mean "unchanged")
    strip = Annotation(remove=("a", "proxy.dev/route", "proxy.dev/hop"))
    messages, _ = _v1(session_update(V1_TCU), strip, mode=mode, store=store)
    assert messages[0]["params"]["update"]["_meta"] == {}
    assert store.get(TC_KEY) is None
    # an explicit clear: the annotation alone
    messages, _ = _v1(session_update({**V1_TCU, "_meta": None}), mode=mode, store=store)
    assert messages[0]["params"]["update"]["_meta"] == {"proxy.dev/route": "edge"}
    assert (
        _v1(session_update({**V1_TCU, "_meta": None}), strip, mode=mode, store=store)[1]
        is UNCHANGED
    )


def test_v1_store_is_a_bounded_lru() -> None:
    store = V1MetaStore(max_entities=2)
    for call in ("c1", "c2"):
        store.observe(session_update({**V1_TC, "toolCallId": call, "_meta": {"n": call}}))
    store.observe(session_update({**V1_TCU, "toolCallId": "c1"}))  # touch c1
    store.observe(session_update({**V1_TC, "toolCallId": "c3"}))  # evicts c2
    assert len(store) == 2
    assert store.get(("tool_call", SID, "c2")) is OMITTED
    assert store.get(("tool_call", SID, "c1")) == {"n": "c1"}
    assert store.get(("tool_call", SID, "c3")) is None
    store.observe(session_update({**V1_TCU, "toolCallId": "c9"}))  # unknown, no object: no-op
    store.observe(session_update({**V1_TCU, "toolCallId": "c1", "_meta": None}))
    assert store.get(("tool_call", SID, "c1")) is None
    store.observe(session_update(V1_UPDATES["plan"]))
    assert len(store) == 2
    # an evicted entity is unknown again: skipped rather than guessed
    message = session_update({**V1_TCU, "toolCallId": "c2"})
    result = annotate_message(message, 1, ROUTE, v1_mode=V1Mode.STATEFUL, v1_store=store)
    assert result.status is AnnotateStatus.SKIPPED_V1_UNSAFE


def test_v1_store_errors() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        V1MetaStore(0)
    with pytest.raises(ValueError, match="needs a V1MetaStore"):
        annotate_message(session_update(V1_TC), 1, ROUTE, v1_mode=V1Mode.STATEFUL)


@settings(max_examples=100, deadline=None)
@given(
    metas=st.lists(st.one_of(st.just(OMITTED), st.none(), meta_objects), min_size=1, max_size=5),
    annotation=annotation_strategy,
    first_meta=st.one_of(st.just(OMITTED), meta_objects),
)
def test_v1_stateful_law(metas: list[Any], annotation: Annotation, first_meta: Any) -> None:
    """Under the v1 receiver model, stateful mode gives the client the original metadata plus
    the annotation after every update, and safe mode never changes a key it does not own."""
    updates = [with_meta(V1_TC, first_meta), *(with_meta(V1_TCU, m) for m in metas)]
    store = V1MetaStore()
    plain, stateful, safe = ClientModel(1), ClientModel(1), ClientModel(1)
    removes = {*annotation.remove, *(k for k, v in annotation.set.items() if v is None)}
    for update in updates:
        message = session_update(update)
        plain.apply(message)
        for out in annotate_message(
            message, 1, annotation, v1_mode=V1Mode.STATEFUL, v1_store=store
        ).messages:
            stateful.apply(out)
        for out in annotate_message(message, 1, annotation).messages:
            safe.apply(out)
        expected = dict(plain.meta(TC_KEY) or {})
        own = update.get("_meta")
        for key, value in annotation.set.items():
            if key in removes or (
                not annotation.overwrite and isinstance(own, dict) and key in own
            ):
                continue
            expected[key] = value
        for key in removes:
            expected.pop(key, None)
        assert (stateful.meta(TC_KEY) or {}) == expected
        named = {*annotation.set, *removes}
        safe_meta, plain_meta = safe.meta(TC_KEY) or {}, plain.meta(TC_KEY) or {}
        assert {k: v for k, v in safe_meta.items() if k not in named} == {
            k: v for k, v in plain_meta.items() if k not in named
        }


@pytest.mark.parametrize(
    ("meta", "annotations", "expected"),
    [
        # absent: the annotation is the whole patch (sets, then removals as null)
        (OMITTED, [ROUTE], {"proxy.dev/route": "edge", "secret.dev/token": None}),
        # a clear followed by keys to set must be split (the general path does that)
        (None, [ROUTE], "split"),
        # a clear and only removals: nothing to add
        (None, [Annotation(remove=("k",))], OMITTED),
        # junk is treated as omitted (the SDKs' default-on-error)
        ("junk", [Annotation(set={"k": 1})], {"k": 1}),
        # an object: set what is missing, overwrite only when asked, removals become null
        ({"a": 1}, [Annotation(set={"a": 2, "b": 3})], {"a": 1, "b": 3}),
        ({"a": 1}, [Annotation(set={"a": 2}, overwrite=True)], {"a": 2}),
        ({"a": 1}, [Annotation(remove=("a",))], {"a": None}),
        ({"a": 1}, [Annotation(set={"b": 2, "c": 3})], {"a": 1, "b": 2, "c": 3}),
        ({"r": 1}, [Annotation(set={"b": 2}, remove=("r",))], {"r": None, "b": 2}),
        ({"a": None}, [Annotation(remove=("a",))], OMITTED),
        # several rules, each on the previous one's output
        (
            {"a": 1},
            [Annotation(set={"b": 2}), Annotation(set={"b": 3}, overwrite=True), Annotation()],
            {"a": 1, "b": 3},
        ),
        ({"a": 1}, [Annotation(set={"b": 2}), Annotation(remove=("b",))], {"a": 1, "b": None}),
    ],
)
def test_v2_meta_after(meta: Any, annotations: list[Annotation], expected: Any) -> None:
    """The fused path's `_meta`, case by case; tests/wire/test_fused.py checks it against
    the general path on generated frames."""
    update = with_meta(TCU, meta)
    got = v2_meta_after(update, annotations)
    if expected == "split":
        assert got == NEEDS_SPLIT
    else:
        assert got == expected
    assert update == with_meta(TCU, meta)  # the update itself is never touched
