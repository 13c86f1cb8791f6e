"""``acp-proxy policy test``: a session recorded without a policy, replayed through one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from proxy_harness import REPO, proxy_env
from test_policy_proxy import CLAUDE, GEMINI, finish, notify, permission, req, session

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
