"""Turn-level telemetry with real agents: the bundled v2 demo agent (``--ask-permission``), a
v1 agent on the official Python SDK (``tests/sdk_v1_agent.py``) and a v2 agent on the official
TypeScript SDK (``tests/agents/ts_sdk_v2_agent.mjs``), each behind the real CLI with
``--metrics`` and tracing to a local OTLP receiver. Each prompt turn is one span tree (the
``invoke_agent`` span, with the tool call, the permission request and ``session/cancel`` under
it), and the histograms count exactly the turns, tool calls and permission waits scripted."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from acp_schema import validate_v1_message, validate_v2, validate_v2_message
from proxy_harness import REPO, TESTS, Lines, proxy_env
from telemetry_harness import LogReader, Receiver, attrs, running_receiver, scrape, total, value

pytest.importorskip("opentelemetry.sdk")

TIMEOUT = 30.0
PROXY = [sys.executable, "-m", "acp_proxy", "--log-format", "json"]
SDK_AGENT = TESTS / "sdk_v1_agent.py"
TS_AGENT = TESTS / "agents" / "ts_sdk_v2_agent.mjs"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def ts_sdk() -> Path:
    """The TypeScript SDK's v2 entry point, installed by ``python bench/setup_peers.py --only
    ts-sdk``; CI (.ci/run) sets ``ACP_PROXY_REQUIRE_TS_SDK=1`` so that a missing one fails."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from setup_peers import ts_sdk_v2_module
    finally:
        sys.path.remove(str(REPO / "bench"))
    module = Path(ts_sdk_v2_module(REPO / "bench" / "build"))
    missing = None
    if shutil.which("node") is None:
        missing = "node is not installed"
    elif not module.exists():
        missing = f"{module} is missing (python bench/setup_peers.py --only ts-sdk installs it)"
    if missing is not None:
        if os.environ.get("ACP_PROXY_REQUIRE_TS_SDK") == "1":
            pytest.fail(f"the TypeScript SDK is required here: {missing}")
        pytest.skip(f"the TypeScript SDK: {missing}")
    return module


