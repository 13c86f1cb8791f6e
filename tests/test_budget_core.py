"""The pure budgets core: the section's errors, the ledger's rules, the meters, and the link's
refusals, cancellations and notices, driven message by message on a fake clock."""

from __future__ import annotations

import math
from typing import Any

import pytest
from acp_schema import validate_v1, validate_v1_message, validate_v2, validate_v2_message
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.budget.ledger import PROCESS_KEY, Ledger, StateError, is_crossed, key_of
from acp_proxy.budget.meters import Meters, Spend
from acp_proxy.budget.middleware import NOTICE_META, BudgetEvent, BudgetMiddleware
from acp_proxy.budget.model import Action, Budgets, Limit, Meter, Per
from acp_proxy.budget.parse import duration_seconds
from acp_proxy.config import ConfigError, parse_config
from acp_proxy.wire.chain import FORWARD, Direction, MessageContext, Replace, Reply
from acp_proxy.wire.errors import QUOTA_EXCEEDED

C2A = Direction.CLIENT_TO_AGENT
A2C = Direction.AGENT_TO_CLIENT


def J(value: object) -> Any:
    """A JSON value read in a test (mypy: any shape)."""
    return value


def budgets(text: str) -> Budgets:
    config = parse_config(text, "/cfg/b.yaml", {"TEAM": "blue"})
    assert config.budgets is not None
    return config.budgets


def error_lines(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "/cfg/b.yaml", {})
    return info.value.messages()


# -- the section ----------------------------------------------------------------------------


def test_the_section_as_the_contract_writes_it() -> None:
    got = budgets(
        "budgets:\n"
        "  state: budgets.json\n"
        "  limits:\n"
        "    - name: session-cost\n"
        "      per: session\n"
        "      meter: cost\n"
        "      max: 5.00\n"
        "      window: P1D\n"
        "      warn_at: [0.95, 0.8]\n"
        "      action: refuse_next_prompt\n"
        "    - name: loop-guard\n"
        "      meter: repeated_tool_call\n"
        "      max: 5\n"
        "      action: cancel_turn\n"
        "    - name: team\n"
        "      per: label\n"
        "      label: ${TEAM}\n"
        "      meter: tokens\n"
        "      max: 1000\n"
    )
    assert got == Budgets(
        "/cfg/budgets.json",
        (
            Limit("session-cost", Meter.COST, 5.0, Per.SESSION, 86400.0, "P1D", (0.8, 0.95)),
            Limit("loop-guard", Meter.REPEATED_TOOL_CALL, 5.0, action=Action.CANCEL_TURN),
            Limit("team", Meter.TOKENS, 1000.0, Per.LABEL, label="blue"),
        ),
    )
    assert [limit.line for limit in got.limits] == [4, 11, 15]


def test_the_state_file_defaults_to_budgets_json_beside_the_config() -> None:
    assert budgets("budgets:\n  limits: []\n").state == "/cfg/budgets.json"
    assert budgets("budgets:\n  state: /var/b.json\n").state == "/var/b.json"


