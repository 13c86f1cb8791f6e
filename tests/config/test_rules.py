"""Tests for acp_proxy.rules.engine: matching, message-level edits, entity annotation, order,
needles."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, cast

import pytest
from acp_schema import schema_defs, validate_v1_message, validate_v2_message

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.meta.annotate import V1Mode
from acp_proxy.rules.engine import (
    KNOWN_UPDATE_KINDS,
    Rule,
    RuleDirection,
    RulesMiddleware,
    RuleTarget,
    edit_params_meta,
    rules_needles,
)
from acp_proxy.wire.chain import (
    FORWARD,
    Chain,
    Direction,
    Forward,
    Link,
    MessageContext,
    Middleware,
    Replace,
    Verdict,
)

A2C = Direction.AGENT_TO_CLIENT
C2A = Direction.CLIENT_TO_AGENT
TAG: dict[str, JsonValue] = {"example.dev/m": 1}


def ctx(version: int | None = 2, direction: Direction = A2C) -> MessageContext:
    return MessageContext(direction, version)


def update(update: JsonObject, meta: JsonValue = None, *, session: str = "s1") -> JsonObject:
    """A session/update notification; ``meta`` (when not None) is the message-level _meta."""
    params: JsonObject = {"sessionId": session, "update": update}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "method": "session/update", "params": params}


def tool_update(**fields: JsonValue) -> JsonObject:
    return update({"sessionUpdate": "tool_call_update", "toolCallId": "c1", **fields})


PLAN = update({"sessionUpdate": "plan_update", "plan": {"planId": "p", "entries": []}})
CHUNK = update(
    {
        "sessionUpdate": "agent_message_chunk",
        "messageId": "m1",
        "content": {"type": "text", "text": "hi"},
    }
)
PERMISSION_TOOL: JsonObject = {
    "jsonrpc": "2.0",
    "id": 5,
    "method": "session/request_permission",
    "params": {
        "sessionId": "s1",
        "title": "Run it?",
        "subject": {"type": "tool_call", "toolCall": {"toolCallId": "c1", "title": "Run"}},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}],
    },
}
PERMISSION_COMMAND: JsonObject = {
    "jsonrpc": "2.0",
    "id": 6,
    "method": "session/request_permission",
    "params": {
        "sessionId": "s1",
        "title": "Run it?",
        "subject": {"type": "command", "command": "ls", "cwd": "/"},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}],
    },
}
PROMPT: JsonObject = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "session/prompt",
    "params": {"sessionId": "s1", "prompt": []},
}
RESPONSE: JsonObject = {"jsonrpc": "2.0", "id": 1, "result": {"stopReason": "end_turn"}}


def tagged(message: JsonObject, meta: JsonObject) -> JsonObject:
    """``message`` with ``params._meta`` set to ``meta``."""
    params = message["params"]
    assert isinstance(params, dict)
    return {**message, "params": {**params, "_meta": meta}}


def message_rule(**kw: Any) -> Rule:
    return Rule(name="r", set_meta=TAG, target=RuleTarget.MESSAGE, **kw)


@dataclass(frozen=True)
class Said:
    """What a verdict says besides what it sends: the rules that changed the message (``by``)
    and the matching ones the v1 policy held back (``skipped``)."""

    by: tuple[str, ...]
    skipped: tuple[str, ...]


def plain(verdict: Verdict) -> tuple[Verdict, Said]:
    """The verdict without its report, and the report."""
    if isinstance(verdict, Replace):
        said = Said(verdict.by, verdict.skipped)
        return Replace(verdict.messages, verdict.replies), said
    if isinstance(verdict, Forward):
        return FORWARD, Said((), verdict.skipped)
    return verdict, Said((), ())


def run(
    rules: list[Rule], message: JsonObject, context: MessageContext | None = None, **kw: Any
) -> tuple[Verdict, Said]:
    """Run a fresh middleware once, checking that the input is never mutated."""
    mw = RulesMiddleware(rules, **kw)
    before = copy.deepcopy(message)
    verdict = mw(message, context or ctx())
    assert message == before
    return plain(verdict)


# --- matching (with message-target rules, which change any message with params) -------------

MATCHING: list[tuple[str, dict[str, Any], JsonObject, MessageContext, bool]] = [
    ("no-filter", {}, PLAN, ctx(), True),
    ("no-filter-other-direction", {}, PROMPT, ctx(direction=C2A), True),
    ("direction-a2c", {"direction": RuleDirection.AGENT_TO_CLIENT}, PLAN, ctx(), True),
    (
        "direction-a2c-miss",
        {"direction": RuleDirection.AGENT_TO_CLIENT},
        PROMPT,
        ctx(2, C2A),
        False,
    ),
    ("direction-c2a", {"direction": RuleDirection.CLIENT_TO_AGENT}, PROMPT, ctx(2, C2A), True),
    ("direction-c2a-miss", {"direction": RuleDirection.CLIENT_TO_AGENT}, PLAN, ctx(), False),
    ("direction-both", {"direction": RuleDirection.BOTH}, PROMPT, ctx(2, C2A), True),
    ("method-exact", {"method": "session/update"}, PLAN, ctx(), True),
    ("method-exact-miss", {"method": "session/update"}, PROMPT, ctx(), False),
    ("method-exact-is-not-prefix", {"method": "session/up"}, PLAN, ctx(), False),
    ("method-on-response", {"method": "session/update"}, RESPONSE, ctx(), False),
    ("glob-star", {"method": "session/*"}, PROMPT, ctx(), True),
    ("glob-star-miss", {"method": "fs/*"}, PROMPT, ctx(), False),
    ("glob-star-crosses-slash", {"method": "*update"}, PLAN, ctx(), True),
    ("glob-class", {"method": "session/[pu]*"}, PROMPT, ctx(), True),
    ("glob-class-miss", {"method": "session/[!pu]*"}, PROMPT, ctx(), False),
    ("glob-question", {"method": "session/promp?"}, PROMPT, ctx(), True),
    ("glob-case-sensitive", {"method": "Session/*"}, PROMPT, ctx(), False),
    ("kind", {"update_kinds": ("plan_update",)}, PLAN, ctx(), True),
    ("kind-miss", {"update_kinds": ("tool_call_update",)}, PLAN, ctx(), False),
    ("kind-several", {"update_kinds": ("tool_call_update", "plan_update")}, PLAN, ctx(), True),
    ("kind-not-session-update", {"update_kinds": ("plan_update",)}, PROMPT, ctx(), False),
    ("kind-chunk", {"update_kinds": ("agent_message_chunk",)}, CHUNK, ctx(), True),
    ("upserts-tool-call-update", {"update_upserts": True}, tool_update(), ctx(), True),
    ("upserts-not-plan", {"update_upserts": True}, PLAN, ctx(), False),
    ("upserts-not-chunk", {"update_upserts": True}, CHUNK, ctx(), False),
    ("upserts-permission-tool-call", {"update_upserts": True}, PERMISSION_TOOL, ctx(), True),
    ("upserts-permission-command", {"update_upserts": True}, PERMISSION_COMMAND, ctx(), False),
    (
        "upserts-v1-tool-call",
        {"update_upserts": True},
        update({"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "t"}),
        ctx(1),
        True,
    ),
    (
        "upserts-v2-has-no-tool-call",
        {"update_upserts": True},
        update({"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "t"}),
        ctx(2),
        False,
    ),
    (
        "upserts-or-kind",
        {"update_upserts": True, "update_kinds": ("plan_update",)},
        PLAN,
        ctx(),
        True,
    ),
    (
        "extension-kind",
        {"update_kinds": ("_acme_progress",)},
        update({"sessionUpdate": "_acme_progress"}),
        ctx(),
        True,
    ),
    (
        "all-conditions",
        {
            "direction": RuleDirection.AGENT_TO_CLIENT,
            "method": "session/update",
            "update_kinds": ("plan_update",),
        },
        PLAN,
        ctx(),
        True,
    ),
    (
        "all-conditions-wrong-direction",
        {
            "direction": RuleDirection.AGENT_TO_CLIENT,
            "method": "session/update",
            "update_kinds": ("plan_update",),
        },
        PLAN,
        ctx(2, C2A),
        False,
    ),
]


@pytest.mark.parametrize(
    ("match", "message", "context", "matches"),
    [row[1:] for row in MATCHING],
    ids=[row[0] for row in MATCHING],
)
def test_matching(
    match: dict[str, Any], message: JsonObject, context: MessageContext, matches: bool
) -> None:
    verdict, said = run([message_rule(**match)], message, context)
    if matches:
        assert verdict == Replace((tagged(message, {"example.dev/m": 1}),))
        assert said.by == ("r",)
    else:
        assert verdict is FORWARD
        assert said.by == ()


def test_unknown_version_forwards_untouched() -> None:
    verdict, said = run([message_rule()], PLAN, ctx(None))
    assert verdict is FORWARD
    assert said.by == ()


def test_a_verdict_names_only_its_own_message_s_rules() -> None:
    mw = RulesMiddleware([message_rule(method="session/update")])
    seen = [plain(mw(message, ctx()))[1].by for message in (PLAN, PROMPT)]
    assert seen == [("r",), ()]


# --- target: message ---------------------------------------------------------------------------

NOTIFY: JsonObject = {"jsonrpc": "2.0", "method": "x/y", "params": {"a": 1}}

EDITS: list[tuple[str, dict[str, Any], JsonObject, JsonObject | None]] = [
    ("absent-meta", {}, NOTIFY, tagged(NOTIFY, {"example.dev/m": 1})),
    ("null-meta", {}, tagged(NOTIFY, None), tagged(NOTIFY, {"example.dev/m": 1})),  # type: ignore[arg-type]
    (
        "keeps-other-keys",
        {},
        tagged(NOTIFY, {"other/k": [1]}),
        tagged(NOTIFY, {"other/k": [1], "example.dev/m": 1}),
    ),
    ("present-kept", {}, tagged(NOTIFY, {"example.dev/m": 2}), None),
    ("present-null-kept", {}, tagged(NOTIFY, {"example.dev/m": None}), None),
    (
        "present-overwritten",
        {"overwrite": True},
        tagged(NOTIFY, {"example.dev/m": 2}),
        tagged(NOTIFY, {"example.dev/m": 1}),
    ),
    ("overwrite-same-value", {"overwrite": True}, tagged(NOTIFY, {"example.dev/m": 1}), None),
    (
        "overwrite-true-is-not-1",
        {"overwrite": True},
        tagged(NOTIFY, {"example.dev/m": True}),
        tagged(NOTIFY, {"example.dev/m": 1}),
    ),
    (
        "overwrite-1.0-is-not-1",
        {"overwrite": True},
        tagged(NOTIFY, {"example.dev/m": 1.0}),
        tagged(NOTIFY, {"example.dev/m": 1}),
    ),
    (
        "overwrite-same-nested-value",
        {"overwrite": True, "set_meta": {"x/o": {"a": [1, {"b": None}]}}},
        tagged(NOTIFY, {"x/o": {"a": [1, {"b": None}]}}),
        None,
    ),
    (
        "overwrite-nested-true-is-not-1",
        {"overwrite": True, "set_meta": {"x/o": {"a": [1]}}},
        tagged(NOTIFY, {"x/o": {"a": [True]}}),
        tagged(NOTIFY, {"x/o": {"a": [1]}}),
    ),
    (
        "overwrite-longer-list",
        {"overwrite": True, "set_meta": {"x/o": [1]}},
        tagged(NOTIFY, {"x/o": [1, 2]}),
        tagged(NOTIFY, {"x/o": [1]}),
    ),
    ("meta-not-an-object", {}, tagged(NOTIFY, "text"), None),  # type: ignore[arg-type]
    ("no-params", {}, {"jsonrpc": "2.0", "method": "x/y"}, None),
    ("params-array", {}, {"jsonrpc": "2.0", "method": "x/y", "params": [1, 2]}, None),
    ("response", {}, RESPONSE, None),
    (
        "remove",
        {"set_meta": {}, "remove_meta": ("other/k",)},
        tagged(NOTIFY, {"other/k": 1, "x/y": 2}),
        tagged(NOTIFY, {"x/y": 2}),
    ),
    (
        "remove-last-key-keeps-object",
        {"set_meta": {}, "remove_meta": ("other/k",)},
        tagged(NOTIFY, {"other/k": 1}),
        tagged(NOTIFY, {}),
    ),
    ("remove-absent", {"set_meta": {}, "remove_meta": ("other/k",)}, NOTIFY, None),
    (
        "remove-from-null",
        {"set_meta": {}, "remove_meta": ("other/k",)},
        tagged(NOTIFY, None),  # type: ignore[arg-type]
        None,
    ),
    (
        "set-and-remove",
        {"remove_meta": ("other/k",)},
        tagged(NOTIFY, {"other/k": 1}),
        tagged(NOTIFY, {"example.dev/m": 1}),
    ),
]


@pytest.mark.parametrize(
    ("kw", "message", "expected"), [row[1:] for row in EDITS], ids=[row[0] for row in EDITS]
)
def test_message_target(
    kw: dict[str, Any], message: JsonObject, expected: JsonObject | None
) -> None:
    rule = Rule(**{"name": "r", "set_meta": TAG, "target": RuleTarget.MESSAGE, **kw})
    verdict, said = run([rule], message)
    if expected is None:
        assert verdict is FORWARD
    else:
        assert verdict == Replace((expected,))
        assert said.by == ("r",)


def test_message_target_copies_what_it_changes() -> None:
    message = tagged(NOTIFY, {"other/k": 1})
    rule = Rule(name="r", set_meta=TAG, target=RuleTarget.MESSAGE)
    edited = edit_params_meta(message, RulesMiddleware([rule])._compiled[0].annotation)
    assert edited == tagged(NOTIFY, {"other/k": 1, "example.dev/m": 1})
    old_params, new_params = message["params"], edited["params"]
    assert isinstance(old_params, dict) and isinstance(new_params, dict)
    assert new_params is not old_params
    assert new_params["_meta"] is not old_params["_meta"]
    assert old_params["_meta"] == {"other/k": 1}


def test_message_target_leaves_entity_meta_alone() -> None:
    message = tool_update(_meta={"a/b": 1})
    verdict, _ = run([message_rule()], message)
    assert verdict == Replace((tagged(message, {"example.dev/m": 1}),))


# --- rule order ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("second", "meta", "changed_by"),
    [
        ({"set_meta": {"example.dev/m": 2}}, {"example.dev/m": 1}, ("first",)),
        (
            {"set_meta": {"example.dev/m": 2}, "overwrite": True},
            {"example.dev/m": 2},
            ("first", "second"),
        ),
        (
            {"set_meta": {"example.dev/n": 2}},
            {"example.dev/m": 1, "example.dev/n": 2},
            ("first", "second"),
        ),
        ({"set_meta": {}, "remove_meta": ("example.dev/m",)}, {}, ("first", "second")),
    ],
    ids=["first-wins", "overwrite-second-wins", "both-apply", "second-removes"],
)
def test_rule_order(second: dict[str, Any], meta: JsonObject, changed_by: tuple[str, ...]) -> None:
    rules = [
        Rule(name="first", set_meta=TAG, target=RuleTarget.MESSAGE),
        Rule(**{"name": "second", "target": RuleTarget.MESSAGE, **second}),
    ]
    verdict, said = run(rules, NOTIFY)
    assert verdict == Replace((tagged(NOTIFY, meta),))
    assert said.by == changed_by


def test_only_matching_rules_apply_in_order() -> None:
    rules = [
        Rule(name="a", set_meta={"x/a": 1}, target=RuleTarget.MESSAGE, method="session/*"),
        Rule(name="b", set_meta={"x/b": 1}, target=RuleTarget.MESSAGE, method="fs/*"),
        Rule(name="c", set_meta={"x/c": 1}, target=RuleTarget.MESSAGE),
    ]
    verdict, said = run(rules, PLAN)
    assert verdict == Replace((tagged(PLAN, {"x/a": 1, "x/c": 1}),))
    assert said.by == ("a", "c")


# --- target: entity (through annotate_message) --------------------------------------------------

EDGE = Rule(
    name="edge",
    set_meta={"example.dev/route": "edge"},
    remove_meta=("zed.dev/debugMode",),
    update_upserts=True,
)


def test_entity_v2_meta_omitted_becomes_a_patch() -> None:
    message = tool_update(status="completed")
    verdict, said = run([EDGE], message)
    expected = tool_update(
        status="completed", _meta={"example.dev/route": "edge", "zed.dev/debugMode": None}
    )
    assert verdict == Replace((expected,))
    assert said.by == ("edge",)
    validate_v2_message(expected)


def test_entity_v2_meta_object_keeps_the_agents_keys() -> None:
    message = tool_update(_meta={"agent.dev/k": 1, "example.dev/route": "agent"})
    verdict, _ = run([EDGE], message)
    expected = tool_update(
        _meta={"agent.dev/k": 1, "example.dev/route": "agent", "zed.dev/debugMode": None}
    )
    assert verdict == Replace((expected,))


def test_entity_overwrite() -> None:
    rule = Rule(name="r", set_meta={"example.dev/route": "edge"}, overwrite=True)
    verdict, _ = run([rule], tool_update(_meta={"example.dev/route": "agent"}))
    assert verdict == Replace((tool_update(_meta={"example.dev/route": "edge"}),))


def test_entity_already_satisfied_is_forwarded() -> None:
    message = tool_update(_meta={"example.dev/route": "edge", "zed.dev/debugMode": None})
    verdict, said = run([EDGE], message)
    assert verdict is FORWARD
    assert said.by == ()


def test_entity_rule_on_a_non_upsert_is_forwarded() -> None:
    verdict, _ = run([Rule(name="r", set_meta=TAG)], PLAN)
    assert verdict is FORWARD


def test_entity_v2_clear_survives_and_later_rules_join_the_follow_up() -> None:
    message = tool_update(status="failed", _meta=None)
    rules = [
        Rule(name="one", set_meta={"example.dev/a": 1}),
        Rule(name="two", set_meta={"example.dev/b": 2}),
        Rule(name="trace", set_meta={"traceparent": "00-x-01"}, target=RuleTarget.MESSAGE),
    ]
    verdict, said = run(rules, message)
    follow_up = update(
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "c1",
            "_meta": {"example.dev/a": 1, "example.dev/b": 2},
        }
    )
    assert verdict == Replace(
        (tagged(message, {"traceparent": "00-x-01"}), tagged(follow_up, {"traceparent": "00-x-01"}))
    )
    assert said.by == ("one", "two", "trace")
    assert isinstance(verdict, Replace)
    for out in verdict.messages:
        validate_v2_message(out)


def test_entity_permission_request_tool_call() -> None:
    verdict, _ = run(
        [Rule(name="r", set_meta={"example.dev/a": 1}, update_upserts=True)], PERMISSION_TOOL
    )
    assert isinstance(verdict, Replace)
    (out,) = verdict.messages
    params = out["params"]
    assert isinstance(params, dict)
    assert params["subject"] == {
        "type": "tool_call",
        "toolCall": {"toolCallId": "c1", "title": "Run", "_meta": {"example.dev/a": 1}},
    }


V1_UPDATE_NO_META = tool_update(status="completed")
V1_TOOL_CALL = update({"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "Read"})


def test_v1_safe_mode_skips_updates_without_meta() -> None:
    verdict, said = run([EDGE], V1_UPDATE_NO_META, ctx(1))
    assert verdict is FORWARD
    assert said.by == ()
    assert said.skipped == ("edge",)


def test_v1_safe_mode_annotates_an_update_carrying_meta() -> None:
    message = tool_update(_meta={"agent.dev/k": 1, "zed.dev/debugMode": True})
    verdict, said = run([EDGE], message, ctx(1))
    # v1 replaces the whole object: the removal is an absent key, not a null.
    expected = tool_update(_meta={"agent.dev/k": 1, "example.dev/route": "edge"})
    assert verdict == Replace((expected,))
    assert said.skipped == ()
    validate_v1_message(expected)


def test_v1_safe_mode_annotates_the_creating_tool_call() -> None:
    verdict, _ = run([EDGE], V1_TOOL_CALL, ctx(1))
    expected = update(
        {
            "sessionUpdate": "tool_call",
            "toolCallId": "c1",
            "title": "Read",
            "_meta": {"example.dev/route": "edge"},
        }
    )
    assert verdict == Replace((expected,))
    validate_v1_message(expected)


def test_v1_off_never_annotates() -> None:
    verdict, said = run([EDGE], V1_TOOL_CALL, ctx(1), v1_mode=V1Mode.OFF)
    assert verdict is FORWARD
    assert said.skipped == ()


def test_v1_stateful_follows_unmatched_upserts() -> None:
    # The rule only matches tool_call_update, yet the middleware must see the creating
    # tool_call (its needles list the v1 upsert kinds) to send complete objects later.
    rule = Rule(name="r", set_meta={"example.dev/a": 1}, update_kinds=("tool_call_update",))
    mw = RulesMiddleware([rule], v1_mode=V1Mode.STATEFUL, v1_max_entities=4)
    assert mw.needles is not None and b'"tool_call"' in mw.needles
    created = update(
        {
            "sessionUpdate": "tool_call",
            "toolCallId": "c1",
            "title": "t",
            "_meta": {"agent.dev/k": 1},
        }
    )
    assert mw(created, ctx(1)) is FORWARD
    assert plain(mw(V1_UPDATE_NO_META, ctx(1)))[0] == Replace(
        (tool_update(status="completed", _meta={"agent.dev/k": 1, "example.dev/a": 1}),)
    )
    assert mw.v1_store is not None and len(mw.v1_store) == 1
    # Per connection: a new middleware knows nothing and skips.
    other = RulesMiddleware([rule], v1_mode=V1Mode.STATEFUL)
    assert other(V1_UPDATE_NO_META, ctx(1)) == Forward(skipped=("r",))


def test_v1_stateful_ignores_client_to_agent_traffic() -> None:
    mw = RulesMiddleware([message_rule(method="x/*")], v1_mode=V1Mode.STATEFUL)
    assert mw(V1_TOOL_CALL, ctx(1, C2A)) is FORWARD
    assert mw.v1_store is not None and len(mw.v1_store) == 0
    assert mw(V1_TOOL_CALL, ctx(1, A2C)) is FORWARD
    assert len(mw.v1_store) == 1


# --- needles ------------------------------------------------------------------------------------

UPSERT_NEEDLES = (
    b'"agent_message"',
    b'"agent_thought"',
    b'"compaction_update"',
    b'"session_info_update"',
    b'"session_message"',
    b'"subagent_update"',
    b'"terminal_update"',
    b'"tool_call"',
    b'"tool_call_update"',
    b'"user_message"',
    b'"session/request_permission"',
)


@pytest.mark.parametrize(
    ("rules", "needles"),
    [
        ([], ()),
        ([message_rule()], None),
        ([message_rule(method="session/update")], (b'"session/update"',)),
        ([message_rule(method="session/*")], (b'"session/',)),
        ([message_rule(method="*/update")], None),
        ([message_rule(method="?ession/update")], None),
        (
            [message_rule(update_kinds=("plan_update", "agent_message_chunk"))],
            (b'"plan_update"', b'"agent_message_chunk"'),
        ),
        ([message_rule(update_upserts=True)], UPSERT_NEEDLES),
        (
            [
                message_rule(method="session/update"),
                message_rule(method="session/request_permission"),
                message_rule(method="session/update"),
            ],
            (b'"session/update"', b'"session/request_permission"'),
        ),
        ([message_rule(method="session/update"), message_rule()], None),
        ([message_rule(method="caf\u00e9/x")], ('"caf\u00e9/x"'.encode(),)),
    ],
    ids=[
        "no-rules",
        "any-method",
        "exact",
        "glob-prefix",
        "glob-no-prefix",
        "glob-leading-wildcard",
        "kinds",
        "upserts",
        "union",
        "one-rule-any",
        "utf8",
    ],
)
def test_needles(rules: list[Rule], needles: tuple[bytes, ...] | None) -> None:
    assert rules_needles(rules) == needles
    assert RulesMiddleware(rules).needles == needles


def test_needles_let_the_chain_skip_frames() -> None:
    # cast: chain.Middleware declares ``name`` settable; RulesMiddleware has a read-only property.
    mw = cast(Middleware, RulesMiddleware([message_rule(method="session/update")]))
    chain = Chain([Link(mw)])
    assert chain.wants(b'{"jsonrpc":"2.0","method":"session/update","params":{}}')
    assert not chain.wants(b'{"jsonrpc":"2.0","method":"session/prompt","params":{}}')
    assert chain.wants(b'{"jsonrpc":"2.0","method":"session\\/update","params":{}}')


def test_stateful_needles_add_v1_upserts() -> None:
    mw = RulesMiddleware([message_rule(method="x/y")], v1_mode=V1Mode.STATEFUL)
    assert mw.needles == (
        b'"x/y"',
        b'"compaction_update"',
        b'"session_info_update"',
        b'"session_message"',
        b'"subagent_update"',
        b'"tool_call"',
        b'"tool_call_update"',
        b'"session/request_permission"',
    )


def _schema_kinds(version: int) -> set[str]:
    """Every ``sessionUpdate`` const in the official schema of ``version``."""
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                tag = props.get("sessionUpdate")
                if isinstance(tag, dict) and isinstance(tag.get("const"), str):
                    found.add(tag["const"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema_defs(version))
    return found


def test_known_update_kinds_match_the_schemas() -> None:
    assert _schema_kinds(1) | _schema_kinds(2) == KNOWN_UPDATE_KINDS