def _send(message: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", **message}) + b"\n"


async def _until(lines: Lines, seen: list[dict[str, Any]], predicate: Any) -> dict[str, Any]:
    with anyio.fail_after(TIMEOUT):
        while True:
            message: dict[str, Any] = orjson.loads(await lines.line())
            seen.append(message)
            if predicate(message):
                return message


def _is_update(kind: str, **fields: Any) -> Any:
    def check(m: dict[str, Any]) -> bool:
        update = m.get("params", {}).get("update", {})
        return bool(
            m.get("method") == "session/update"
            and update.get("sessionUpdate") == kind
            and all(update.get(k) == v for k, v in fields.items())
        )

    return check


def _spans(receiver: Receiver, count: int) -> list[Any]:
    with receiver.lock:
        spans = [s for _, s in receiver.spans]
    assert len(spans) == count, sorted(s.name for s in spans)
    return spans


def _tree(spans: list[Any], turn_name: str) -> tuple[Any, dict[str, Any]]:
    """The turn span and its direct children by name; checks times nest."""
    (turn,) = [s for s in spans if s.name == turn_name]
    children = {s.name: s for s in spans if s.parent_span_id == turn.span_id}
    for child in children.values():
        assert child.trace_id == turn.trace_id
        assert turn.start_time_unix_nano <= child.start_time_unix_nano
        assert child.end_time_unix_nano <= turn.end_time_unix_nano
    return turn, children


async def _wait_spans(receiver: Receiver, count: int) -> None:
    with anyio.fail_after(TIMEOUT):
        while True:
            with receiver.lock:
                if len(receiver.spans) >= count:
                    return
            await anyio.sleep(0.02)


def _histogram_counts(samples: dict[Any, float], name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(v for _, v in labels): n
        for (sample, labels), n in samples.items()
        if sample == f"acp_proxy_{name}_count"
    }


@pytest.mark.anyio
async def test_v2_demo_agent_turn_is_one_tree_and_is_counted_exactly(
    tmp_path: Path, receiver: Receiver
) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text("tracing: {enabled: true}\n")
    agent = [sys.executable, "-m", "acp_proxy.demo.agent", "--ask-permission"]
    cmd = [*PROXY, "--config", str(config), "--metrics", "tcp://127.0.0.1:0", "--", *agent]
    env = proxy_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="50",
        OTEL_SERVICE_NAME="proxy-under-test",
    )
    seen: list[dict[str, Any]] = []
    async with await anyio.open_process(cmd, env=env, cwd=str(REPO)) as proc:
        assert proc.stdin and proc.stdout and proc.stderr
        log = LogReader(proc.stderr)
        address = (await log.event("serving metrics"))["address"]
        out = Lines(proc.stdout)
        await proc.stdin.send(
            _send({"id": 0, "method": "initialize", "params": {"protocolVersion": 2}})
        )
        await _until(out, seen, lambda m: m.get("id") == 0)
        await proc.stdin.send(_send({"id": 1, "method": "session/new", "params": {"cwd": "/w"}}))
        new = await _until(out, seen, lambda m: m.get("id") == 1)
        session = new["result"]["sessionId"]
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "hi"}]}
        await proc.stdin.send(_send({"id": 2, "method": "session/prompt", "params": prompt}))
        ask = await _until(out, seen, lambda m: m.get("method") == "session/request_permission")
        validate_v2_message(ask)
        # The user cancels the turn; the client answers the open permission request cancelled.
        await proc.stdin.send(_send({"method": "session/cancel", "params": {"sessionId": session}}))
        cancelled = {"outcome": {"outcome": "cancelled"}}
        await proc.stdin.send(_send({"id": ask["id"], "result": cancelled}))
        await _until(out, seen, _is_update("state_update", state="idle"))
        for message in seen:
            if message.get("method") == "session/update":
                validate_v2_message(message)
        samples = await scrape(address)
        await proc.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            assert await proc.wait() == 0

    assert _histogram_counts(samples, "turn_duration_seconds") == {("end_turn",): 1}
    assert _histogram_counts(samples, "turn_first_output_seconds") == {("message",): 1}
    assert _histogram_counts(samples, "tool_call_duration_seconds") == {("read", "completed"): 1}
    assert _histogram_counts(samples, "permission_wait_seconds") == {("cancelled",): 1}
    assert value(samples, "acp_proxy_cancellations_total") == 1
    # The turn lasted at least as long as the permission wait inside it.
    wait = total(samples, "acp_proxy_permission_wait_seconds_sum")
    assert 0 < wait <= total(samples, "acp_proxy_turn_duration_seconds_sum")

    await _wait_spans(receiver, 6)
    spans = _spans(receiver, 6)
    turn, children = _tree(spans, "invoke_agent acp-proxy-demo-agent")
    assert sorted(children) == ["execute_tool", "session/cancel", "session/request_permission"]
    assert turn.parent_span_id == b""  # the client sent no traceparent: the turn is a root
    a = attrs(turn)
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == "acp-proxy-demo-agent"
    assert a["gen_ai.conversation.id"] == session
    assert a["gen_ai.response.finish_reasons"] == ["end_turn"]
    assert a["acp.stop_reason"] == "end_turn"
    assert a["acp.turn.cancelled"] is True
    assert a["acp.turn.first_output"] == "message"
    assert a["acp.protocol_version"] == 2
    # v2: the prompt response only accepted the prompt; the turn went on to the idle state.
    assert 0 <= a["acp.turn.accepted_s"] < a["acp.turn.time_to_first_output_s"]
    tool = attrs(children["execute_tool"])
    assert tool["gen_ai.tool.call.id"] == "call_001"
    assert tool["acp.tool_call.final_status"] == "completed"
    permission = children["session/request_permission"]
    p = attrs(permission)
    assert p["acp.permission.outcome"] == "cancelled"
    span_s = (permission.end_time_unix_nano - permission.start_time_unix_nano) / 1e9
    assert abs(p["acp.permission.wait_s"] - span_s) < 0.05
    assert 0 < span_s <= wait + 0.05
    others = sorted(s.name for s in spans if s.trace_id != turn.trace_id)
    assert others == ["initialize", "session/new"]