def test_every_mistake_is_named_with_its_line_and_path() -> None:
    assert error_lines(
        "budgets:\n"
        "  state: 3\n"
        "  limits:\n"
        "    - name: a\n"
        "      meter: costs\n"
        "      max: -1\n"
        "      window: P1M\n"
        "      warn_at: [0.8, 1.5]\n"
        "    - name: b\n"
        "      meter: turns\n"
        "      max: 3\n"
        "      per: label\n"
        "    - {name: c, meter: turns, max: 1, label: x}\n"
        "    - {name: d, meter: turns, max: 1, per: label, label: '${NOPE:-}'}\n"
        "    - {name: e, meter: turns}\n"
        "    - {name: f, meter: turns, max: 1, shape: round}\n"
        "    - {name: f, meter: turns, max: 2}\n"
        "    - {name: f, meter: turns, max: 2}\n"
    ) == [
        "/cfg/b.yaml:2: budgets.state: expected a file path, got an integer (3); quote it",
        '/cfg/b.yaml:5: budgets.limits[0].meter: expected one of "cost", "tokens", "turns", '
        '"tool_calls", "turn_seconds", "repeated_tool_call", got "costs"; did you mean "cost"?',
        "/cfg/b.yaml:6: budgets.limits[0].max: expected a number >= 0, got -1",
        "/cfg/b.yaml:7: budgets.limits[0].window: expected an ISO 8601 duration of weeks, "
        'days, hours, minutes or seconds such as "P1D", "PT12H" or "P1W" (months and years '
        "have no fixed length: use days), got 'P1M'",
        "/cfg/b.yaml:8: budgets.limits[0].warn_at[1]: expected a fraction of max between 0 "
        "and 1, got 1.5",
        '/cfg/b.yaml:9: budgets.limits[1]: a "per: label" limit needs "label:" (e.g. "${TEAM}")',
        '/cfg/b.yaml:13: budgets.limits[2].label: only a "per: label" limit has one',
        "/cfg/b.yaml:14: budgets.limits[3].label: is empty (is its ${VARIABLE} set?)",
        '/cfg/b.yaml:15: budgets.limits[4]: a limit needs "max:" (a maximum)',
        '/cfg/b.yaml:16: budgets.limits[5].shape: unknown key "shape". Valid keys: name, per, '
        "meter, max, window, warn_at, action, label",
        '/cfg/b.yaml:18: budgets.limits[7].name: duplicate limit name "f" (also budgets.limits[6])',
    ]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("P1D", 86400.0),
        ("PT12H", 43200.0),
        ("P1W", 604800.0),
        ("P1DT6H", 108000.0),
        ("PT90M", 5400.0),
        ("PT1.5S", 1.5),
        ("P", None),
        ("PT", None),
        ("P0D", None),
        ("P1M", None),
        ("P1Y", None),
        ("1D", None),
        ("P1DT", None),
    ],
)
def test_durations(text: str, seconds: float | None) -> None:
    assert duration_seconds(text) == seconds


# -- the ledger -----------------------------------------------------------------------------

COST = Limit("cost", Meter.COST, 5.0, warn_at=(0.8, 0.95))
TURNS = Limit("turns", Meter.TURNS, 2.0)
LOOP = Limit("loop", Meter.REPEATED_TOOL_CALL, 5.0, action=Action.CANCEL_TURN)
DAILY = Limit("daily", Meter.COST, 1.0, Per.PROCESS, window=86400.0, window_text="P1D")


def test_keys_per_session_process_and_label() -> None:
    assert key_of(COST, "s1") == "s1"
    assert key_of(DAILY, "s1") == PROCESS_KEY
    assert key_of(Limit("t", Meter.COST, 1, Per.LABEL, label="blue"), "s1") == "label:blue"


def test_crossed_means_past_max_and_for_turns_max_reached() -> None:
    assert not is_crossed(Meter.COST, 5.0, 5.0)
    assert is_crossed(Meter.COST, 5.01, 5.0)
    assert is_crossed(Meter.TURNS, 2.0, 2.0)
    assert not is_crossed(Meter.TURNS, 1.0, 2.0)
    assert not is_crossed(Meter.REPEATED_TOOL_CALL, 5.0, 5.0)
    assert is_crossed(Meter.REPEATED_TOOL_CALL, 6.0, 5.0)


def test_warnings_then_the_limit_each_once() -> None:
    ledger = Ledger((COST,))
    assert ledger.add(COST, "s", 3.9, 0) == []
    got = ledger.add(COST, "s", 0.2, 1)
    assert [(c.fraction, c.spent) for c in got] == [(0.8, J(pytest.approx(4.1)))]
    assert [c.fraction for c in ledger.add(COST, "s", 2.0, 2)] == [0.95, None]
    assert ledger.add(COST, "s", 1.0, 3) == []
    status = ledger.status(COST, "s", 3)
    assert status.crossed and status.remaining == 0.0 and status.spent == pytest.approx(7.1)
    assert not ledger.status(COST, "other", 3).crossed


def test_an_override_raises_the_max_and_the_limit_is_no_longer_crossed() -> None:
    ledger = Ledger((COST,))
    ledger.add(COST, "s", 6.0, 0)
    assert ledger.status(COST, "s", 0).crossed
    ledger.absorb({"version": 1, "overrides": {"cost": 10}}, 1)
    status = ledger.status(COST, "s", 1)
    assert (status.crossed, status.max, status.remaining) == (False, 10.0, 4.0)


