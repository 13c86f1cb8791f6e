"""A permission request the policy answers is not a user's wait: the turn is counted, the
permission-wait histogram counts it under its own outcome (``policy``, at 0 s), and the
decision is counted by rule and outcome (the bundled v2 demo agent asks before it reads)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from proxy_harness import REPO, TIMEOUT, Lines, proxy_env
from telemetry_harness import LogReader, scrape

pytestmark = pytest.mark.anyio


def _send(message: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", **message}) + b"\n"


def _counts(samples: dict[Any, float], name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(v for _, v in labels): n
        for (sample, labels), n in samples.items()
        if sample == f"acp_proxy_{name}_count"
    }


def _sum(samples: dict[Any, float], name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(v for _, v in labels): n
        for (sample, labels), n in samples.items()
        if sample == f"acp_proxy_{name}_sum"
    }


def _total(samples: dict[Any, float], name: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(v for _, v in labels): n
        for (sample, labels), n in samples.items()
        if sample == f"acp_proxy_{name}"
    }


async def test_a_policy_answered_permission_is_not_a_user_wait(tmp_path: Path) -> None:
    config = tmp_path / "p.yaml"
    audit = tmp_path / "audit.jsonl"
    config.write_text(
        f"policy:\n  audit: {audit}\n  rules:\n"
        "    - {name: reads, match: {kind: read}, decision: allow}\n",
        encoding="utf-8",
    )
    agent = [sys.executable, "-m", "acp_proxy.demo.agent", "--ask-permission"]
    cmd = [sys.executable, "-m", "acp_proxy", "--log-format", "json", "--config", str(config),
           "--metrics", "tcp://127.0.0.1:0", "--", *agent]  # fmt: skip
    seen: list[dict[str, Any]] = []
    async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
        assert proc.stdin and proc.stdout and proc.stderr
        log = LogReader(proc.stderr)
        address = (await log.event("serving metrics"))["address"]
        out = Lines(proc.stdout)

        async def until(predicate: Any) -> dict[str, Any]:
            with anyio.fail_after(TIMEOUT):
                while True:
                    message: dict[str, Any] = orjson.loads(await out.line())
                    seen.append(message)
                    if predicate(message):
                        return message

        await proc.stdin.send(_send({"id": 0, "method": "initialize",
                                     "params": {"protocolVersion": 2}}))  # fmt: skip
        await until(lambda m: m.get("id") == 0)
        await proc.stdin.send(_send({"id": 1, "method": "session/new", "params": {"cwd": "/w"}}))
        session = (await until(lambda m: m.get("id") == 1))["result"]["sessionId"]
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "hi"}]}
        await proc.stdin.send(_send({"id": 2, "method": "session/prompt", "params": prompt}))
        await until(
            lambda m: (
                m.get("params", {}).get("update", {}).get("sessionUpdate") == "state_update"
                and m["params"]["update"].get("state") == "idle"
            )
        )
        samples = await scrape(address)
        await proc.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            assert await proc.wait() == 0
    # The agent's request never reached the client: the policy answered it.
    assert [m for m in seen if m.get("method") == "session/request_permission"] == []
    assert _counts(samples, "turn_duration_seconds") == {("end_turn",): 1}
    assert _counts(samples, "permission_wait_seconds") == {("policy",): 1}
    assert _sum(samples, "permission_wait_seconds") == {("policy",): 0.0}
    # (labels in name order: decision, outcome, rule)
    assert _total(samples, "policy_decisions_total") == {("allow", "answered", "reads"): 1}
    (line,) = audit.read_bytes().splitlines()
    assert (orjson.loads(line)["rule"], orjson.loads(line)["option"]) == ("reads", "allow")
