"""The policy seen from outside its link, in process: what the metrics count and the live view
shows of its decisions, ``on_unasked: cancel`` on the wire (v1 and v2), and the frames it does
not concern, which keep the pipeline's fast paths (the round trip's lane, the unparsed
pass-through, the fused annotation path) and their exact bytes."""

from __future__ import annotations

import dataclasses
import functools
from itertools import groupby
from operator import itemgetter
from typing import Any, cast

import orjson
import pytest
from acp_schema import validate_v1, validate_v2

from acp_proxy.config import Config, MiddlewareSpec, parse_config
from acp_proxy.policy.policy_link import NAME, AuditEntry, PolicyMiddleware
from acp_proxy.rules.engine import RulesMiddleware
from acp_proxy.shell.ui.hub import UiHub
from acp_proxy.shell.ui.tap import UiTap
from acp_proxy.telemetry import labels
from acp_proxy.telemetry.metrics import Metrics, SessionMetrics, SessionView
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.connection.pipeline import AS_CAME, Connection, Result
from acp_proxy.wire.framing import Block, Line

C2A, A2C = Direction.CLIENT_TO_AGENT, Direction.AGENT_TO_CLIENT
POLICY = """\
policy:
  forbid_modes: [bypassPermissions]
  on_unasked: {on_unasked}
  mode: {mode}
  rules:
    - {{name: no-rm, match: {{kind: execute, command: ["rm", "-rf"]}}, decision: deny}}
    - {{name: reads, match: {{kind: read, paths: ["{{cwd}}/**"]}}, decision: allow}}
    - {{name: no-env, match: {{paths: ["**/.env"]}}, decision: deny}}
"""
ANNOTATE = """\
rules:
  - name: edge-route
    match: {direction: agent_to_client, method: session/update, update: [tool_call_update]}
    set_meta: {example.dev/route: edge}
"""
OPTIONS = [
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]


def config(text: str, sink: list[AuditEntry] | None = None) -> Config:
    """``text`` loaded, with the policy link first in the chain (paths resolved as they are)."""
    loaded = parse_config(text, "p.yaml", {"HOME": "/home/u"})
    if loaded.policy is None:
        return loaded
    factory = functools.partial(
        PolicyMiddleware, loaded.policy, None if sink is None else sink.append, lambda p: p
    )
    return dataclasses.replace(
        loaded, middleware=(MiddlewareSpec(NAME, factory), *loaded.middleware)
    )