def test_a_window_starts_at_its_first_spend_and_resets_after_it() -> None:
    ledger = Ledger((DAILY,))
    ledger.add(DAILY, PROCESS_KEY, 2.0, 1000.0)
    status = ledger.status(DAILY, PROCESS_KEY, 1000.0 + 86399)
    assert status.crossed and status.resets_at == 1000.0 + 86400
    assert not ledger.status(DAILY, PROCESS_KEY, 1000.0 + 86400).crossed
    ledger.add(DAILY, PROCESS_KEY, 0.5, 90000.0)
    status = ledger.status(DAILY, PROCESS_KEY, 90000.0)
    assert (status.spent, status.resets_at) == (0.5, 90000.0 + 86400)


def test_the_loop_guard_keeps_the_longest_run() -> None:
    ledger = Ledger((LOOP,))
    for run in (1, 2, 3, 1, 2):
        assert ledger.record_run(LOOP, "s", run, 0) == []
    assert ledger.status(LOOP, "s", 0).spent == 3.0
    assert [c.fraction for c in ledger.record_run(LOOP, "s", 6, 0)] == [None]


def test_proxies_sharing_a_file_add_up_their_spend() -> None:
    a, b = Ledger((COST, TURNS)), Ledger((COST, TURNS))
    a.add(COST, "s", 1.0, 0)
    a.absorb(None, 0)
    a.saved()
    file = a.to_json()
    b.add(COST, "s", 2.0, 0)
    b.add(TURNS, "s", 1.0, 0)
    b.absorb(file, 0)
    assert b.status(COST, "s", 0).spent == 3.0
    b.saved()
    a.add(COST, "s", 0.5, 0)
    a.absorb(b.to_json(), 0)
    assert (a.status(COST, "s", 0).spent, a.status(TURNS, "s", 0).spent) == (3.5, 1.0)


def test_limits_of_another_config_in_the_file_are_kept() -> None:
    other: Any = {"meter": "turns", "per": "process", "max": 1, "window": None, "spend": {}}
    ledger = Ledger((COST,))
    ledger.absorb({"version": 1, "limits": {"theirs": other}}, 0)
    assert J(ledger.to_json())["limits"]["theirs"] == other


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ([], "not a budget state (version 1 expected)"),
        ({"version": 2}, "not a budget state (version 1 expected)"),
        ({"version": 1, "limits": []}, '"limits" and "overrides" must be objects'),
        ({"version": 1, "overrides": {"cost": "x"}}, 'overrides "cost" must be a number >= 0'),
        ({"version": 1, "cost": []}, '"cost" must be an object'),
        (
            {"version": 1, "limits": {"cost": {"spend": {"s": {"spent": -1}}}}},
            'limits "cost" spend "s": bad "spent" or "touched"',
        ),
    ],
)
def test_a_file_that_is_not_a_budget_state_is_refused(data: Any, reason: str) -> None:
    with pytest.raises(StateError, match=f"^{reason}$".replace("(", r"\(").replace(")", r"\)")):
        Ledger((COST,)).absorb(data, 0)


def test_cost_is_the_increase_of_the_cumulative_amount() -> None:
    ledger = Ledger((COST,))
    assert [ledger.cost_delta("s", a) for a in (0.5, 0.75, 0.75, 2.0, 1.0, 1.5)] == [
        0.0,
        0.25,
        0.0,
        1.25,
        0.0,  # went down: a new baseline
        0.5,
    ]


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "run", "absorb"]),
            st.one_of(st.floats(min_value=-1, max_value=3), st.sampled_from([math.nan, math.inf])),
            st.integers(min_value=0, max_value=8),
        ),
        max_size=40,
    )
)
def test_spend_only_grows_and_a_crossed_limit_stays_crossed_until_raised(
    steps: list[tuple[str, float, int]],
) -> None:
    """Without a window: spend never goes down (whatever is added, run or read back from the
    file), a crossed limit stays crossed, and only a higher max (an override) uncrosses it."""
    ledger = Ledger((COST, LOOP))
    file: Any = None
    spent = {COST.name: 0.0, LOOP.name: 0.0}
    crossed = {COST.name: False, LOOP.name: False}
    for i, (op, amount, run) in enumerate(steps):
        if op == "add":
            ledger.add(COST, "s", amount, i)
        elif op == "run":
            ledger.record_run(LOOP, "s", run, i)
        else:
            ledger.absorb(file, i)
            file = ledger.to_json()
            ledger.saved()
        for limit in (COST, LOOP):
            status = ledger.status(limit, "s", i)
            assert status.spent >= spent[limit.name]
            assert math.isfinite(status.spent)
            assert status.crossed or not crossed[limit.name]
            spent[limit.name], crossed[limit.name] = status.spent, status.crossed
    ledger.absorb({"version": 1, "overrides": {"cost": 1e9, "loop": 1e9}}, 0)
    assert not ledger.status(COST, "s", 0).crossed
    assert not ledger.status(LOOP, "s", 0).crossed


