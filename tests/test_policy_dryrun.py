"""The policy beyond one stdio session's requests: ``acp-proxy policy test`` over a session
recorded without a policy, ``--listen``, where every connection gets the policy link and all of
them write one audit chain, and the tool calls that ran unasked (audited; with ``on_unasked:
cancel``, the agent process gets a ``session/cancel``)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import anyio
import anyio.abc
import orjson
import pytest
from acp_schema import validate_v2
from proxy_harness import REPO, proxy_env, write_config
from test_policy_proxy import (
    AGENT,
    CLAUDE,
    CODEX,
    GEMINI,
    POLICY,
    Client,
    finish,
    notify,
    permission,
    req,
    selected,
    session,
)

from acp_proxy.policy.audit import verify

pytestmark = pytest.mark.anyio


def policy_test(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", "policy", "test", *args],
        capture_output=True, text=True, env=proxy_env(), cwd=str(REPO), timeout=30, check=False,
    )  # fmt: skip


async def test_policy_test_over_a_recorded_session(tmp_path: Path) -> None:
    record = tmp_path / "rec.jsonl"
    process, client, _ = await session(
        tmp_path, 1, "claude-code", proxy_args=("--record", str(record))
    )
    cwd = str(tmp_path.resolve())
    rm = {"toolCallId": "toolu_01", "title": "rm", "kind": "execute", "status": "pending",
          "rawInput": {"command": "rm -rf build"}}  # fmt: skip
    read = {"toolCallId": "r1", "kind": "read", "locations": [{"path": f"{cwd}/.env"}]}
    await client.agent_sends(
        notify({"sessionUpdate": "tool_call", **rm}),
        permission(10, {"toolCallId": "toolu_01"}, CLAUDE),
        permission(11, read, GEMINI),
        req(12, "fs/read_text_file", {"sessionId": "sess_1", "path": f"{cwd}/src/a.py"}),
    )
    # Without a policy, every request reached the client.
    assert [orjson.loads(f)["id"] for f in client.forwarded] == [10, 11, 12]
    await client.call(
        13, "session/set_mode", {"sessionId": "sess_1", "modeId": "bypassPermissions"}
    )
    await finish(process)

    ran = policy_test("--config", str(tmp_path / "p.yaml"), str(record))
    assert (ran.returncode, ran.stderr) == (0, "")
    lines = ran.stdout.splitlines()
    assert [line.split(": ", 1)[1] if ": " in line else line for line in lines] == [
        "session/request_permission [kind execute; argv rm -rf build]: deny by "
        "no-recursive-delete, option reject",
        f"session/request_permission [kind read; paths {cwd}/.env]: deny by no-secrets, "
        "option cancel",
        f"fs/read_text_file [kind read; paths {cwd}/src/a.py]: allow by read-in-workspace",
        "session/set_mode [mode bypassPermissions]: deny by forbid_modes",
    ]
    assert all(line.startswith(f"{record}:session 1:t=") for line in lines)

    as_json = policy_test("--json", "--config", str(tmp_path / "p.yaml"), str(record))
    decided = [orjson.loads(line) for line in as_json.stdout.splitlines()]
    assert [(d["method"], d["rule"], d["decision"], d["option"]) for d in decided] == [
        ("session/request_permission", "no-recursive-delete", "deny", "reject"),
        ("session/request_permission", "no-secrets", "deny", "cancel"),
        ("fs/read_text_file", "read-in-workspace", "allow", None),
        ("session/set_mode", "forbid_modes", "deny", None),
    ]
    assert {(d["record"], d["record_session"], d["session"], d["agent"]) for d in decided} == {
        (str(record), 1, "sess_1", "claude-code")
    }

    no_policy = tmp_path / "none.yaml"
    no_policy.write_text("rules: []\n", encoding="utf-8")
    refused = policy_test("--config", str(no_policy), str(record))
    assert (refused.returncode, refused.stderr) == (
        2,
        f"acp-proxy policy test: {no_policy} has no policy: section\n",
    )


class _Socket:
    """A client connection as ``Client`` drives a process: ``stdin`` to send, ``stdout`` to
    read."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stdin = self.stdout = stream