def frame(message: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", **message})


def opened(conn: Connection, version: int) -> list[Result]:
    """The initialize exchange and a session (``sess_1``, cwd ``/w/p``) on ``conn``."""
    info = {"name": "claude-code", "version": "1"}
    result: dict[str, Any] = {"protocolVersion": version}
    result.update({"agentInfo": info} if version == 1 else {"info": info})
    init = {"protocolVersion": version, "clientCapabilities": {}}
    return [
        conn.handle(C2A, Line(frame({"id": 0, "method": "initialize", "params": init}))),
        conn.handle(A2C, Line(frame({"id": 0, "result": result}))),
        conn.handle(
            C2A, Line(frame({"id": 1, "method": "session/new", "params": {"cwd": "/w/p"}}))
        ),
        conn.handle(A2C, Line(frame({"id": 1, "result": {"sessionId": "sess_1"}}))),
    ]


def update(session_update: str, **fields: Any) -> bytes:
    body = {"sessionUpdate": session_update, **fields}
    return frame({"method": "session/update", "params": {"sessionId": "sess_1", "update": body}})


def permission(rid: int, call: dict[str, Any]) -> bytes:
    params = {"sessionId": "sess_1", "toolCall": call, "options": OPTIONS}
    return frame({"id": rid, "method": "session/request_permission", "params": params})


# The v1 frames of a session, and what the policy makes of each.
DECIDED = [
    (
        A2C,
        update(
            "tool_call",
            toolCallId="t1",
            title="rm",
            kind="execute",
            status="pending",
            rawInput={"command": "rm -rf build"},
        ),
    ),
    (A2C, permission(10, {"toolCallId": "t1"})),  # deny, answered
    (
        A2C,
        frame(
            {
                "id": 11,
                "method": "fs/read_text_file",
                "params": {"sessionId": "sess_1", "path": "/w/p/.env"},
            }
        ),
    ),
    (
        A2C,
        frame(
            {
                "id": 12,
                "method": "fs/read_text_file",
                "params": {"sessionId": "sess_1", "path": "/w/p/a.py"},
            }
        ),
    ),
    (A2C, permission(13, {"toolCallId": "e1", "kind": "edit"})),  # no rule: ask
    (
        C2A,
        frame(
            {
                "id": 14,
                "method": "session/set_mode",
                "params": {"sessionId": "sess_1", "modeId": "bypassPermissions"},
            }
        ),
    ),
    (
        A2C,
        update(
            "tool_call",
            toolCallId="t2",
            kind="execute",
            status="in_progress",
            rawInput={"command": ["rm", "-rf", "/"]},
        ),
    ),
]


class _Session:
    """What ``SessionMetrics`` reads of a session (nothing, until it ends)."""


def observed(text: str, watch: bool = False, blocks: bool = False) -> tuple[Metrics, UiHub, int]:
    """``DECIDED`` through an observing connection (``watch``: a watching one, as a session
    with the live view alone has), told to the metrics and the live view (``blocks``: the
    frames of each direction in a row read as one block)."""
    conn = Connection(config(text).build_chain(), observe=not watch, watch=watch)
    metrics = Metrics(max_pending=100)
    watcher = SessionMetrics(metrics, cast(SessionView, _Session()))
    hub = UiHub()
    conn_id = hub.open_session({"acp-proxy-record": 1})
    tap = UiTap(hub, conn_id)
    for result in opened(conn, 1):
        watcher.on_notes(result.notes, 1.0)
        tap.on_notes(result.notes, tap.start)
    reads = (
        [
            (side, [Block(b"\n".join(raw for _, raw in run))])
            for side, run in groupby(DECIDED, itemgetter(0))
        ]
        if blocks
        else [(side, [Line(raw)]) for side, raw in DECIDED]
    )
    for side, events in reads:
        notes = conn.handle_many(side, events, join=True).notes
        watcher.on_notes(notes, 2.0)
        tap.on_notes(notes, tap.start + 2.0)
    hub.drain()
    return metrics, hub, conn_id


def test_metrics_count_decisions_by_rule_and_outcome_and_unasked_calls() -> None:
    metrics, _, _ = observed(POLICY.format(on_unasked="audit", mode="enforce"))
    assert metrics.observer_errors == 0
    assert metrics.policy.decisions == {
        ("no-rm", "deny", "answered"): 1,
        ("no-env", "deny", "refused"): 1,
        ("reads", "allow", "forwarded"): 1,
        ("default", "ask", "forwarded"): 1,
        ("forbid_modes", "deny", "refused"): 1,
    }
    assert metrics.policy.unasked == {("no-rm", "audited"): 1}
    # The answered permission request is no user's wait: its own outcome, no time. The one
    # forwarded to the editor is still waiting for its answer.
    waits = metrics.turns.permissions
    assert {k: (h.count, h.total) for k, h in waits.items()} == {("policy",): (1, 0.0)}


def test_in_monitor_mode_nothing_is_answered_and_the_waits_are_the_users() -> None:
    metrics, _, _ = observed(POLICY.format(on_unasked="cancel", mode="monitor"))
    assert metrics.policy.decisions == {
        ("no-rm", "deny", "forwarded"): 1,
        ("no-env", "deny", "forwarded"): 1,
        ("reads", "allow", "forwarded"): 1,
        ("default", "ask", "forwarded"): 1,
        ("forbid_modes", "deny", "forwarded"): 1,
    }
    assert metrics.policy.unasked == {("no-rm", "audited"): 1}  # monitor never cancels
    assert metrics.turns.permissions == {}


def test_rule_labels_are_bounded() -> None:
    seen: set[str] = set()
    names = [f"r{i}" for i in range(labels.MAX_RULES + 5)]
    got = [labels.rule_label(n, seen) for n in names]
    assert got[: labels.MAX_RULES] == names[: labels.MAX_RULES]
    assert got[labels.MAX_RULES :] == [labels.OTHER] * 5
    assert labels.rule_label("r0", seen) == "r0"  # a name already given keeps its label
    assert labels.rule_label(None, seen) == "default"


def test_the_live_view_marks_each_decision_on_its_frame() -> None:
    _, hub, conn_id = observed(POLICY.format(on_unasked="cancel", mode="enforce"))
    events: list[dict[str, Any]] = list(hub.events(conn_id))
    marked = [
        (e["info"].get("method"), e["info"].get("update"), e["policy"])
        for e in events
        if "policy" in e
    ]
    deny = {"decision": "deny", "forwarded": False, "mode": "enforce"}
    assert marked == [
        ("session/request_permission", None, [{"rule": "no-rm", **deny, "option": "reject"}]),
        ("fs/read_text_file", None, [{"rule": "no-env", **deny, "option": None}]),
        (
            "fs/read_text_file",
            None,
            [
                {
                    "rule": "reads",
                    "decision": "allow",
                    "option": None,
                    "forwarded": True,
                    "mode": "enforce",
                }
            ],
        ),
        (
            "session/request_permission",
            None,
            [
                {
                    "rule": None,
                    "decision": "ask",
                    "option": None,
                    "forwarded": True,
                    "mode": "enforce",
                }
            ],
        ),
        ("session/set_mode", None, [{"rule": "forbid_modes", **deny, "option": None}]),
        (
            "session/update",
            "tool_call",
            [
                {
                    "rule": "no-rm",
                    "decision": "deny",
                    "option": None,
                    "forwarded": True,
                    "mode": "enforce",
                    "unasked": True,
                    "cancelled": True,
                }
            ],
        ),
    ]
    # The cancel the proxy sent for it is on the timeline too, as a frame it wrote.
    generated = [e for e in events if e.get("generated")]
    assert generated[-1]["raw"] == (
        '{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"sess_1"}}'
    )


CANCEL = b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"sess_1"}}'