# -- the meters -----------------------------------------------------------------------------


def tool(tid: str, update_kind: str = "tool_call", **fields: Any) -> dict[str, Any]:
    return {"sessionUpdate": update_kind, "toolCallId": tid, **fields}


def test_identical_tool_calls_back_to_back_make_a_run() -> None:
    meters = Meters()
    runs = []
    for i in range(7):
        title = "Run ls" if i != 3 else "Run pwd"
        for spend in meters.update(
            "s", tool(f"t{i}", title=title, kind="execute", rawInput={"c": "ls"}), 0
        ):
            assert isinstance(spend, Spend)
            if spend.meter is Meter.REPEATED_TOOL_CALL:
                runs.append(spend.amount)
    assert runs == [1, 2, 3, 1, 1, 2, 3]


def test_a_v2_tool_call_counts_when_its_raw_input_arrives() -> None:
    meters = Meters()
    meters.version = 2
    first = meters.update("s", tool("t1", "tool_call_update", title="Read", kind="read"), 0)
    assert first == [Spend(Meter.TOOL_CALLS, "s", 1.0)]
    later = meters.update("s", tool("t1", "tool_call_update", rawInput={"path": "/a"}), 0)
    assert later == [Spend(Meter.REPEATED_TOOL_CALL, "s", 1.0)]
    assert meters.update("s", tool("t1", "tool_call_update", status="completed"), 0) == []


def test_turns_end_with_the_v1_response_and_the_v2_idle_state() -> None:
    v1 = Meters()
    v1.version = 1
    assert v1.prompt("s", 7, 10.0) == [Spend(Meter.TURNS, "s", 1.0)]
    result: Any = {
        "stopReason": "end_turn",
        "usage": {"totalTokens": 120, "inputTokens": 100, "outputTokens": 20},
    }
    assert v1.response({"jsonrpc": "2.0", "id": 7, "result": result}, 13.5) == [
        Spend(Meter.TURN_SECONDS, "s", 3.5),
        Spend(Meter.TOKENS, "s", 120.0),
    ]
    v2 = Meters()
    v2.version = 2
    v2.prompt("s", 1, 0.0)
    assert v2.response({"jsonrpc": "2.0", "id": 1, "result": {}}, 1.0) == []
    idle: Any = {
        "sessionUpdate": "state_update",
        "state": "idle",
        "stopReason": "end_turn",
        "usage": {"totalTokens": 9, "inputTokens": 5, "outputTokens": 4},
    }
    assert v2.update("s", idle, 4.0) == [
        Spend(Meter.TURN_SECONDS, "s", 4.0),
        Spend(Meter.TOKENS, "s", 9.0),
    ]
    assert v2.update("s", idle, 5.0) == []  # a repeated idle snapshot counts nothing


# -- the link -------------------------------------------------------------------------------


