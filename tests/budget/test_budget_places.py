"""Budgets everywhere the proxy runs, with a v1 and a v2 agent: ``--listen`` (a per-process
limit adds up the spend of every connection, each with its own agent) and ``acp-proxy
component`` (behind the spec conductor); stdio is tests/budget/test_budget_proxy.py. Real
processes: the scripted agent (tests/budget_agent.py) streams known cost figures; every update
the client receives is checked against the official schemas."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import anyio
import anyio.abc
import orjson
import pytest
from acp_schema import validate_v1, validate_v2
from proxy_harness import (
    TESTS,
    TIMEOUT,
    Lines,
    SocketAsProcess,
    running,
    wait_for_path,
    write_config,
)
from test_budget_proxy import AGENT, Client, cost, stats, stop_reason

pytestmark = pytest.mark.anyio
CONDUCTOR = TESTS / "conductors" / "spec_conductor.py"
PER_PROCESS = """\
budgets:
  state: {state}
  limits:
    - name: team-cost
      per: process
      meter: cost
      max: 1.00
"""
PER_SESSION = """\
budgets:
  state: {state}
  limits:
    - name: session-cost
      meter: cost
      max: 1.00
"""


async def opened(client: Client, version: int, cwd: Path) -> str:
    """``initialize`` and ``session/new``: the new session's id."""
    await client.call("initialize", {"protocolVersion": version, "clientCapabilities": {}})
    new = await client.call("session/new", {"cwd": str(cwd), "mcpServers": []})
    return str(new["result"]["sessionId"])


def refusal(name: str, spent: float) -> dict[str, object]:
    return {
        "code": -32003,
        "message": f'acp-proxy budgets: prompt refused: the limit "{name}" is reached '
        f"(cost {spent:.2f} of 1.00)",
        "data": {
            "poolId": f"acp-proxy/{name}",
            "meterId": "cost",
            "resetsAt": None,
            "retryAfter": None,
            "spent": spent,
            "max": 1.0,
        },
    }


@pytest.mark.parametrize("version", [1, 2])
async def test_listen_adds_up_every_connection_s_spend(tmp_path: Path, version: int) -> None:
    state = tmp_path / "budgets.json"
    config = write_config(tmp_path / "b.yaml", PER_PROCESS.format(state=state))
    sock = tmp_path / "proxy.sock"
    cmd = [sys.executable, "-m", "acp_proxy", "--config", config, "--listen", f"unix://{sock}",
           "--", sys.executable, str(AGENT), str(version), "unique"]  # fmt: skip
    async with running(cmd) as proc:
        await wait_for_path(sock)
        with anyio.fail_after(TIMEOUT):
            # The first editor spends 0.75 and leaves; its agent goes with it.
            async with await anyio.connect_unix(str(sock)) as first:
                a = Client(SocketAsProcess(first), version)  # type: ignore[arg-type]
                sid = await opened(a, version, tmp_path)
                end = await a.turn({"updates": [cost(0.0), cost(0.75)]}, sid)
                assert stop_reason(end) == "end_turn"
            # The second, with an agent of its own, crosses the process's limit: its turn
            # finishes, its next prompt is refused and never reaches its agent.
            async with await anyio.connect_unix(str(sock)) as second:
                b = Client(SocketAsProcess(second), version)  # type: ignore[arg-type]
                sid = await opened(b, version, tmp_path)
                assert stop_reason(await b.turn({"updates": [cost(0.5)]}, sid)) == "end_turn"
                refused = await b.turn({"updates": []}, sid)
                assert refused["error"] == refusal("team-cost", 1.25)
                (validate_v1 if version == 1 else validate_v2)("Error", refused["error"])
                assert await stats(b) == {"prompts": 1, "cancels": 0}
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
    spend = orjson.loads(state.read_bytes())["limits"]["team-cost"]["spend"]
    assert [entry["spent"] for entry in spend.values()] == [1.25]


@pytest.mark.parametrize("version", [1, 2])
async def test_component_refuses_behind_the_conductor(tmp_path: Path, version: int) -> None:
    state = tmp_path / "budgets.json"
    config = write_config(tmp_path / "b.yaml", PER_SESSION.format(state=state))
    component = [sys.executable, "-m", "acp_proxy", "component", "--config", config]
    agent = [sys.executable, str(AGENT), str(version)]
    cmd = [sys.executable, str(CONDUCTOR), "--dialect", "official",
           json.dumps(component), json.dumps(agent)]  # fmt: skip
    async with running(cmd) as proc:
        client = Client(proc, version)
        await opened(client, version, tmp_path)
        end = await client.turn({"updates": [cost(0.0), cost(1.5)]})
        assert stop_reason(end) == "end_turn"
        refused = await client.turn({"updates": []})
        assert refused["error"] == refusal("session-cost", 1.5)
        assert await stats(client) == {"prompts": 1, "cancels": 0}
        assert proc.stdin is not None
        await proc.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            await proc.wait()


async def test_sighup_reloads_the_limits_of_a_listening_proxy(tmp_path: Path) -> None:
    """Under ``--listen`` SIGHUP is a daemon's reload: the limits are read again at once and the
    proxy keeps serving (without budgets, SIGHUP still shuts it down)."""
    state = tmp_path / "budgets.json"
    path = Path(write_config(tmp_path / "b.yaml", PER_PROCESS.format(state=state)))
    sock = tmp_path / "proxy.sock"
    agent = [sys.executable, str(AGENT), "2", "unique"]
    cmd = [sys.executable, "-m", "acp_proxy", "--log-format", "json", "--config", str(path),
           "--listen", f"unix://{sock}", "--", *agent]  # fmt: skip
    async with running(cmd) as proc:
        assert proc.stderr is not None
        log = Lines(proc.stderr)

        async def event(name: str) -> dict[str, object]:
            while True:
                line = await log.line()
                if line.startswith(b"{") and (e := orjson.loads(line))["event"] == name:
                    return e  # type: ignore[no-any-return]

        await wait_for_path(sock)
        with anyio.fail_after(TIMEOUT):
            async with await anyio.connect_unix(str(sock)) as first:
                a = Client(SocketAsProcess(first), 2)  # type: ignore[arg-type]
                sid = await opened(a, 2, tmp_path)
                assert stop_reason(await a.turn({"updates": [cost(1.25)]}, sid)) == "end_turn"
                assert (await a.turn({"updates": []}, sid))["error"]["code"] == -32003
                path.write_text(PER_PROCESS.format(state=state).replace("1.00", "2.00"))
                proc.send_signal(signal.SIGHUP)
                reloaded = await event("budgets reloaded")
                assert reloaded["limits"] == {"team-cost": 2.0}
                await event("signal received; configuration reloaded")
                assert stop_reason(await a.turn({"updates": []}, sid)) == "end_turn"
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