@pytest.mark.parametrize("version", [1, 2])
def test_on_unasked_cancel_sends_session_cancel_to_the_agent(version: int) -> None:
    audit: list[AuditEntry] = []
    text = POLICY.format(on_unasked="cancel", mode="enforce")
    conn = Connection(config(text, audit).build_chain())
    opened(conn, version)
    kind = "tool_call" if version == 1 else "tool_call_update"
    ran = update(
        kind,
        toolCallId="c1",
        title="rm",
        kind="execute",
        status="pending",
        rawInput={"command": "rm -rf /"},
    )
    done = update("tool_call_update", toolCallId="c1", status="completed")
    validate = validate_v1 if version == 1 else validate_v2
    for raw in (ran, done):
        validate(
            "SessionNotification" if version == 1 else "UpdateSessionNotification",
            orjson.loads(raw)["params"],
        )
    first = conn.handle(A2C, Line(ran))
    assert ([f.raw for f in first.forward], first.reply) == ([ran], ())  # pending: not run yet
    second = conn.handle(A2C, Line(done))
    # The update goes on to the client as it came; the agent gets the cancel, once.
    assert [f.raw for f in second.forward] == [done]
    assert [f.raw for f in second.reply] == [CANCEL]
    validate(
        "CancelNotification" if version == 1 else "CancelSessionNotification",
        orjson.loads(CANCEL)["params"],
    )
    again = conn.handle(A2C, Line(done))
    assert again.reply == ()
    assert [(a.method, a.rule, a.decision, a.cancelled) for a in audit] == [
        ("session/update", "no-rm", "deny", True)
    ]