@pytest.mark.anyio
async def test_v1_sdk_agent_turn_is_one_tree_and_is_counted_exactly(
    tmp_path: Path, receiver: Receiver
) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text("tracing: {enabled: true}\n")
    cmd = [
        *PROXY,
        "--config",
        str(config),
        "--metrics",
        "tcp://127.0.0.1:0",
        "--",
        sys.executable,
        str(SDK_AGENT),
    ]
    env = proxy_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="50")
    seen: list[dict[str, Any]] = []
    trace, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with await anyio.open_process(cmd, env=env, cwd=str(REPO)) as proc:
        assert proc.stdin and proc.stdout and proc.stderr
        log = LogReader(proc.stderr)
        address = (await log.event("serving metrics"))["address"]
        out = Lines(proc.stdout)
        init = {"protocolVersion": 1, "clientCapabilities": {}}
        await proc.stdin.send(_send({"id": 0, "method": "initialize", "params": init}))
        await _until(out, seen, lambda m: m.get("id") == 0 and "result" in m)
        new = {"cwd": "/w", "mcpServers": []}
        await proc.stdin.send(_send({"id": 1, "method": "session/new", "params": new}))
        session = (await _until(out, seen, lambda m: m.get("id") == 1))["result"]["sessionId"]
        prompt = {
            "sessionId": session,
            "prompt": [{"type": "text", "text": "hi"}],
            "_meta": {"traceparent": f"00-{trace}-{parent}-01"},
        }
        await proc.stdin.send(_send({"id": 2, "method": "session/prompt", "params": prompt}))
        ask = await _until(out, seen, lambda m: m.get("method") == "session/request_permission")
        validate_v1_message(ask)
        selected = {"outcome": {"outcome": "selected", "optionId": "yes"}}
        await proc.stdin.send(_send({"id": ask["id"], "result": selected}))
        answer = await _until(out, seen, lambda m: m.get("id") == 2 and "method" not in m)
        assert answer["result"]["stopReason"] == "end_turn"
        for message in seen:
            if message.get("method") == "session/update":
                validate_v1_message(message)
        samples = await scrape(address)
        await proc.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            assert await proc.wait() == 0

    assert _histogram_counts(samples, "turn_duration_seconds") == {("end_turn",): 1}
    assert _histogram_counts(samples, "turn_first_output_seconds") == {("thought",): 1}
    assert _histogram_counts(samples, "tool_call_duration_seconds") == {("read", "completed"): 1}
    assert _histogram_counts(samples, "permission_wait_seconds") == {("allow_once",): 1}
    assert value(samples, "acp_proxy_cancellations_total") == 0
    assert value(samples, "acp_proxy_protocol_versions_total", version="1") == 1

    await _wait_spans(receiver, 5)
    spans = _spans(receiver, 5)
    turn, children = _tree(spans, "invoke_agent")  # the SDK agent sends no agentInfo
    assert sorted(children) == ["execute_tool", "session/request_permission"]
    # The client's traceparent is the turn's parent: the whole turn is in the client's trace.
    assert (turn.trace_id.hex(), turn.parent_span_id.hex()) == (trace, parent)
    a = attrs(turn)
    assert a["acp.stop_reason"] == "end_turn"
    assert a["acp.turn.first_output"] == "thought"
    assert a["acp.protocol_version"] == 1
    assert "acp.turn.accepted_s" not in a  # v1: the response is the end of the turn
    assert attrs(children["session/request_permission"])["acp.permission.outcome"] == "allow_once"


