"""The policy on the wire: a real proxy process between a test client and a real agent process.

Fixtures are shaped like the requests real agents send (Claude's, Codex's and Gemini's option
ids differ) and validated against the official schemas; every decision, the mode guard, the
fs / terminal guard, monitor mode and the audit chain are checked on the bytes that cross.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from acp_schema import validate_v1, validate_v2
from proxy_harness import REPO, TESTS, Lines, proxy_env, run, write_config

from acp_proxy.policy.audit import verify

pytestmark = pytest.mark.anyio
AGENT = TESTS / "policy_agent.py"
POLICY = """\
policy:
  mode: {mode}
  audit: {audit}
  forbid_modes: [bypassPermissions]
  rules:
    - name: no-recursive-delete
      match: {{kind: execute, command: ["rm", "-rf"]}}
      decision: deny
    - name: read-in-workspace
      match: {{kind: read, paths: ["{{cwd}}/**"]}}
      decision: allow
    - name: no-secrets
      match: {{paths: ["**/.env"]}}
      decision: deny
    - name: writes-stay-home
      match: {{method: fs/write_text_file, paths_outside: ["{{cwd}}/**"]}}
      decision: deny
    - name: tests-always
      match: {{kind: execute, command: "make test", agent: "claude*"}}
      decision: allow
      remember: true
"""
CLAUDE = [
    {"optionId": "allow_always", "name": "Always Allow", "kind": "allow_always"},
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]
CODEX = [
    {"optionId": "approved", "name": "Yes", "kind": "allow_once"},
    {"optionId": "approved-for-session", "name": "Always", "kind": "allow_always"},
    {"optionId": "abort", "name": "No, and tell Codex", "kind": "reject_once"},
]
GEMINI = [
    {"optionId": "proceed_always", "name": "Allow All Edits", "kind": "allow_always"},
    {"optionId": "proceed_once", "name": "Allow", "kind": "allow_once"},
    {"optionId": "cancel", "name": "Reject", "kind": "reject_once"},
]


def notify(update: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": "sess_1", "update": update},
    }


def req(rid: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def permission(rid: Any, call: dict[str, Any], options: Any, version: int = 1) -> dict[str, Any]:
    params: dict[str, Any] = {"sessionId": "sess_1", "options": options}
    if version == 1:
        params["toolCall"] = call
        validate_v1("RequestPermissionRequest", params)
    else:
        params.update(title="Allow?", subject=call)
        validate_v2("RequestPermissionRequest", params)
    return req(rid, "session/request_permission", params)


def selected(option: str) -> dict[str, Any]:
    return {"outcome": {"outcome": "selected", "optionId": option}}


class Client:
    """The editor's side of a proxy process: requests out, every line in recorded."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self.lines = Lines(process.stdout)
        self.forwarded: list[bytes] = []  # agent requests that reached the client, as bytes

    async def call(self, rid: Any, method: str, params: Any) -> dict[str, Any]:
        """Send a request; answer every agent request that reaches the client (its last
        option, or an empty result) until the response to ``rid`` comes."""
        assert self.process.stdin is not None
        await self.process.stdin.send(orjson.dumps(req(rid, method, params)) + b"\n")
        with anyio.fail_after(10):
            while True:
                raw = await self.lines.line()
                message = orjson.loads(raw)
                if message.get("id") == rid and "method" not in message:
                    return message  # type: ignore[no-any-return]
                if "method" in message and "id" in message:
                    self.forwarded.append(raw)
                    result: Any = {}
                    options = message.get("params", {}).get("options")
                    if message["method"] == "session/request_permission" and options:
                        result = selected(options[-1]["optionId"])
                    answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
                    await self.process.stdin.send(orjson.dumps(answer) + b"\n")

    async def agent_sends(self, *frames: dict[str, Any]) -> list[dict[str, Any]]:
        """The agent writes ``frames``; what it got back for each of its requests."""
        response = await self.call("send", "_test/send", {"frames": list(frames)})
        return response["result"]["got"]  # type: ignore[no-any-return]