def test_in_monitor_mode_on_unasked_cancel_only_audits() -> None:
    audit: list[AuditEntry] = []
    conn = Connection(
        config(POLICY.format(on_unasked="cancel", mode="monitor"), audit).build_chain()
    )
    opened(conn, 1)
    ran = update(
        "tool_call",
        toolCallId="c1",
        title="rm",
        kind="execute",
        status="completed",
        rawInput={"command": "rm -rf /"},
    )
    result = conn.handle(A2C, Line(ran))
    assert ([f.raw for f in result.forward], result.reply) == ([ran], ())
    assert [(a.rule, a.cancelled, a.mode) for a in audit] == [("no-rm", False, "monitor")]


# -- the frames the policy does not concern ------------------------------------------------

FS_ONLY = """\
policy:
  rules:
    - {name: no-env, match: {method: "fs/*", paths: ["**/.env"]}, decision: deny}
"""


def test_requests_reach_the_policy_by_method_and_other_frames_take_the_fast_paths() -> None:
    conn = Connection(config(FS_ONLY).build_chain())
    opened(conn, 1)
    # The round trip's lane: a request and a response no link concerns go on as they came
    # (``AS_CAME``), tracked.
    prompt = frame({"id": 5, "method": "session/prompt", "params": {"sessionId": "sess_1"}})
    assert conn.handle_line(C2A, prompt) is AS_CAME
    assert conn.pending_client_requests == 1
    assert conn.handle_line(A2C, frame({"id": 5, "result": {"stopReason": "end_turn"}})) is AS_CAME
    assert conn.pending_client_requests == 0
    # A notification is not even looked at: no link has a needle (no rule decides a
    # permission request, so tool calls are not read).
    chunk = update("tool_call", toolCallId="x", kind="execute", status="completed")
    assert conn._state.interested(chunk) is None
    assert conn._state.needles_on is False
    # A request the policy decides reaches it by its method, whatever its bytes say.
    escaped = rb'{"jsonrpc":"2.0","id":6,"method":"fs\/read_text_file","params":'
    escaped += rb'{"sessionId":"sess_1","path":"/w/p/.env"}}'
    refused = conn.handle_line(A2C, escaped)
    assert refused is not AS_CAME
    assert orjson.loads(refused.reply[0].raw)["error"]["code"] == -32001


def _stream(version: int) -> list[bytes]:
    kind = "tool_call" if version == 1 else "tool_call_update"
    return [
        update(
            "agent_message_chunk",
            content={"type": "text", "text": "hi"},
            **({"messageId": "m"} if version == 2 else {}),
        ),
        update(
            kind,
            toolCallId="c1",
            title="Read",
            kind="read",
            status="pending",
            locations=[{"path": "/w/p/a.py"}],
        ),
        update("tool_call_update", toolCallId="c1", status="in_progress"),
        frame({"id": 7, "method": "session/prompt", "params": {"sessionId": "sess_1"}}),
        update("tool_call_update", toolCallId="c1", status="completed", _meta={"x.dev/a": 1}),
    ]


