"""``acp-proxy demo`` and its scripted agent, run as real processes through the real CLI.

The bundled run (``python -m acp_proxy demo``, as a user types it) is checked only on what holds
however the proxy schedules its writes (final metadata, the clear and its follow-up, plan_update
untouched, every message valid ACP v2): under backpressure the proxy may coalesce updates, which
changes how many frames the client reads but never what it stores. The per-row layout is
checked on a run with coalescing turned off, where it is exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from acp_schema import validate_v2, validate_v2_message
from proxy_harness import REPO

from acp_proxy.config import parse_config
from acp_proxy.config.explain import describe_rule
from acp_proxy.demo import agent as demo_agent
from acp_proxy.demo.pairing import pair_updates
from acp_proxy.demo.session import Frame, SessionRecord

ROOT = REPO
DEFAULT_RULES = ROOT / "acp_proxy" / "data" / "default.yaml"

# The bundled rule (acp_proxy/data/default.yaml) with HOSTNAME unset.
ROUTE = {"example.dev/route": "edge", "example.dev/host": "demo-host"}
FOLLOW_UP = {"sessionUpdate": "tool_call_update", "toolCallId": "call_001", "_meta": ROUTE}

FINAL_META: dict[str, Any] = {
    "message msg_user_001": None,
    "tool call call_001": ROUTE,
    "terminal term_001": {"acme.dev/shell": "bash", **ROUTE},
    "message msg_agent_001": {"acme.dev/model": "demo-1"},
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HOSTNAME", "ACP_PROXY_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", "demo", *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def transcript() -> dict[str, Any]:
    proc = _demo("--json")
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


@pytest.fixture(scope="module")
def no_coalesce_rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(
        DEFAULT_RULES.read_text(encoding="utf-8") + "\ncoalesce:\n  enabled: false\n",
        encoding="utf-8",
    )
    return path


def _updates(messages: list[Any]) -> list[dict[str, Any]]:
    return [m["params"]["update"] for m in messages if m.get("method") == "session/update"]


def _tool_call(messages: list[Any]) -> list[dict[str, Any]]:
    return [u for u in _updates(messages) if u.get("toolCallId") == "call_001"]


# --- the bundled run ---------------------------------------------------------------------------


def test_final_metadata_per_entity(transcript: dict[str, Any]) -> None:
    assert transcript["protocolVersion"] == 2
    assert transcript["sessionId"] == demo_agent.SESSION_ID
    assert transcript["final_meta"] == FINAL_META
    assert transcript["direct_meta"] == {
        "message msg_user_001": None,
        "tool call call_001": None,
        "terminal term_001": {"acme.dev/shell": "bash"},
        "message msg_agent_001": {"acme.dev/model": "demo-1"},
    }
    assert transcript["proxy_exit_code"] == 0


def test_naive_models_show_what_the_rfd_prevents(transcript: dict[str, Any]) -> None:
    # Replace-whole client: the proxy's keys on an update without _meta erase the agent's key,
    # and its removal is stored as a literal null.
    assert transcript["naive_meta"]["terminal term_001"] == {**ROUTE, "zed.dev/debugMode": None}
    # A proxy that writes its keys into the clear: the key the clear removed survives.
    assert transcript["naive_proxy_meta"]["tool call call_001"] == {
        "acme.dev/review": {"reviewer": "sam"},
        **ROUTE,
    }


def test_clear_is_kept_and_followed_by_the_proxy_keys(transcript: dict[str, Any]) -> None:
    received = _tool_call(transcript["transcript"]["client_received"])
    clears = [i for i, u in enumerate(received) if "_meta" in u and u["_meta"] is None]
    assert len(clears) == 1
    clear = received[clears[0]]
    assert clear["status"] == "completed"
    # The follow-up comes after the clear, as a separate update carrying only the annotation.
    assert received[clears[0] + 1 :] == [FOLLOW_UP]
    rows = [r for r in transcript["updates"] if r["inserted"]]
    assert [r["inserted"] for r in rows] == [[FOLLOW_UP]]
    assert rows[0]["received"] == clear


def test_plan_update_is_untouched(transcript: dict[str, Any]) -> None:
    sent = [u for u in _updates(transcript["transcript"]["agent_sent"]) if "plan" in u]
    got = [u for u in _updates(transcript["transcript"]["client_received"]) if "plan" in u]
    assert sent == got
    assert len(got) == 1 and got[0]["_meta"] == {"acme.dev/planner": "v1"}
    (row,) = [r for r in transcript["updates"] if r["kind"] == "plan_update"]
    assert row["status"] == "unchanged"


def test_chunk_and_state_updates_pass_byte_exact(transcript: dict[str, Any]) -> None:
    statuses = {
        (r["kind"], r["status"])
        for r in transcript["updates"]
        if r["kind"] in ("agent_message_chunk", "agent_message", "user_message")
    }
    assert statuses == {
        ("agent_message_chunk", "unchanged"),
        ("agent_message", "unchanged"),
        ("user_message", "unchanged"),
    }


def test_every_message_is_valid_acp_v2(transcript: dict[str, Any]) -> None:
    requests = {m["id"]: m for m in transcript["transcript"]["client_sent"]}
    assert [m["method"] for m in requests.values()] == [
        "initialize",
        "session/new",
        "session/prompt",
    ]
    request_defs = {
        "initialize": "InitializeRequest",
        "session/new": "NewSessionRequest",
        "session/prompt": "PromptRequest",
    }
    response_defs = {
        "initialize": "InitializeResponse",
        "session/new": "NewSessionResponse",
        "session/prompt": "PromptResponse",
    }
    for message in requests.values():
        assert message["jsonrpc"] == "2.0"
        validate_v2(request_defs[message["method"]], message["params"])
    streams = transcript["transcript"]
    checked = 0
    for message in [*streams["agent_sent"], *streams["client_received"]]:
        assert isinstance(message, dict), message
        assert message["jsonrpc"] == "2.0"
        if "method" in message:
            validate_v2_message(message)
        else:
            assert "error" not in message, message
            validate_v2(response_defs[requests[message["id"]]["method"]], message["result"])
        checked += 1
    assert checked == len(streams["agent_sent"]) + len(streams["client_received"]) == 15 + 16


def test_text_report_of_the_bundled_run() -> None:
    proc = _demo()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "\x1b[" not in out  # no color when stdout is not a terminal
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100  # reads well in a 100-column terminal
    assert lines[:7] == [
        "acp-proxy demo: a scripted ACP v2 client and agent, acp-proxy in between",
        "  rules  acp_proxy/data/default.yaml",
        "         Rule edge-route: on each tool_call_update and terminal_update the agent sends, "
        "it sets",
        "         example.dev/route and example.dev/host, and removes zed.dev/debugMode in the "
        "entity's",
        "         _meta, as a metadata patch that leaves the agent's other keys alone.",
        "  run    acp-proxy --config acp_proxy/data/default.yaml --",
        "         python -m acp_proxy.demo.agent --pace-ms 20",
    ]
    follow_up = json.dumps(FOLLOW_UP, separators=(",", ":"))
    cut = follow_up.index(',"_meta"') + 1
    at = next(i for i, line in enumerate(lines) if line.startswith("    client+ "))
    assert lines[at : at + 2] == [
        f"    client+ {follow_up[:cut]}",
        f"            {follow_up[cut:]}",
    ]
    route = '"example.dev/route":"edge","example.dev/host":"demo-host"'
    assert "  terminal term_001" in lines
    at = lines.index("  terminal term_001")
    assert lines[at + 1 : at + 9] == [
        '    agent alone    {"acme.dev/shell":"bash"}',
        '    via acp-proxy  {"acme.dev/shell":"bash","example.dev/route":"edge",',
        '                   "example.dev/host":"demo-host"}',
        f"    naive client   {{{route},",
        '                   "zed.dev/debugMode":null}',
        "                   <- loses acme.dev/shell, stores zed.dev/debugMode: null",
        '    naive proxy    {"acme.dev/shell":"bash","example.dev/route":"edge",',
        '                   "example.dev/host":"demo-host"}  (same)',
    ]
    # A string's own comma or space is never where a line is cut.
    assert '            "text":"3 settings, all valid."}}],"_meta":null}' in lines


def test_describe_rule_says_what_a_rule_does_in_one_sentence() -> None:
    rules = parse_config(
        "rules:\n"
        "  - {name: a, match: {direction: agent_to_client, update: [upserts, plan_update]},"
        " set_meta: {x.dev/k: 1}}\n"
        "  - {name: b, match: {method: 'session/*'}, target: message, remove_meta: [x.dev/r]}\n",
        "c.yaml",
        {},
    ).rules
    assert [describe_rule(rule) for rule in rules] == [
        "Rule a: on each upsert and plan_update the agent sends, it sets x.dev/k in the "
        "entity's _meta, as a metadata patch that leaves the agent's other keys alone.",
        "Rule b: on each session/* message either side sends, it removes x.dev/r in the "
        "message's params._meta.",
    ]


def test_a_burst_ends_in_the_same_stored_metadata() -> None:
    # No pacing: the proxy may coalesce queued updates; the client's state must not move.
    proc = _demo("--json", "--pace-ms", "0")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["final_meta"] == FINAL_META
    received = _tool_call(report["transcript"]["client_received"])
    assert [u.get("_meta", "omitted") for u in received][-2:] == [None, ROUTE]
    assert report["summary"]["agent_updates"] == 12


# --- exact layout, coalescing off --------------------------------------------------------------


def test_rows_are_one_to_one_without_coalescing(no_coalesce_rules: Path) -> None:
    proc = _demo("--json", "--pace-ms", "0", "--config", str(no_coalesce_rules))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["final_meta"] == FINAL_META
    assert [(r["kind"], r["status"]) for r in report["updates"]] == [
        ("state_update", "unchanged"),
        ("user_message", "unchanged"),
        ("plan_update", "unchanged"),
        ("tool_call_update", "rewritten"),
        ("tool_call_update", "rewritten"),
        ("terminal_update", "rewritten"),
        ("tool_call_update", "rewritten"),
        ("terminal_update", "rewritten"),
        ("tool_call_update", "unchanged"),  # the clear, kept byte for byte
        ("agent_message", "unchanged"),
        ("agent_message_chunk", "unchanged"),
        ("state_update", "unchanged"),
    ]
    assert report["summary"] == {
        "agent_updates": 12,
        "client_updates": 13,
        "unchanged": 7,
        "rewritten": 5,
        "inserted": 1,
        "merged": 0,
    }
    # The update sent without _meta gets a patch with only the proxy's keys (RFD: omitted keys
    # keep their stored values), so the agent's progress and review keys stay stored.
    assert report["updates"][4]["received"] == {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "call_001",
        "status": "in_progress",
        "_meta": {**ROUTE, "zed.dev/debugMode": None},
    }


def test_text_rows_without_coalescing(no_coalesce_rules: Path) -> None:
    proc = _demo("--pace-ms", "0", "--config", str(no_coalesce_rules))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    follow_up = json.dumps(FOLLOW_UP, separators=(",", ":"))
    cut = follow_up.index(',"_meta"') + 1
    assert (
        " 9  tool_call_update     tool call call_001\n"
        '    agent   {"sessionUpdate":"tool_call_update","toolCallId":"call_001",'
        '"status":"completed",\n'
        '            "content":[{"type":"content","content":{"type":"text",\n'
        '            "text":"3 settings, all valid."}}],"_meta":null}\n'
        "    client  same bytes (the clear is kept)\n"
        f"    client+ {follow_up[:cut]}\n"
        f"            {follow_up[cut:]}\n"
        "            ^ inserted by the proxy: its keys, after the kept clear\n"
    ) in text
    assert (
        " 5  tool_call_update     tool call call_001\n"
        '    agent   {"sessionUpdate":"tool_call_update","toolCallId":"call_001",'
        '"status":"in_progress"}\n'
        "    client  same update, with this _meta:\n"
        '            {"example.dev/route":"edge","example.dev/host":"demo-host",'
        '"zed.dev/debugMode":null}\n'
        "            the agent sent no _meta: a patch with only these keys leaves its keys alone\n"
        '            + example.dev/route: "edge"\n'
        '            + example.dev/host: "demo-host"\n'
        "            - zed.dev/debugMode: null (removed)\n"
    ) in text
    assert text.endswith(
        "12 updates from the agent, 13 to the client: 7 byte-exact, 5 annotated, 1 inserted,"
        " 0 coalesced.\n"
    )


# --- failures are clear --------------------------------------------------------------------------


def test_missing_rules_file() -> None:
    proc = _demo("--config", "/nonexistent/rules.yaml")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "acp-proxy: /nonexistent/rules.yaml: cannot read the config file: "
        "No such file or directory\n"
    )


def test_a_bad_rules_file_is_a_config_error(tmp_path: Path) -> None:
    """The demo reads the file first: the proxy's own config error, exit 2, not a proxy that
    failed behind an internal command line."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: x\n    set_meta: {nonamespace: 1}\n", encoding="utf-8")
    proc = _demo("--config", str(bad), "--timeout", "60")
    assert (proc.returncode, proc.stdout) == (2, "")
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"acp-proxy: {bad}:3: rules[0].set_meta.nonamespace: ")