@pytest.mark.anyio
async def test_v2_typescript_sdk_agent_turn_is_one_tree_and_is_counted_exactly(
    tmp_path: Path, receiver: Receiver, ts_sdk: Path
) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text("tracing: {enabled: true}\n")
    agent = ["node", str(TS_AGENT)]
    cmd = [*PROXY, "--config", str(config), "--metrics", "tcp://127.0.0.1:0", "--", *agent]
    env = proxy_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="50",
        ACP_TS_SDK_V2_MODULE=str(ts_sdk),
    )
    seen: list[dict[str, Any]] = []
    async with await anyio.open_process(cmd, env=env, cwd=str(REPO)) as proc:
        assert proc.stdin and proc.stdout and proc.stderr
        log = LogReader(proc.stderr)
        address = (await log.event("serving metrics"))["address"]
        out = Lines(proc.stdout)
        # The SDK parses every request against its v2 schemas: the client sends full v2 shapes.
        init = {"protocolVersion": 2, "info": {"name": "test-client", "version": "1"}}
        init["capabilities"] = {}
        new = {"cwd": "/w"}
        prompt_text = [{"type": "text", "text": "What does the README say?"}]
        validate_v2("InitializeRequest", init)
        validate_v2("NewSessionRequest", new)
        await proc.stdin.send(_send({"id": 0, "method": "initialize", "params": init}))
        initialized = await _until(out, seen, lambda m: m.get("id") == 0 and "method" not in m)
        validate_v2("InitializeResponse", initialized["result"])
        assert initialized["result"]["protocolVersion"] == 2
        await proc.stdin.send(_send({"id": 1, "method": "session/new", "params": new}))
        created = await _until(out, seen, lambda m: m.get("id") == 1 and "method" not in m)
        validate_v2("NewSessionResponse", created["result"])
        session = created["result"]["sessionId"]
        prompt = {"sessionId": session, "prompt": prompt_text}
        validate_v2("PromptRequest", prompt)
        await proc.stdin.send(_send({"id": 2, "method": "session/prompt", "params": prompt}))
        accepted = await _until(out, seen, lambda m: m.get("id") == 2 and "method" not in m)
        validate_v2("PromptResponse", accepted["result"])  # v2: the user message was inserted
        ask = await _until(out, seen, lambda m: m.get("method") == "session/request_permission")
        selected = {"outcome": {"outcome": "selected", "optionId": "yes"}}
        validate_v2("RequestPermissionResponse", selected)
        await proc.stdin.send(_send({"id": ask["id"], "result": selected}))
        await _until(out, seen, _is_update("state_update", state="idle"))
        updates = [m for m in seen if m.get("method") == "session/update"]
        for message in [*updates, ask]:
            validate_v2_message(message)
        kinds = [m["params"]["update"]["sessionUpdate"] for m in updates]
        assert kinds == [
            "state_update",
            "user_message",
            "tool_call_update",
            "tool_call_update",
            "tool_call_update",
            "agent_message_chunk",
            "agent_message_chunk",
            "state_update",
        ]
        assert updates[-1]["params"]["update"]["stopReason"] == "end_turn"
        samples = await scrape(address)
        await proc.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            assert await proc.wait() == 0

    assert _histogram_counts(samples, "turn_duration_seconds") == {("end_turn",): 1}
    assert _histogram_counts(samples, "turn_first_output_seconds") == {("message",): 1}
    assert _histogram_counts(samples, "tool_call_duration_seconds") == {("read", "completed"): 1}
    assert _histogram_counts(samples, "permission_wait_seconds") == {("allow_once",): 1}
    assert value(samples, "acp_proxy_cancellations_total") == 0
    assert value(samples, "acp_proxy_protocol_versions_total", version="2") == 1
    wait = total(samples, "acp_proxy_permission_wait_seconds_sum")
    assert 0 < wait <= total(samples, "acp_proxy_tool_call_duration_seconds_sum")
    assert total(samples, "acp_proxy_tool_call_duration_seconds_sum") <= total(
        samples, "acp_proxy_turn_duration_seconds_sum"
    )

    await _wait_spans(receiver, 5)
    spans = _spans(receiver, 5)
    turn, children = _tree(spans, "invoke_agent ts-sdk-v2-agent")  # the agent's v2 `info`
    assert sorted(children) == ["execute_tool", "session/request_permission"]
    assert turn.parent_span_id == b""
    a = attrs(turn)
    assert a["gen_ai.agent.name"] == "ts-sdk-v2-agent"
    assert a["gen_ai.conversation.id"] == session
    assert a["acp.stop_reason"] == "end_turn"
    assert "acp.turn.cancelled" not in a  # set only on a cancelled turn
    assert a["acp.turn.first_output"] == "message"
    assert a["acp.protocol_version"] == 2
    # The response came before the tool call and the first message chunk: the turn went on.
    assert 0 <= a["acp.turn.accepted_s"] < a["acp.turn.time_to_first_output_s"]
    tool = attrs(children["execute_tool"])
    assert tool["gen_ai.tool.call.id"] == "call_ts_001"
    assert tool["acp.tool_call.final_status"] == "completed"
    permission = children["session/request_permission"]
    assert attrs(permission)["acp.permission.outcome"] == "allow_once"
    # The permission wait sits inside the tool call it was asked for.
    tool_span = children["execute_tool"]
    assert tool_span.start_time_unix_nano <= permission.start_time_unix_nano
    assert permission.end_time_unix_nano <= tool_span.end_time_unix_nano
    others = sorted(s.name for s in spans if s.trace_id != turn.trace_id)
    assert others == ["initialize", "session/new"]