@pytest.mark.parametrize("policy", ["", FS_ONLY, POLICY.format(on_unasked="audit", mode="enforce")])
@pytest.mark.parametrize("version", [1, 2])
def test_frames_no_rule_concerns_leave_as_without_a_policy(
    policy: str, version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The annotation rule beside a policy: the same bytes out as without one, and in v2 the
    fused path annotates (the rules link is never run as a chain link), also the tool call
    updates the policy reads (it reads them first)."""
    chained: list[object] = []
    run_as_link = RulesMiddleware.__call__

    def counted(self: RulesMiddleware, message: Any, ctx: Any) -> Any:
        chained.append(message)
        return run_as_link(self, message, ctx)

    monkeypatch.setattr(RulesMiddleware, "__call__", counted)
    outputs = []
    for text in (ANNOTATE, ANNOTATE + policy):
        conn = Connection(config(text).build_chain())
        opened(conn, version)
        out = []
        for raw in _stream(version):
            direction = C2A if b'"session/prompt"' in raw else A2C
            result = conn.handle_many(direction, [Line(raw)])
            out.append([f.raw for f in result.forward])
        outputs.append(out)
        if version == 2:
            assert conn._state.fused is not None  # beside the policy too
            assert chained == []
    assert outputs[0] == outputs[1]
    if version == 2:  # (in v1 the rule leaves a tool call update alone: not safe there)
        assert b'"example.dev/route":"edge"' in outputs[0][2][0]  # the rule did annotate


def test_the_live_view_shows_the_decisions_the_same_when_its_session_only_watches() -> None:
    text = POLICY.format(on_unasked="cancel", mode="enforce")
    _, observing, conn_id = observed(text)
    _, watching, _ = observed(text, watch=True)
    shown = [e for e in observing.events(conn_id) if "policy" in e]
    assert len(shown) > 3
    assert list(watching.events(conn_id)) == list(observing.events(conn_id))


def test_the_live_view_shows_a_block_read_beside_the_policy_as_its_lines_read_apart() -> None:
    """A block's notifications that only the policy reads take the read lane: watched, they are
    shown in their place, as the per-line path shows them."""
    text = POLICY.format(on_unasked="cancel", mode="enforce")
    _, observing, conn_id = observed(text)
    _, watching, _ = observed(text, watch=True, blocks=True)
    assert list(watching.events(conn_id)) == list(observing.events(conn_id))


def test_a_call_that_ran_unasked_is_summarised_only_when_a_deny_rule_may_match_it() -> None:
    """No deny rule for its kind: no summary, no path resolved (``realpath`` costs syscalls)."""
    text = """\
policy:
  rules:
    - {name: reads, match: {kind: read}, decision: allow}
    - {name: no-etc, match: {kind: edit, paths: ["/etc/**"]}, decision: deny}
"""
    loaded = parse_config(text, "p.yaml", {"HOME": "/home/u"})
    assert loaded.policy is not None
    resolved: list[str] = []

    def resolve(path: str) -> str:
        resolved.append(path)
        return path

    audit: list[AuditEntry] = []
    factory = functools.partial(PolicyMiddleware, loaded.policy, audit.append, resolve)
    chained = dataclasses.replace(loaded, middleware=(MiddlewareSpec(NAME, factory),))
    conn = Connection(chained.build_chain())
    opened(conn, 1)
    resolved.clear()  # (the session's cwd)
    read = update(
        "tool_call",
        toolCallId="r",
        title="Read",
        kind="read",
        status="completed",
        locations=[{"path": "/etc/hosts"}],
    )
    edit = update(
        "tool_call",
        toolCallId="e",
        title="Edit",
        kind="edit",
        status="completed",
        locations=[{"path": "/etc/hosts"}],
    )
    conn.handle(A2C, Line(read))
    assert (resolved, audit) == ([], [])
    conn.handle(A2C, Line(edit))
    assert resolved == ["/etc/hosts"]
    assert [(a.method, a.rule) for a in audit] == [("session/update", "no-etc")]


def test_in_a_block_the_policy_reads_the_lines_in_order() -> None:
    """A tool call, the permission request about it and its update read together (one block):
    the request is decided before the update is read, so the call is not taken for one that
    ran unasked."""
    audit: list[AuditEntry] = []
    conn = Connection(
        config(POLICY.format(on_unasked="cancel", mode="enforce"), audit).build_chain()
    )
    opened(conn, 1)
    lines = [
        update(
            "tool_call",
            toolCallId="b1",
            title="rm",
            kind="execute",
            status="pending",
            rawInput={"command": "rm -rf x"},
        ),
        permission(30, {"toolCallId": "b1"}),
        update("tool_call_update", toolCallId="b1", status="completed"),
        update("agent_message_chunk", content={"type": "text", "text": "done"}),
    ]
    result = conn.handle_many(A2C, [Block(b"\n".join(lines))], join=True)
    assert [(a.method, a.rule) for a in audit] == [("session/request_permission", "no-rm")]
    assert [f.raw for f in result.reply] == [
        b'{"jsonrpc":"2.0","id":30,"result":{"outcome":{"outcome":"selected","optionId":"reject"}}}'
    ]
    assert b"\n".join(f.raw for f in result.forward) == b"\n".join([lines[0], lines[2], lines[3]])