class Rig:
    """One connection's link on a fake clock, its writes and its events."""

    def __init__(self, *limits: Limit, version: int = 1, fail: str | None = None) -> None:
        self.now = 1_000_000.0
        self.fail = fail
        self.writes = 0
        self.file: Any = None  # what the state file holds
        self.events: list[BudgetEvent] = []
        self.ledger = Ledger(limits)
        self.link = BudgetMiddleware(
            self.ledger, lambda: self.now, self.persist, self.events.append
        )
        self.version = version

    def persist(self, durable: bool) -> str | None:
        if self.fail is not None:
            return self.fail
        self.ledger.absorb(self.file, self.now)
        self.file = self.ledger.to_json()
        self.ledger.saved()
        self.writes += 1
        return None

    def c2a(self, message: dict[str, Any]) -> Any:
        return self.link(message, MessageContext(C2A, self.version))

    def a2c(self, message: dict[str, Any]) -> Any:
        return self.link(message, MessageContext(A2C, self.version))

    def prompt(self, rid: int, sid: str = "s1") -> Any:
        return self.c2a(
            {
                "jsonrpc": "2.0",
                "id": rid,
                "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]},
            }
        )

    def update(self, update: dict[str, Any], sid: str = "s1") -> Any:
        return self.a2c(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": sid, "update": update},
            }
        )

    def cost(self, amount: float, sid: str = "s1") -> Any:
        return self.update(
            {
                "sessionUpdate": "usage_update",
                "used": 1000,
                "size": 200000,
                "cost": {"amount": amount, "currency": "USD"},
            },
            sid,
        )

    def end(self, rid: int) -> Any:
        return self.a2c({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})

    def kinds(self) -> list[tuple[str, str | None]]:
        return [(e.kind, e.limit) for e in self.events]


def test_a_limit_crossed_mid_turn_refuses_exactly_the_next_prompt() -> None:
    rig = Rig(COST)
    assert rig.prompt(1) is FORWARD
    assert rig.cost(1.0) is FORWARD  # the first report is the baseline
    assert rig.cost(5.5) is not FORWARD  # 4.5 spent: a warning at 80% rides along
    got = rig.cost(7.0)  # 6.0 spent: crossed; the turn goes on
    assert isinstance(got, Replace) and got.replies == ()
    assert J(got.messages)[0]["params"]["update"]["sessionUpdate"] == "usage_update"
    assert rig.end(1) is FORWARD
    refused = rig.prompt(2)
    assert isinstance(refused, Reply)
    assert refused.message == {
        "jsonrpc": "2.0",
        "id": 2,
        "error": {
            "code": QUOTA_EXCEEDED,
            "message": 'acp-proxy budgets: prompt refused: the limit "cost" is reached '
            "(cost 6.00 of 5.00)",
            "data": {
                "poolId": "acp-proxy/cost",
                "meterId": "cost",
                "resetsAt": None,
                "retryAfter": None,
                "spent": 6.0,
                "max": 5.0,
            },
        },
    }
    validate_v2("Error", J(refused.message)["error"])
    validate_v1("Error", J(refused.message)["error"])
    assert rig.prompt(3, sid="s2") is FORWARD  # another session has its own budget
    assert rig.kinds() == [
        ("warning", "cost"),
        ("warning", "cost"),
        ("reached", "cost"),
        ("refused", "cost"),
    ]


def test_warnings_reach_the_editor_as_a_chunk_marked_as_the_proxys_on_v1() -> None:
    rig = Rig(COST)
    rig.prompt(1)
    rig.cost(0.0)
    got = rig.cost(4.2)
    assert isinstance(got, Replace)
    chunk = J(got.messages)[1]
    validate_v1_message(chunk)
    assert chunk["params"]["update"] == {
        "sessionUpdate": "agent_message_chunk",
        "content": {
            "type": "text",
            "text": '\n\n[acp-proxy] Budget "cost" at 80% (cost 4.20 of 5.00)\n\n',
        },
        "_meta": {
            NOTICE_META: {
                "severity": "warning",
                "limit": "cost",
                "meter": "cost",
                "spent": 4.2,
                "max": 5.0,
                "resetsAt": None,
            }
        },
    }