async def test_every_listen_connection_has_the_policy_and_shares_the_audit(
    tmp_path: Path,
) -> None:
    audit = tmp_path / "audit.jsonl"
    config = write_config(tmp_path / "p.yaml", POLICY.format(mode="enforce", audit=audit))
    sock = tmp_path / "proxy.sock"
    cmd = [sys.executable, "-m", "acp_proxy", "--config", config, "--listen", f"unix://{sock}",
           "--", sys.executable, str(AGENT), "1", "codex"]  # fmt: skip
    rm = {"toolCallId": "x", "kind": "execute", "rawInput": {"command": ["rm", "-rf", "/"]}}
    async with await anyio.open_process(
        cmd, env=proxy_env(), cwd=str(REPO), stdin=subprocess.DEVNULL
    ) as proc:
        try:
            with anyio.fail_after(20):
                while not sock.exists():
                    await anyio.sleep(0.02)
                for n in range(2):
                    stream = await anyio.connect_unix(str(sock))
                    async with stream:
                        client = Client(_Socket(stream))  # type: ignore[arg-type]
                        await client.call(0, "initialize", {"protocolVersion": 1})
                        await client.call(1, "session/new", {"cwd": str(tmp_path)})
                        got = await client.agent_sends(permission(n, rm, CODEX))
                        assert got[0]["result"] == selected("abort")
                        assert client.forwarded == []
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
    lines = audit.read_bytes().splitlines()
    assert [orjson.loads(line)["rule"] for line in lines] == ["no-recursive-delete"] * 2
    assert verify(lines).broken is None


async def test_a_denied_tool_call_that_ran_without_asking_is_audited(tmp_path: Path) -> None:
    process, client, audit = await session(tmp_path, 1, "claude-code")
    cwd = str(tmp_path.resolve())
    ran = {"toolCallId": "t1", "title": "rm", "kind": "execute", "status": "pending",
           "rawInput": {"command": "rm -rf build"}}  # fmt: skip
    asked = {**ran, "toolCallId": "t2"}
    read = {"toolCallId": "t3", "kind": "read", "status": "pending",
            "locations": [{"path": f"{cwd}/a.py"}]}  # fmt: skip
    done = {"sessionUpdate": "tool_call_update", "status": "completed"}
    await client.agent_sends(
        notify({"sessionUpdate": "tool_call", **ran}),
        notify({**done, "toolCallId": "t1", "status": "in_progress"}),
        notify({**done, "toolCallId": "t1"}),  # reported once
        notify({"sessionUpdate": "tool_call", **asked}),
        permission(20, {"toolCallId": "t2"}, CLAUDE),
        notify({**done, "toolCallId": "t2"}),  # it asked: the answer was the decision
        notify({"sessionUpdate": "tool_call", **read}),
        notify({**done, "toolCallId": "t3"}),  # unasked, but no deny rule matches
    )
    await finish(process)
    lines = [orjson.loads(line) for line in audit.read_bytes().splitlines()]
    assert [
        (a["method"], a["rule"], a["decision"], a["option"], a["forwarded"]) for a in lines
    ] == [
        ("session/update", "no-recursive-delete", "deny", None, True),
        ("session/request_permission", "no-recursive-delete", "deny", "reject", False),
    ]
    assert lines[0]["summary"] == {"kind": "execute", "argv": ["rm", "-rf", "build"], "title": "rm"}


async def test_on_unasked_cancel_cancels_the_session_at_the_agent(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    text = POLICY.format(mode="enforce", audit=audit).replace(
        "  forbid_modes:", "  on_unasked: cancel\n  forbid_modes:"
    )
    config = write_config(tmp_path / "cancel.yaml", text)
    process, client, _ = await session(tmp_path, 2, "claude-agent", proxy_args=("--config", config))
    ran = {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "t9",
        "title": "rm",
        "kind": "execute",
        "status": "in_progress",
        "rawInput": {"command": "rm -rf /"},
    }
    validate_v2("UpdateSessionNotification", notify(ran)["params"])
    await client.agent_sends(notify(ran), notify({**ran, "status": "completed"}))
    got = await client.call("n", "_test/notes", {})
    cancel = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "sess_1"}}
    assert got["result"]["notes"] == [cancel]  # once, for the call that ran unasked
    validate_v2("CancelSessionNotification", cancel["params"])
    await finish(process)
    (line,) = [orjson.loads(raw) for raw in audit.read_bytes().splitlines()]
    assert (line["method"], line["rule"], line["cancelled"]) == (
        "session/update",
        "no-recursive-delete",
        True,
    )
