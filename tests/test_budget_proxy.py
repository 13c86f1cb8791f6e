"""Budgets on the wire: a real proxy process between a test client and a real agent process
that streams known cost, token and tool-call figures (v1 and v2; every update the client
receives, the proxy's notices included, validated against the official schemas)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from acp_schema import validate_v1, validate_v1_message, validate_v2, validate_v2_message
from proxy_harness import REPO, TESTS, Lines, proxy_env, write_config

pytestmark = pytest.mark.anyio
AGENT = TESTS / "budget_agent.py"
CONFIG = """\
budgets:
  state: {state}
  limits:
    - name: session-cost
      meter: cost
      max: 1.00
      warn_at: [0.5]
    - name: loop-guard
      meter: repeated_tool_call
      max: 5
      action: cancel_turn
"""


def cost(amount: float) -> dict[str, Any]:
    return {
        "sessionUpdate": "usage_update",
        "used": 1200,
        "size": 200000,
        "cost": {"amount": amount, "currency": "USD"},
    }


def chunk(text: str, version: int) -> dict[str, Any]:
    update: dict[str, Any] = {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": text},
    }
    if version == 2:
        update["messageId"] = "m1"
    return update


def tool_call(i: int, version: int, command: str) -> dict[str, Any]:
    update: dict[str, Any] = {
        "sessionUpdate": "tool_call" if version == 1 else "tool_call_update",
        "toolCallId": f"call_{i}",
        "title": f"Run {command}",
        "kind": "execute",
        "status": "pending",
        "rawInput": {"command": command},
    }
    return update


class Client:
    """The editor: prompts out, every line in; each ``session/update`` validated."""

    def __init__(self, process: anyio.abc.Process, version: int) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self.version = version
        self.lines = Lines(process.stdout)
        self.updates: list[dict[str, Any]] = []
        self.next_id = 10

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(orjson.dumps(message) + b"\n")

    async def read(self) -> dict[str, Any]:
        message: dict[str, Any] = orjson.loads(await self.lines.line())
        if message.get("method") == "session/update":
            (validate_v1_message if self.version == 1 else validate_v2_message)(message)
            self.updates.append(message["params"]["update"])
        return message

    async def call(self, method: str, params: Any) -> dict[str, Any]:
        rid = self.next_id = self.next_id + 1
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        with anyio.fail_after(15):
            while True:
                message = await self.read()
                if message.get("id") == rid and "method" not in message:
                    return message

    async def turn(self, script: dict[str, Any], sid: str = "sess_1") -> dict[str, Any]:
        """One prompt: the prompt's response (v1) or, when v2 accepted it, the idle update."""
        text = orjson.dumps(script).decode()
        prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
        (validate_v1 if self.version == 1 else validate_v2)("PromptRequest", prompt)
        self.updates = []
        response = await self.call("session/prompt", prompt)
        if self.version == 1 or "error" in response:
            return response
        with anyio.fail_after(15):
            while True:
                message = await self.read()
                update = message.get("params", {}).get("update", {})
                if update.get("sessionUpdate") == "state_update" and update["state"] == "idle":
                    return message

    def notices(self) -> list[str]:
        """The titles of the proxy's notices in the last turn."""
        out = []
        for update in self.updates:
            meta = update.get("_meta") or {}
            if "acp-proxy/notice" not in meta:
                continue
            if update["sessionUpdate"] == "notice":
                out.append(update["title"])
            else:
                out.append(update["content"]["text"].strip().removeprefix("[acp-proxy] "))
        return out


async def start(tmp_path: Path, version: int, config: str | None = None) -> Client:
    state = tmp_path / "budgets.json"
    path = write_config(tmp_path / "b.yaml", config or CONFIG.format(state=state))
    process = await anyio.open_process(
        [
            sys.executable,
            "-m",
            "acp_proxy",
            "--config",
            path,
            "--",
            sys.executable,
            str(AGENT),
            str(version),
        ],
        env=proxy_env(),
        cwd=str(REPO),
    )
    client = Client(process, version)
    await client.call("initialize", {"protocolVersion": version, "clientCapabilities": {}})
    await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
    return client


async def finish(client: Client) -> None:
    assert client.process.stdin is not None
    await client.process.stdin.aclose()
    with anyio.fail_after(15):
        assert await client.process.wait() == 0


async def stats(client: Client) -> dict[str, int]:
    return (await client.call("_test/stats", {}))["result"]  # type: ignore[no-any-return]