def test_a_v1_client_that_shows_notices_and_every_v2_client_get_a_notice() -> None:
    rig = Rig(COST)
    rig.link.on_initialize_request(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {"session": {"notices": {}}}},
        }
    )
    rig.prompt(1)
    rig.cost(0.0)
    got = rig.cost(9.0)
    assert isinstance(got, Replace)
    validate_v1_message(J(got.messages)[1])
    assert J(got.messages)[1]["params"]["update"]["sessionUpdate"] == "notice"
    assert J(got.messages)[1]["params"]["update"]["severity"] == "error"
    v2 = Rig(COST, version=2)
    v2.prompt(1)
    v2.cost(0.0)
    got = v2.cost(4.9)
    assert isinstance(got, Replace)
    validate_v2_message(J(got.messages)[1])
    assert (
        J(got.messages)[1]["params"]["update"]["title"]
        == 'Budget "cost" at 95% (cost 4.90 of 5.00)'
    )


def test_cancel_turn_sends_one_session_cancel_then_refuses() -> None:
    rig = Rig(LOOP)
    rig.prompt(1)
    cancels = []
    for i in range(8):
        got = rig.update(tool(f"t{i}", title="Run ls", kind="execute", rawInput={"command": "ls"}))
        if isinstance(got, Replace):
            cancels += list(got.replies)
            assert J(got.messages)[0]["params"]["update"]["toolCallId"] == f"t{i}"
        if i < 5:
            assert got is FORWARD
    assert cancels == [
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s1"}}
    ]
    assert rig.kinds() == [("reached", "loop"), ("cancelled", "loop")]
    rig.a2c({"jsonrpc": "2.0", "id": 1, "result": {"stopReason": "cancelled"}})
    refused = rig.prompt(2)
    assert (
        isinstance(refused, Reply)
        and J(refused.message)["error"]["data"]["poolId"] == "acp-proxy/loop"
    )


def test_five_different_tool_calls_do_not_trip_the_loop_guard() -> None:
    rig = Rig(LOOP)
    rig.prompt(1)
    for i in range(6):
        assert (
            rig.update(tool(f"t{i}", title=f"Read {i}", kind="read", rawInput={"i": i})) is FORWARD
        )
    assert rig.events == []
    assert rig.prompt(2) is FORWARD


def test_the_turns_limit_lets_max_prompts_through() -> None:
    rig = Rig(TURNS)
    assert rig.prompt(1) is FORWARD
    rig.end(1)
    got = rig.prompt(2)  # the last one allowed: the editor is told
    assert isinstance(got, Replace) and J(got.messages)[0]["id"] == 2
    assert J(got.replies)[0]["params"]["update"]["_meta"][NOTICE_META]["limit"] == "turns"
    rig.end(2)
    assert isinstance(rig.prompt(3), Reply)


def test_an_unwritable_state_refuses_prompts_with_the_reason() -> None:
    rig = Rig(COST, fail="budgets.json: Permission denied")
    refused = rig.prompt(1)
    assert isinstance(refused, Reply)
    assert J(refused.message)["error"]["message"] == (
        "acp-proxy budgets: prompt refused: the budget state cannot be recorded "
        "(budgets.json: Permission denied)"
    )
    validate_v2("Error", J(refused.message)["error"])
    assert isinstance(rig.prompt(2), Reply)
    assert rig.kinds() == [("unrecorded", None)]  # told once per reason
    rig.fail = None
    assert rig.prompt(3) is FORWARD


def test_turn_seconds_cancel_counts_the_running_turn() -> None:
    limit = Limit("slow", Meter.TURN_SECONDS, 60.0, action=Action.CANCEL_TURN)
    rig = Rig(limit)
    rig.prompt(1)
    rig.now += 30
    assert rig.cost(0.1) is FORWARD
    rig.now += 31
    got = rig.cost(0.2)
    assert isinstance(got, Replace) and J(got.replies)[0]["method"] == "session/cancel"


def test_spend_between_prompts_is_written_at_most_every_second_and_at_each_crossing() -> None:
    rig = Rig(COST)
    rig.prompt(1)
    assert rig.writes == 1  # before the prompt went (nothing counted: no turns limit)
    rig.cost(0.0)
    rig.cost(0.1)
    rig.now += 0.5
    rig.cost(0.2)
    assert rig.writes == 1
    rig.now += 0.5
    rig.cost(0.3)
    assert rig.writes == 2
    rig.cost(4.5)  # a warning: written at once
    assert rig.writes == 3
    assert rig.file["limits"]["cost"]["spend"]["s1"]["spent"] == pytest.approx(4.5)