def test_proxy_that_fails_at_start_up(tmp_path: Path) -> None:
    """A valid file the proxy still cannot start with (its record directory does not exist):
    the demo says what the proxy answered its initialize with."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"record: {{path: {tmp_path}/no/such/r.jsonl}}\n", encoding="utf-8")
    proc = _demo("--config", str(cfg), "--timeout", "60")
    assert proc.returncode == 1
    assert proc.stdout == ""
    first = proc.stderr.splitlines()[0]
    assert first.startswith("acp-proxy demo: error: initialize failed through ")
    assert f"acp-proxy could not start (--record {tmp_path}/no/such/r.jsonl: No such" in first


# --- pairing, in process -------------------------------------------------------------------------


def _record(updates: list[dict[str, Any]]) -> SessionRecord:
    frames = []
    for update in updates:
        message: dict[str, Any] = {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": "s", "update": update},
        }
        frames.append(Frame(json.dumps(message).encode(), message))
    return SessionRecord((), (), tuple(frames), "s", 2, None, 0, "")


def test_pairing_recognises_coalesced_updates() -> None:
    a = {"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "pending"}
    b = {"sessionUpdate": "tool_call_update", "toolCallId": "t", "status": "completed"}
    c = {"sessionUpdate": "tool_call_update", "toolCallId": "t", "_meta": None}
    merged = {**b, "_meta": None}
    follow = {"sessionUpdate": "tool_call_update", "toolCallId": "t", "_meta": {"x/y": 1}}
    rows = pair_updates(_record([a, b, c]), _record([merged, follow]))
    assert [(r.status, len(r.sent), r.inserted) for r in rows] == [("merged", 3, [follow])]


def test_pairing_tells_a_follow_up_from_the_agents_own_update() -> None:
    clear = {"sessionUpdate": "tool_call_update", "toolCallId": "t", "_meta": None}
    own = {"sessionUpdate": "tool_call_update", "toolCallId": "t", "_meta": {"a/b": 1}}
    # No rule for this entity: the agent's clear then its own object, both passed through.
    rows = pair_updates(_record([clear, own]), _record([clear, own]))
    assert [(r.status, r.inserted) for r in rows] == [("unchanged", []), ("unchanged", [])]
    # With a rule: the proxy's follow-up after the clear, then the agent's object, annotated.
    follow = {**own, "_meta": {"x/y": 1}}
    annotated = {**own, "_meta": {"a/b": 1, "x/y": 1}}
    rows = pair_updates(_record([clear, own]), _record([clear, follow, annotated]))
    assert [(r.status, r.inserted) for r in rows] == [("unchanged", [follow]), ("rewritten", [])]


def test_pairing_reports_missing_and_extra_updates() -> None:
    a = {"sessionUpdate": "terminal_update", "terminalId": "t", "command": "ls"}
    b = {"sessionUpdate": "terminal_update", "terminalId": "u", "command": "pwd"}
    rows = pair_updates(_record([a]), _record([b]))
    assert [(r.entity, r.status) for r in rows] == [
        ("terminal u", "extra"),
        ("terminal t", "missing"),
    ]


# --- the agent on its own ----------------------------------------------------------------------


def test_agent_answers_unknown_methods_and_bad_prompts() -> None:
    agent = demo_agent.DemoAgent()
    assert agent.handle({"jsonrpc": "2.0", "id": 7, "method": "auth/login", "params": {}}) == [
        {
            "jsonrpc": "2.0",
            "id": 7,
            "error": {"code": -32601, "message": "Method not found: auth/login"},
        }
    ]
    prompt: dict[str, Any] = {
        "sessionId": demo_agent.SESSION_ID,
        "prompt": [{"type": "text", "text": "hi"}],
    }
    assert agent.handle(
        {"jsonrpc": "2.0", "id": 8, "method": "session/prompt", "params": prompt}
    ) == [
        {
            "jsonrpc": "2.0",
            "id": 8,
            "error": {"code": -32002, "message": "Resource not found: session"},
        }
    ]
    assert agent.handle({"jsonrpc": "2.0", "method": "session/cancel", "params": {}}) == []
    assert agent.handle([1, 2]) == []


def test_agent_parse_error_over_a_pipe() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "acp_proxy.demo.agent"],
        input=b"not json\n\n",
        capture_output=True,
        env=_env(),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    assert proc.stdout == (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}\n'
    )