def stop_reason(end: dict[str, Any]) -> str:
    if "result" in end:
        return end["result"]["stopReason"]  # type: ignore[no-any-return]
    return end["params"]["update"]["stopReason"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("version", [1, 2])
async def test_a_limit_crossed_mid_turn_refuses_exactly_the_next_prompt(
    tmp_path: Path, version: int
) -> None:
    client = await start(tmp_path, version)
    end = await client.turn(
        {
            "updates": [
                cost(0.0),
                chunk("working", version),
                cost(0.40),
                cost(0.55),  # past 50%: a warning
                chunk("still working", version),
                cost(1.25),  # past the limit: the turn goes on to its end
                chunk("done", version),
            ]
        }
    )
    assert stop_reason(end) == "end_turn"
    assert client.notices() == [
        'Budget "session-cost" at 50% (cost 0.55 of 1.00)',
        'Budget "session-cost" reached (cost 1.25 of 1.00): the running turn finishes and the '
        "next prompt will be refused",
    ]
    texts = [u["content"]["text"] for u in client.updates if "_meta" not in u and "content" in u]
    assert texts == ["working", "still working", "done"]  # the agent's own output, all of it
    refused = await client.turn({"updates": [chunk("must not run", version)]})
    assert refused["error"] == {
        "code": -32003,
        "message": 'acp-proxy budgets: prompt refused: the limit "session-cost" is reached '
        "(cost 1.25 of 1.00)",
        "data": {
            "poolId": "acp-proxy/session-cost",
            "meterId": "cost",
            "resetsAt": None,
            "retryAfter": None,
            "spent": 1.25,
            "max": 1.0,
        },
    }
    validate_v2("Error", refused["error"])
    validate_v1("Error", refused["error"])
    assert await stats(client) == {"prompts": 1, "cancels": 0}  # refused: never sent
    # Another session has a budget of its own.
    await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
    end = await client.turn({"updates": [cost(0.1)]}, sid="sess_2")
    assert stop_reason(end) == "end_turn"
    await finish(client)
    state = orjson.loads((tmp_path / "budgets.json").read_bytes())
    assert state["limits"]["session-cost"]["spend"]["sess_1"]["spent"] == 1.25
    assert os.stat(tmp_path / "budgets.json").st_mode & 0o777 == 0o600


@pytest.mark.parametrize("version", [1, 2])
async def test_the_loop_guard_cancels_the_sixth_identical_call_once(
    tmp_path: Path, version: int
) -> None:
    client = await start(tmp_path, version)
    different = [tool_call(i, version, f"ls dir{i}") for i in range(6)]
    end = await client.turn({"updates": different})
    assert stop_reason(end) == "end_turn" and client.notices() == []
    same = [tool_call(10 + i, version, "ls") for i in range(8)]
    end = await client.turn({"updates": same, "await_cancel": True})
    assert stop_reason(end) == "cancelled"
    assert client.notices() == [
        'Budget "loop-guard" reached (repeated_tool_call 6 of 5): the running turn is '
        "cancelled and the next prompt will be refused"
    ]
    assert await stats(client) == {"prompts": 2, "cancels": 1}
    refused = await client.turn({"updates": []})
    assert refused["error"]["data"]["poolId"] == "acp-proxy/loop-guard"
    assert await stats(client) == {"prompts": 2, "cancels": 1}
    await finish(client)


async def test_spend_survives_a_restart_and_a_raised_limit_resumes(tmp_path: Path) -> None:
    client = await start(tmp_path, 1)
    await client.turn({"updates": [cost(0.0), cost(1.5)]})
    await finish(client)
    client = await start(tmp_path, 1)  # a new proxy, the same state file
    assert "error" in await client.turn({"updates": []})
    ran = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "acp_proxy",
            "budgets",
            "set",
            "session-cost",
            "2",
            "--state",
            str(tmp_path / "budgets.json"),
        ],
        env=proxy_env(),
        cwd=str(REPO),
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.decode() == (
        f"{tmp_path / 'budgets.json'}: session-cost: max 2 (running proxies see it before "
        "their next prompt)\n"
    )
    end = await client.turn({"updates": [cost(1.6)]})  # the same session, resumed
    assert stop_reason(end) == "end_turn"
    assert await stats(client) == {"prompts": 1, "cancels": 0}
    await finish(client)
    shown = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "acp_proxy",
            "budgets",
            "show",
            "--config",
            str(tmp_path / "b.yaml"),
        ],
        env=proxy_env(),
        cwd=str(REPO),
    )
    rows = [line.split() for line in shown.stdout.decode().splitlines()]
    assert rows[0] == [
        "limit",
        "key",
        "meter",
        "spent",
        "max",
        "remaining",
        "window",
        "resets",
        "at",
        "state",
    ]
    assert ["session-cost", "sess_1", "cost", "1.6", "2", "(set)", "0.4", "-", "-", "ok"] in rows


async def test_an_unwritable_state_file_refuses_prompts_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "budgets.json"
    client = await start(tmp_path, 2, CONFIG.format(state=missing))
    refused = await client.turn({"updates": []})
    assert refused["error"]["message"] == (
        "acp-proxy budgets: prompt refused: the budget state cannot be recorded "
        f"({missing}: No such file or directory)"
    )
    validate_v2("Error", refused["error"])
    assert await stats(client) == {"prompts": 0, "cancels": 0}
    await finish(client)


async def test_events_share_the_policy_audit_file_and_its_chain(tmp_path: Path) -> None:
    from acp_proxy.policy.audit import verify

    audit = tmp_path / "audit.jsonl"
    config = CONFIG.format(state=tmp_path / "budgets.json") + f"policy:\n  audit: {audit}\n"
    client = await start(tmp_path, 1, config)
    await client.turn({"updates": [cost(0.0), cost(0.6), cost(1.1)]})
    await client.turn({"updates": []})
    await finish(client)
    lines = audit.read_bytes().splitlines()
    events = [orjson.loads(line) for line in lines]
    assert [(e["event"], e.get("limit"), e.get("spent")) for e in events] == [
        ("budget.warning", "session-cost", 0.6),
        ("budget.reached", "session-cost", 1.1),
        ("budget.refused", "session-cost", 1.1),
    ]
    assert events[2]["session"] == "sess_1" and events[2]["max"] == 1.0
    checked = verify(lines)
    assert (checked.broken, checked.lines) == (None, 3)
