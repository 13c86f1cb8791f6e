"""The policy everywhere the proxy runs, each with a v1 and a v2 agent: ``--listen`` (a client
connection), ``--connect`` (the agent behind a socket) and ``acp-proxy component`` (behind the
spec conductor); stdio is tests/test_policy_proxy.py. Real processes: the scripted agent
(tests/policy_agent.py) asks the way Claude's, Codex's and Gemini's agents do (their option ids
differ), the fixtures are checked against the official schemas, and each decision is read on
the bytes the agent gets back and in the audit file."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import orjson
import pytest
from acp_schema import validate_v1
from proxy_harness import REPO, TIMEOUT, proxy_env, write_config
from test_policy_proxy import (
    AGENT,
    CLAUDE,
    CODEX,
    GEMINI,
    POLICY,
    Client,
    notify,
    permission,
    req,
    selected,
)

from acp_proxy.policy.audit import verify

pytestmark = pytest.mark.anyio
CONDUCTOR = Path(__file__).resolve().parent / "conductors" / "spec_conductor.py"


class _Stream:
    """A byte stream as ``Client`` drives a process: ``stdin`` to send, ``stdout`` to read."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stdin = self.stdout = stream


async def decisions(client: Client, version: int, cwd: str) -> None:
    """One session's requests, shaped per agent, and what each must get back."""
    await client.call(0, "initialize", {"protocolVersion": version, "clientCapabilities": {}})
    await client.call(1, "session/new", {"cwd": cwd, "mcpServers": []})
    if version == 1:
        rm = {
            "sessionUpdate": "tool_call",
            "toolCallId": "toolu_01",
            "title": "`rm -rf build`",
            "kind": "execute",
            "status": "pending",
            "rawInput": {"command": "rm -rf build"},
        }
        read = {
            "toolCallId": "read_file-2",
            "title": "ReadFile a.py",
            "kind": "read",
            "locations": [{"path": f"{cwd}/a.py"}],
        }
        secret = req(12, "fs/read_text_file", {"sessionId": "sess_1", "path": f"{cwd}/.env"})
        validate_v1("SessionNotification", notify(rm)["params"])
        validate_v1("ReadTextFileRequest", secret["params"])
        got = await client.agent_sends(
            notify(rm),
            permission(10, {"toolCallId": "toolu_01"}, CLAUDE),  # Claude: the id only
            permission(11, read, GEMINI),
            secret,
        )
        assert [g.get("result") for g in got[:2]] == [selected("reject"), selected("proceed_once")]
        assert got[2]["error"]["code"] == -32001
    else:
        call = {
            "toolCallId": "call_7",
            "title": "Run",
            "kind": "execute",
            "status": "pending",
            "rawInput": {"command": ["rm", "-rf", "dist"]},
        }
        read = {"toolCallId": "r2", "kind": "read", "locations": [{"path": f"{cwd}/src/b.py"}]}
        got = await client.agent_sends(
            permission(20, {"type": "tool_call", "toolCall": call}, CODEX, 2),
            permission(21, {"type": "tool_call", "toolCall": read}, GEMINI, 2),
            permission(22, {"type": "command", "command": "rm -rf /", "cwd": cwd}, CLAUDE, 2),
        )
        assert [g["result"] for g in got] == [
            selected("abort"),
            selected("proceed_once"),
            selected("reject"),
        ]
    assert client.forwarded == []  # every one was decided by the proxy


EXPECTED = {
    1: ["no-recursive-delete", "read-in-workspace", "no-secrets"],
    2: ["no-recursive-delete", "read-in-workspace", "no-recursive-delete"],
}


def check_audit(audit: Path, version: int, sessions: int = 1) -> None:
    lines = audit.read_bytes().splitlines()
    assert [orjson.loads(line)["rule"] for line in lines] == EXPECTED[version] * sessions
    assert verify(lines).broken is None


@contextlib.asynccontextmanager
async def proxy(cmd: list[str]) -> AsyncIterator[anyio.abc.Process]:
    async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
        try:
            yield proc
        finally:
            if proc.returncode is None:
                proc.kill()


async def wait_for(path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        while not path.exists():
            await anyio.sleep(0.02)


@pytest.mark.parametrize("version", [1, 2])
async def test_listen(tmp_path: Path, version: int) -> None:
    audit = tmp_path / "audit.jsonl"
    config = write_config(tmp_path / "p.yaml", POLICY.format(mode="enforce", audit=audit))
    sock = tmp_path / "proxy.sock"
    cmd = [sys.executable, "-m", "acp_proxy", "--config", config, "--listen", f"unix://{sock}",
           "--", sys.executable, str(AGENT), str(version), "claude-code"]  # fmt: skip
    async with proxy(cmd) as proc:
        await wait_for(sock)
        with anyio.fail_after(TIMEOUT):
            stream = await anyio.connect_unix(str(sock))
            async with stream:
                await decisions(Client(_Stream(stream)), version, str(tmp_path.resolve()))  # type: ignore[arg-type]
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
    check_audit(audit, version)


async def _bridge(client: anyio.abc.ByteStream, version: int) -> None:
    """One connection to the socket agent: a policy_agent process on its stdio."""
    argv = [sys.executable, str(AGENT), str(version), "codex"]
    async with await anyio.open_process(argv) as agent:
        assert agent.stdin is not None and agent.stdout is not None
        stdin, stdout = agent.stdin, agent.stdout

        async def to_agent() -> None:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                async for chunk in client:
                    await stdin.send(chunk)
            await stdin.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(to_agent)
            async for chunk in stdout:
                await client.send(chunk)
        await client.aclose()


@pytest.mark.parametrize("version", [1, 2])
async def test_connect(tmp_path: Path, version: int) -> None:
    audit = tmp_path / "audit.jsonl"
    config = write_config(tmp_path / "p.yaml", POLICY.format(mode="enforce", audit=audit))
    path = tmp_path / "agent.sock"
    listener = await anyio.create_unix_listener(path)
    async with listener, anyio.create_task_group() as serving:
        serving.start_soon(listener.serve, lambda s: _bridge(s, version))
        cmd = [sys.executable, "-m", "acp_proxy", "--config", config, "--connect",
               f"unix://{path}"]  # fmt: skip
        async with proxy(cmd) as proc:
            await decisions(Client(proc), version, str(tmp_path.resolve()))
            assert proc.stdin is not None
            await proc.stdin.aclose()
            with anyio.fail_after(TIMEOUT):
                assert await proc.wait() == 0
        serving.cancel_scope.cancel()
    check_audit(audit, version)


@pytest.mark.parametrize("version", [1, 2])
async def test_component(tmp_path: Path, version: int) -> None:
    audit = tmp_path / "audit.jsonl"
    config = write_config(tmp_path / "p.yaml", POLICY.format(mode="enforce", audit=audit))
    component = [sys.executable, "-m", "acp_proxy", "component", "--config", config]
    agent = [sys.executable, str(AGENT), str(version), "gemini-cli"]
    cmd = [sys.executable, str(CONDUCTOR), "--dialect", "official",
           json.dumps(component), json.dumps(agent)]  # fmt: skip
    async with proxy(cmd) as proc:
        await decisions(Client(proc), version, str(tmp_path.resolve()))
        assert proc.stdin is not None
        await proc.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            await proc.wait()
    check_audit(audit, version)