async def session(
    tmp_path: Path,
    version: int,
    name: str,
    mode: str = "enforce",
    proxy_args: tuple[str, ...] | None = None,
) -> tuple[anyio.abc.Process, Client, Path]:
    """A proxy with the test policy (``proxy_args``: these options instead), a session open."""
    audit = tmp_path / "audit.jsonl"
    config = write_config(tmp_path / "p.yaml", POLICY.format(mode=mode, audit=audit))
    process = await anyio.open_process(
        [
            sys.executable,
            "-m",
            "acp_proxy",
            *(("--config", config) if proxy_args is None else proxy_args),
            "--",
            sys.executable,
            str(AGENT),
            str(version),
            name,
        ],
        env=proxy_env(),
        cwd=str(REPO),
    )
    client = Client(process)
    await client.call(0, "initialize", {"protocolVersion": version, "clientCapabilities": {}})
    await client.call(1, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
    return process, client, audit


async def finish(process: anyio.abc.Process) -> None:
    assert process.stdin is not None
    await process.stdin.aclose()
    with anyio.fail_after(10):
        assert await process.wait() == 0


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def test_v1_permissions_from_claude_codex_gemini(tmp_path: Path) -> None:
    process, client, audit = await session(tmp_path, 1, "claude-code")
    cwd = str(tmp_path.resolve())
    rm_call = {
        "sessionUpdate": "tool_call",
        "toolCallId": "toolu_01",
        "title": "`rm -rf build`",
        "kind": "execute",
        "status": "pending",
        "rawInput": {"command": "rm -rf build", "description": "Remove the build directory"},
    }
    validate_v1("SessionNotification", notify(rm_call)["params"])
    edit = {"toolCallId": "e1", "title": "Edit a.py", "kind": "edit", "status": "pending"}
    got = await client.agent_sends(
        notify(rm_call),
        # Claude asks with only the id: the kind and command come from the update above.
        permission(10, {"toolCallId": "toolu_01"}, CLAUDE),
        # Codex sends the whole call; a read in the workspace is allowed.
        permission(
            11,
            {
                "toolCallId": "call_2",
                "title": "Read src/a.py",
                "kind": "read",
                "locations": [{"path": f"{cwd}/src/a.py"}],
            },
            CODEX,
        ),
        # Gemini reads .env in the workspace: allow and deny match, deny wins.
        permission(
            12,
            {
                "toolCallId": "read_file-3",
                "title": "ReadFile .env",
                "kind": "read",
                "locations": [{"path": f"{cwd}/.env"}],
            },
            GEMINI,
        ),
        # remember: true picks allow_always.
        permission(
            13,
            {"toolCallId": "t4", "kind": "execute", "rawInput": {"command": "make test -j4"}},
            CLAUDE,
        ),
        # Nothing matches: the default (ask) forwards it to the editor unchanged.
        permission(14, edit, CLAUDE),
    )
    assert [g["result"] for g in got] == [
        selected("reject"),
        selected("approved"),
        selected("cancel"),
        selected("allow_always"),
        selected("reject"),  # the test client's answer: the request reached it
    ]
    for answer in got:
        validate_v1("RequestPermissionResponse", answer["result"])
    assert client.forwarded == [orjson.dumps(permission(14, edit, CLAUDE)) + b"\n"]
    await finish(process)
    lines = audit_lines(audit)
    assert [
        (a["method"], a["rule"], a["decision"], a["option"], a["forwarded"]) for a in lines
    ] == [
        ("session/request_permission", "no-recursive-delete", "deny", "reject", False),
        ("session/request_permission", "read-in-workspace", "allow", "approved", False),
        ("session/request_permission", "no-secrets", "deny", "cancel", False),
        ("session/request_permission", "tests-always", "allow", "allow_always", False),
        ("session/request_permission", None, "ask", None, True),
    ]
    assert lines[0]["summary"] == {
        "kind": "execute",
        "argv": ["rm", "-rf", "build"],
        "title": "`rm -rf build`",
    }
    assert {(a["session"], a["agent"], a["mode"]) for a in lines} == {
        ("sess_1", "claude-code", "enforce")
    }
    assert verify(audit.read_bytes().splitlines()).broken is None
    assert audit.stat().st_mode & 0o777 == 0o600


async def test_a_malformed_permission_request_is_forwarded(tmp_path: Path) -> None:
    process, client, audit = await session(tmp_path, 1, "claude-code")
    rm = {"toolCallId": "x", "kind": "execute", "rawInput": {"command": "rm -rf /"}}
    frames = (
        req(60, "session/request_permission", {"sessionId": "sess_1", "toolCall": rm}),
        req(61, "session/request_permission", {"sessionId": "sess_1", "toolCall": "rm -rf /"}),
        req(62, "session/request_permission", {"toolCall": rm, "options": CLAUDE}),
        req(
            63, "session/request_permission", {"sessionId": "sess_1", "toolCall": rm, "options": []}
        ),
    )
    got = await client.agent_sends(*frames)
    assert [g["id"] for g in got] == [60, 61, 62, 63]
    assert client.forwarded == [orjson.dumps(f) + b"\n" for f in frames]
    await finish(process)
    # Unreadable requests are not decisions; the deny without options to answer with is
    # audited as ask.
    assert [(a["rule"], a["decision"]) for a in audit_lines(audit)] == [
        ("no-recursive-delete", "ask"),
        ("no-recursive-delete", "ask"),
    ]


async def test_an_audit_file_that_cannot_be_opened_stops_the_start(tmp_path: Path) -> None:
    audit = tmp_path / "missing-dir" / "audit.jsonl"
    config = write_config(tmp_path / "p.yaml", POLICY.format(mode="enforce", audit=audit))
    cmd = [sys.executable, "-m", "acp_proxy", "--config", config, "--", sys.executable, str(AGENT)]
    ran = await run(cmd, env=proxy_env())
    assert ran.rc == 2
    assert ran.stderr.decode().endswith(
        f"acp-proxy: policy.audit {audit}: No such file or directory\n"
    )


async def test_options_without_allow_once_or_reject_once(tmp_path: Path) -> None:
    process, client, audit = await session(tmp_path, 1, "gemini-cli")
    cwd = str(tmp_path.resolve())
    no_allow_once = [CLAUDE[0], CLAUDE[2]]
    no_reject_once = [
        GEMINI[1],
        {"optionId": "never", "name": "Never", "kind": "reject_always"},
    ]
    read = {"toolCallId": "r", "kind": "read", "locations": [{"path": f"{cwd}/a.py"}]}
    rm = {"toolCallId": "x", "kind": "execute", "rawInput": {"command": ["rm", "-rf", "/"]}}
    got = await client.agent_sends(
        permission("a", read, no_allow_once),  # allow, but no allow_once: ask
        permission("b", rm, no_reject_once),  # deny, but no reject_once: cancelled
    )
    assert [g["result"] for g in got] == [
        selected("reject"),  # the test client's answer
        {"outcome": {"outcome": "cancelled"}},
    ]
    assert client.forwarded == [orjson.dumps(permission("a", read, no_allow_once)) + b"\n"]
    await finish(process)
    assert [(a["decision"], a["option"]) for a in audit_lines(audit)] == [
        ("ask", None),
        ("deny", None),
    ]


async def test_fs_terminal_and_mode_guards(tmp_path: Path) -> None:
    process, client, audit = await session(tmp_path, 1, "codex")
    cwd = str(tmp_path.resolve())
    frames = (
        req(20, "fs/read_text_file", {"sessionId": "sess_1", "path": f"{cwd}/.env"}),
        req(21, "fs/read_text_file", {"sessionId": "sess_1", "path": f"{cwd}/src/a.py"}),
        req(22, "fs/write_text_file", {"sessionId": "sess_1", "path": "/tmp/x", "content": "y"}),
        req(
            23,
            "terminal/create",
            {"sessionId": "sess_1", "command": "rm", "args": ["-rf", "/"], "cwd": cwd},
        ),
        # A relative path is taken against the session's cwd: it climbs out, and is refused.
        req(24, "fs/write_text_file", {"sessionId": "sess_1", "path": "../o", "content": ""}),
    )
    for frame, name in zip(
        frames,
        ["Read", "Read", "Write", "CreateTerminal", "Write"],
        strict=True,
    ):
        validate_v1(
            f"{name}{'TextFile' if name != 'CreateTerminal' else ''}Request", frame["params"]
        )
    got = await client.agent_sends(*frames)
    denied = 'acp-proxy policy: {} denied by rule "{}"'
    assert got == [
        {
            "jsonrpc": "2.0",
            "id": 20,
            "error": {"code": -32001, "message": denied.format("fs/read_text_file", "no-secrets")},
        },
        {"jsonrpc": "2.0", "id": 21, "result": {}},
        {
            "jsonrpc": "2.0",
            "id": 22,
            "error": {
                "code": -32001,
                "message": denied.format("fs/write_text_file", "writes-stay-home"),
            },
        },
        {
            "jsonrpc": "2.0",
            "id": 23,
            "error": {
                "code": -32001,
                "message": denied.format("terminal/create", "no-recursive-delete"),
            },
        },
        {
            "jsonrpc": "2.0",
            "id": 24,
            "error": {
                "code": -32001,
                "message": denied.format("fs/write_text_file", "writes-stay-home"),
            },
        },
    ]
    assert client.forwarded == [orjson.dumps(frames[1]) + b"\n"]
    # The mode guard: the client's switch to a forbidden mode never reaches the agent.
    forbidden = {"sessionId": "sess_1", "modeId": "bypassPermissions"}
    validate_v1("SetSessionModeRequest", forbidden)
    assert await client.call(30, "session/set_mode", forbidden) == {
        "jsonrpc": "2.0",
        "id": 30,
        "error": {
            "code": -32001,
            "message": 'acp-proxy policy: mode "bypassPermissions" is forbidden (forbid_modes)',
        },
    }
    allowed = {"sessionId": "sess_1", "modeId": "default"}
    assert (await client.call(31, "session/set_mode", allowed))["result"] == {"echo": allowed}
    option = {"sessionId": "sess_1", "configId": "mode", "value": "bypassPermissions"}
    validate_v1("SetSessionConfigOptionRequest", option)
    assert (await client.call(32, "session/set_config_option", option))["error"]["code"] == -32001
    await finish(process)
    assert [(a["method"], a["decision"], a["forwarded"]) for a in audit_lines(audit)] == [
        ("fs/read_text_file", "deny", False),
        ("fs/read_text_file", "allow", True),
        ("fs/write_text_file", "deny", False),
        ("terminal/create", "deny", False),
        ("fs/write_text_file", "deny", False),
        ("session/set_mode", "deny", False),
        ("session/set_config_option", "deny", False),
    ]


async def test_v2_subjects(tmp_path: Path) -> None:
    process, client, audit = await session(tmp_path, 2, "claude-agent")
    v2_options = [
        {"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
        {"optionId": "deny", "name": "Deny", "kind": "reject_once"},
    ]
    tool = {
        "type": "tool_call",
        "toolCall": {
            "toolCallId": "call_001",
            "title": "Clean",
            "kind": "execute",
            "status": "pending",
            "rawInput": {"command": "rm -rf out"},
        },
    }
    command = {"type": "command", "command": "rm -rf /", "cwd": str(tmp_path)}
    unknown = {"type": "mcp_elicitation", "server": "x"}
    params = {"sessionId": "sess_1", "title": "Allow?", "subject": unknown, "options": v2_options}
    got = await client.agent_sends(
        permission(40, tool, v2_options, 2),
        permission(41, command, v2_options, 2),
        req(42, "session/request_permission", params),
    )
    assert [g["result"] for g in got] == [selected("deny"), selected("deny"), selected("deny")]
    for answer in got:
        validate_v2("RequestPermissionResponse", answer["result"])
    # An unknown subject is the editor's to decide, its bytes unchanged.
    assert client.forwarded == [orjson.dumps(req(42, "session/request_permission", params)) + b"\n"]
    option = {"sessionId": "sess_1", "configId": "mode", "type": "id", "value": "bypassPermissions"}
    validate_v2("SetSessionConfigOptionRequest", option)
    assert (await client.call(43, "session/set_config_option", option))["error"]["code"] == -32001
    await finish(process)
    assert [a["rule"] for a in audit_lines(audit)] == [
        "no-recursive-delete",
        "no-recursive-delete",
        "forbid_modes",
    ]


async def test_monitor_mode_decides_audits_and_forwards(tmp_path: Path) -> None:
    process, client, audit = await session(tmp_path, 1, "claude-code", mode="monitor")
    rm = {"toolCallId": "x", "kind": "execute", "rawInput": {"command": "rm -rf build"}}
    frames = (
        permission(50, rm, CLAUDE),
        req(51, "fs/read_text_file", {"sessionId": "sess_1", "path": f"{tmp_path}/.env"}),
    )
    got = await client.agent_sends(*frames)
    assert [g.get("result") for g in got] == [selected("reject"), {}]
    assert client.forwarded == [orjson.dumps(f) + b"\n" for f in frames]
    forbidden = {"sessionId": "sess_1", "modeId": "bypassPermissions"}
    assert (await client.call(52, "session/set_mode", forbidden))["result"] == {"echo": forbidden}
    await finish(process)
    assert [
        (a["rule"], a["decision"], a["option"], a["mode"], a["forwarded"])
        for a in audit_lines(audit)
    ] == [
        ("no-recursive-delete", "deny", "reject", "monitor", True),
        ("no-secrets", "deny", None, "monitor", True),
        ("forbid_modes", "deny", None, "monitor", True),
    ]
