"""Session records: ``--record`` through the real proxy, real agent process and pipes.

What the record must hold: every frame of both directions, in order, byte-exact against what
each side wrote; ``sent`` exactly where the proxy changed a frame; generated frames marked;
secrets redacted in the record but never on the wire; complete lines after a SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import orjson
import pytest
from golden_harness import golden_sides
from proxy_harness import (
    GOLDEN,
    REPO,
    TIMEOUT,
    Lines,
    proxy_cmd,
    proxy_env,
    request,
    run,
    write_config,
)

from acp_proxy.meta.state import ClientModel
from acp_proxy.record.format import Redactor, frame_bytes

pytestmark = pytest.mark.anyio

SCHEMA = json.loads((REPO / "config" / "record.schema.json").read_text(encoding="utf-8"))
RULES = (
    "rules:\n"
    "  - name: route\n"
    "    match: {direction: agent_to_client, method: session/update, update: upserts}\n"
    "    set_meta: {example.dev/route: edge}\n"
)


def read_record(path: Path) -> list[dict[str, Any]]:
    """Every line of a record, each checked against config/record.schema.json."""
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    for line in lines:
        jsonschema.validate(line, SCHEMA)
    assert lines[0]["acp-proxy-record"] == 1
    return lines


def frames(lines: list[dict[str, Any]], direction: str) -> list[dict[str, Any]]:
    return [e for e in lines if e.get("dir") == direction and not e.get("generated")]


async def record_golden(tmp_path: Path, *extra: str) -> tuple[Path, Any, bytes, bytes, Path]:
    config = write_config(tmp_path / "rules.yaml", RULES)
    client, agent = golden_sides("session_v2.txt")
    record = tmp_path / "session.jsonl"
    agent_got = tmp_path / "agent_got.txt"
    ran = await run(
        proxy_cmd(
            "--config",
            config,
            "--record",
            str(record),
            *extra,
            agent=["--replay", str(GOLDEN / "session_v2.txt"), "--record", str(agent_got)],
        ),
        client,
    )
    assert ran.rc == 0, ran.stderr
    return record, ran, client, agent, agent_got


async def test_record_holds_every_frame_byte_exact_with_sent_where_changed(
    tmp_path: Path,
) -> None:
    record, ran, client, agent, agent_got = await record_golden(tmp_path)
    lines = read_record(record)
    head = lines[0]
    assert head["rules"] == ["route"]
    assert head["config"].endswith("rules.yaml")
    assert head["agent"][-4:] == [
        "--replay",
        str(GOLDEN / "session_v2.txt"),
        "--record",
        str(agent_got),
    ]
    c2a = frames(lines, "client_to_agent")
    a2c = frames(lines, "agent_to_client")
    # Every frame each side wrote, in order, byte for byte.
    assert [frame_bytes(e) + b"\n" for e in c2a] == client.splitlines(keepends=True)
    assert [frame_bytes(e) + b"\n" for e in a2c] == agent.splitlines(keepends=True)
    # What each receiver got is ``sent`` where present, else the frame: exactly the wire.
    delivered_to_agent = b"".join(
        b"".join(s.encode() + b"\n" for s in e["sent"]) if "sent" in e else frame_bytes(e) + b"\n"
        for e in c2a
    )
    assert delivered_to_agent == agent_got.read_bytes()
    delivered_to_client = b"".join(
        b"".join(s.encode() + b"\n" for s in e["sent"]) if "sent" in e else frame_bytes(e) + b"\n"
        for e in a2c
    )
    assert delivered_to_client == ran.stdout
    # ``sent`` exactly where the proxy changed a frame, and who changed it.
    changed = [e for e in a2c if "sent" in e]
    assert changed, "the rule annotates the golden session's upserts"
    for e in changed:
        assert e["sent"] != [e["raw"]]
        assert e["changed_by"] == ["rules:route"]
        assert any(b"example.dev/route" in s.encode() for s in e["sent"]), e
    assert all("sent" not in e for e in c2a)
    # The negotiated version, then the trailer with the exit status.
    [version] = [e for e in lines if e.get("event") == "version"]
    assert version["protocolVersion"] == 2
    end = lines[-1]
    assert end["event"] == "end"
    assert end["exit"] == {"code": 0, "signal": None, "status": "exited with status 0"}
    assert end["protocolVersion"] == 2
    times = [e["t"] for e in lines[1:]]
    assert times == sorted(times)


async def test_generated_errors_are_recorded_and_marked(tmp_path: Path) -> None:
    # The agent dies with a request in flight: the client gets a -32603 from the proxy, and the
    # record says the proxy wrote it.
    record = tmp_path / "r.jsonl"
    stdin = request(1, "initialize", {}) + request(2, "slow/thing", {})
    ran = await run(
        proxy_cmd("--record", str(record), agent=["--crash-after", "2", "--exit-code", "3"]),
        stdin,
    )
    assert ran.rc == 3
    lines = read_record(record)
    [generated] = [e for e in lines if e.get("generated")]
    assert generated["dir"] == "agent_to_client"
    reply = orjson.loads(generated["raw"])
    assert reply["id"] == 2 and reply["error"]["code"] == -32603
    assert frame_bytes(generated) + b"\n" == ran.stdout.splitlines(keepends=True)[-1]
    assert lines[-1]["exit"]["code"] == 3


async def test_redaction_removes_a_planted_secret_from_the_record_not_the_wire(
    tmp_path: Path,
) -> None:
    secret = "sk-" + "A1b2C3d4" * 5
    config = write_config(
        tmp_path / "c.yaml",
        "record:\n  redact: [sessionPassphrase]\n  redact_patterns: ['zz-[0-9]{6}']\n",
    )
    record = tmp_path / "r.jsonl"
    agent_got = tmp_path / "agent_got.txt"
    params = {
        "text": f"my key is {secret}",
        "mcpServers": [{"name": "x", "env": [{"name": "API", "value": "plain"}]}],
        "sessionPassphrase": "hunter2",
        "note": "code zz-123456 here",
        "big": 340282366920938463463374607431768211456,
    }
    line = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": params})
    stdin = request(1, "initialize", {}) + line.encode() + b"\n"
    ran = await run(
        proxy_cmd("--config", config, "--record", str(record), agent=["--record", str(agent_got)]),
        stdin,
    )
    assert ran.rc == 0, ran.stderr
    text = record.read_text(encoding="utf-8")
    for planted in (secret, "plain", "hunter2", "zz-123456"):
        assert planted not in text
        assert planted.encode() in agent_got.read_bytes()  # the wire is never changed
        assert planted.encode() in ran.stdout  # (the agent echoes the params back)
    lines = read_record(record)
    [new] = [e for e in lines if e.get("dir") == "client_to_agent" and "session/new" in e["raw"]]
    assert new["redacted"] is True
    params_seen = json.loads(new["raw"])["params"]
    assert params_seen["text"] == "my key is [REDACTED]"
    # The shape the schema wants (an array of {name, value}): a replay sends valid params.
    assert params_seen["mcpServers"][0]["env"] == [{"name": "API", "value": "[REDACTED]"}]
    assert params_seen["sessionPassphrase"] == "[REDACTED]"
    assert params_seen["note"] == "code [REDACTED] here"
    assert params_seen["big"] == 340282366920938463463374607431768211456  # exact, still JSON


def test_redactor_keeps_frames_without_secrets_byte_exact() -> None:
    redactor = Redactor.build()
    for raw in (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","_meta":{}}}',
        b'{ "a" : 1.0e3 , "tokens": 5 }',
        b"not json at all",
    ):
        assert redactor.frame(raw) == (raw, False)
    assert redactor.frame(b'{"x_api-KEY":"v","Authorization":null}') == (
        b'{"x_api-KEY":"[REDACTED]","Authorization":null}',
        True,
    )
    assert redactor.frame(b'{"h":"Bearer abcdefghijklmnop1234"}') == (
        b'{"h":"[REDACTED]"}',
        True,
    )


async def test_record_survives_sigkill_mid_session(tmp_path: Path) -> None:
    record = tmp_path / "r.jsonl"
    cmd = proxy_cmd("--record", str(record), agent=[])
    with anyio.fail_after(TIMEOUT):
        async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            await proc.stdin.send(request(1, "initialize", {}))
            got = b""
            for i in range(2, 40):
                await proc.stdin.send(request(i, "m", {"n": i, "pad": "x" * 1000}))
            while got.count(b"\n") < 39:
                got += await proc.stdout.receive()
            # The writer thread appends each line soon after the frame passed (never at exit);
            # on a loaded machine "soon" may trail the wire: wait until both directions are on
            # disk, then kill the proxy mid-session (its stdin still open).
            while record.read_bytes().count(b'"dir":"agent_to_client"') < 1:
                await anyio.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
    data = record.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    lines = [orjson.loads(line) for line in complete.splitlines()]
    for line in lines:
        jsonschema.validate(line, SCHEMA)
    assert lines[0]["acp-proxy-record"] == 1
    # What was written before the kill is complete, valid lines: nothing waits for the exit.
    assert len(frames(lines, "agent_to_client")) >= 1
    assert len(frames(lines, "client_to_agent")) >= 1


async def test_record_stops_at_max_bytes_with_a_last_line(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", "record:\n  max_bytes: 2KiB\n")
    record = tmp_path / "r.jsonl"
    stdin = request(1, "initialize", {}) + b"".join(
        request(i, "m", {"pad": "y" * 200}) for i in range(2, 30)
    )
    ran = await run(
        proxy_cmd("--config", config, "--record", str(record), "--log-format", "json"), stdin
    )
    assert ran.rc == 0
    assert len(record.read_bytes()) <= 2048 + 200
    lines = read_record(record)
    assert lines[-1]["event"] == "stopped"
    assert lines[-1]["reason"] == "record.max_bytes reached"
    [warning] = ran.events("record size limit reached; recording stopped")
    assert warning["max_bytes"] == 2048


async def test_record_path_that_cannot_be_written_is_a_usage_error(tmp_path: Path) -> None:
    ran = await run(proxy_cmd("--record", str(tmp_path / "no" / "such" / "dir" / "r.jsonl")))
    assert ran.rc == 2
    assert b"cannot open the record file" in ran.stderr


# --- acp-proxy show ------------------------------------------------------------------------------


def show(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", "show", *args],
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )


async def test_show_prints_the_latency_of_every_answered_request(tmp_path: Path) -> None:
    record, *_ = await record_golden(tmp_path)
    lines = read_record(record)
    # Requests and the responses that answer them, from the record itself.
    asked: dict[tuple[str, str], str] = {}
    answered: list[tuple[str, str]] = []
    for e in lines:
        if "dir" not in e:
            continue
        value = json.loads(e["raw"])
        for m in value if isinstance(value, list) else [value]:
            key = json.dumps(m.get("id"))
            if "method" in m and "id" in m:
                asked[(e["dir"], key)] = m["method"]
            elif "id" in m:
                other = "agent_to_client" if e["dir"] == "client_to_agent" else "client_to_agent"
                if (other, key) in asked:
                    answered.append((asked.pop((other, key)), key))
    assert len(answered) >= 6
    done = show(str(record))
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert "\x1b[" not in text  # no colours when stdout is not a terminal
    for method, key in answered:
        needle = f" #{key} to {method} after "
        assert needle in text, needle
        assert re.search(re.escape(needle) + r"[0-9.]+ ms", text)
    # The changed frames show their _meta diff, the inserted follow-up is shown.
    assert '+ example.dev/route: "edge" (params.update._meta)' in text
    assert "+ inserted: session/update tool_call_update tool_call:call_001" in text
    # JSON rows: the same joins, machine-readable.
    rows = [json.loads(x) for x in show("--json", str(record)).stdout.splitlines()]
    responses = [
        m for r in rows for m in r.get("messages", ()) if m["kind"] in ("response", "error")
    ]
    assert sorted((m["method"], json.dumps(m["id"])) for m in responses if "latency_ms" in m) == (
        sorted(answered)
    )
    assert all(m["latency_ms"] >= 0 for m in responses if "latency_ms" in m)


async def test_show_filters_and_state(tmp_path: Path) -> None:
    record, ran, *_ = await record_golden(tmp_path)
    rows = [
        json.loads(x)
        for x in show("--json", "--method", "session/new", str(record)).stdout.splitlines()
    ]
    assert [(r["dir"], [m["kind"] for m in r["messages"]]) for r in rows] == [
        ("client_to_agent", ["request"]),
        ("agent_to_client", ["response"]),
    ]
    rows = [
        json.loads(x)
        for x in show("--json", "--dir", "client_to_agent", str(record)).stdout.splitlines()
    ]
    assert rows and all(r["dir"] == "client_to_agent" for r in rows)
    rows = [
        json.loads(x)
        for x in show("--json", "--entity", "tool_call:*", str(record)).stdout.splitlines()
    ]
    assert rows and all(
        any(
            m.get("entity", "").startswith("tool_call:")
            for m in r["messages"] + r.get("inserted", [])
        )
        for r in rows
    )
    # --state: what the client stored, as the client itself would (ClientModel on its stdout).
    state = json.loads(show("--state", str(record)).stdout)
    model = ClientModel(2)
    for line in ran.stdout.splitlines():
        value = json.loads(line)
        for m in value if isinstance(value, list) else [value]:
            model.apply(m)
    expected = model.snapshot()
    assert state["protocolVersion"] == 2
    assert {tuple(e["entity"]): e["meta"] for e in state["entities"]} == {
        k: v["meta"] for k, v in expected["entities"].items()
    }
    assert {tuple(e["entity"]): e["value"] for e in state["snapshots"]} == expected["snapshots"]


async def test_show_refuses_a_file_that_is_not_a_record(tmp_path: Path) -> None:
    other = tmp_path / "x.jsonl"
    other.write_text('{"jsonrpc":"2.0"}\n', encoding="utf-8")
    done = show(str(other))
    assert done.returncode == 2
    assert done.stderr.decode() == (
        f'acp-proxy show: {other}: not a record: the first line has no "acp-proxy-record" key\n'
    )


# --- acp-proxy replay ----------------------------------------------------------------------------


def replay(record: Path, stdin: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", "replay", "--speed", "0", *args, str(record)],
        input=stdin,
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )


def client_state(stdout: bytes, version: int = 2) -> dict[str, Any]:
    model = ClientModel(version)
    for line in stdout.splitlines():
        value = json.loads(line)
        for m in value if isinstance(value, list) else [value]:
            model.apply(m)
    return model.snapshot()


async def test_replay_gives_the_same_client_the_same_state(tmp_path: Path) -> None:
    record, ran, client, *_ = await record_golden(tmp_path)
    done = replay(record, client)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert client_state(done.stdout) == client_state(ran.stdout)
    assert done.stdout == ran.stdout  # same ids as recorded: the exact bytes the client got


async def test_replay_maps_ids_and_keeps_order(tmp_path: Path) -> None:
    record = tmp_path / "r.jsonl"
    stdin = (
        request(1, "initialize", {})
        + request(2, "_test/stream_like", {"n": 1})
        + request(3, "session/prompt", {"sessionId": "s"})
    )
    ran = await run(proxy_cmd("--record", str(record)), stdin)
    assert ran.rc == 0
    # The same session from a client that numbers its requests differently.
    live = (
        request("a", "initialize", {})
        + request(10, "_test/stream_like", {"n": 1})
        + request(11, "session/prompt", {"sessionId": "s"})
    )
    done = replay(record, live)
    assert done.returncode == 0, done.stderr
    expected = ran.stdout.replace(b'"id":1,', b'"id":"a",')
    expected = expected.replace(b'"id":2,', b'"id":10,').replace(b'"id":3,', b'"id":11,')
    assert done.stdout == expected


async def test_replay_answers_a_diverging_client_with_an_error(tmp_path: Path) -> None:
    record, _ran, client, *_ = await record_golden(tmp_path)
    first = client.splitlines(keepends=True)[0]  # initialize
    wrong = request(1, "session/load", {"sessionId": "nope"})
    done = replay(record, first + wrong)
    assert done.returncode == 1
    out = done.stdout.splitlines()
    assert json.loads(out[0])["id"] == 0  # initialize answered as recorded
    assert json.loads(out[-1]) == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {
            "code": -32603,
            "message": "acp-proxy replay: client message 2 diverges from the record: "
            "expected request session/new, got request session/load",
        },
    }
    assert done.stderr == (
        b"acp-proxy replay: client message 2 diverges from the record: expected request "
        b"session/new, got request session/load\n"
    )


async def test_replay_reports_a_client_that_stops_early(tmp_path: Path) -> None:
    record, _ran, client, *_ = await record_golden(tmp_path)
    done = replay(record, client.splitlines(keepends=True)[0])
    assert done.returncode == 1
    assert done.stderr.startswith(b"acp-proxy replay: the client closed after 1 messages; ")


async def test_replay_of_a_pipelined_record_to_a_client_that_waits_for_each_response(
    tmp_path: Path,
) -> None:
    # Recorded from a client that sent everything at once; replayed to one that sends each
    # request only after the previous response: every response comes, nothing deadlocks.
    record = tmp_path / "r.jsonl"
    requests = [request(1, "initialize", {})] + [request(i, f"m/{i}", {"i": i}) for i in (2, 3, 4)]
    ran = await run(proxy_cmd("--record", str(record)), b"".join(requests))
    assert ran.rc == 0
    cmd = [sys.executable, "-m", "acp_proxy", "replay", "--speed", "0", str(record)]
    got = []
    with anyio.fail_after(TIMEOUT):
        async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            lines = Lines(proc.stdout)
            for frame in requests:
                await proc.stdin.send(frame)
                got.append(await lines.line())
            await proc.stdin.aclose()
            assert await proc.wait() == 0
    assert b"".join(got) == ran.stdout


# --- a debug log that debugs ------------------------------------------------------------------


async def test_debug_log_joins_responses_logs_inserted_and_generated_frames(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "rules.yaml", RULES)
    client, _agent = golden_sides("session_v2.txt")
    ran = await run(
        proxy_cmd(
            "--config",
            config,
            "--log-level",
            "debug",
            "--log-format",
            "json",
            agent=["--replay", str(GOLDEN / "session_v2.txt")],
        ),
        client,
    )
    assert ran.rc == 0, ran.stderr
    responses = [
        e
        for e in ran.events("frame")
        if e["direction"] == "agent_to_client" and e["method"] is None
    ]
    assert [(e["id"], e["answers"]) for e in responses] == [
        (0, "initialize"),
        (1, "session/new"),
        ("req-2", "session/prompt"),
        (3, "session/set_mode"),
        (4, "x/unknown"),
        (18446744073709551616, "_vendor/ping"),
    ]
    assert all(e["latency_ms"] >= 0 for e in responses)
    [inserted] = ran.events("frames inserted after it")
    assert inserted["inserted"] == 1
    assert inserted["changed_by"] == ["rules:route"]
    assert "frame contents" not in {e["event"] for e in ran.log_events()}  # off by default

    # Generated frames: the agent dies with a request in flight.
    ran = await run(
        proxy_cmd("--log-level", "debug", "--log-format", "json", agent=["--crash-after", "2"]),
        request(1, "initialize", {}) + request(2, "slow", {}),
    )
    [generated] = ran.events("frames generated by the proxy")
    assert (generated["direction"], generated["count"]) == ("agent_to_client", 1)


async def test_debug_log_says_why_a_v1_update_was_not_annotated(tmp_path: Path) -> None:
    config = write_config(tmp_path / "rules.yaml", RULES)
    client, _agent = golden_sides("session_v1.txt")
    ran = await run(
        proxy_cmd(
            "--config",
            config,
            "--log-level",
            "debug",
            "--log-format",
            "json",
            agent=["--replay", str(GOLDEN / "session_v1.txt")],
        ),
        client,
    )
    assert ran.rc == 0, ran.stderr
    skips = ran.events("v1 update not annotated (v1.mode: safe)")
    assert skips
    for skip in skips:
        assert skip["rules"] == ["rules:route"]
        assert skip["method"] == "session/update"
        assert skip["reason"].startswith("the update carries no _meta object")


async def test_log_frames_shows_contents_redacted_and_the_wire_keeps_the_secret(
    tmp_path: Path,
) -> None:
    secret = "ghp_" + "Z9y8X7w6" * 5
    line = request(1, "initialize", {}) + request(2, "m", {"auth": f"token {secret}", "ok": "é"})
    ran = await run(proxy_cmd("--log-frames", "--log-format", "json"), line)
    assert ran.rc == 0
    assert secret.encode() in ran.stdout  # echoed by the agent: the wire is untouched
    assert secret.encode() not in ran.stderr
    contents = ran.events("frame contents")
    raws = [(e["direction"], json.loads(e["raw"])) for e in contents]
    assert (
        "client_to_agent",
        json.loads(request(2, "m", {"auth": "token [REDACTED]", "ok": "é"})),
    ) in raws
    assert ran.events("frame")  # --log-frames implies debug


async def test_agent_stderr_on_the_command_line(tmp_path: Path) -> None:
    ran = await run(
        proxy_cmd("--agent-stderr", "log", "--log-format", "json", agent=["--stderr-bytes", "300"]),
        request(1, "initialize", {}),
    )
    assert ran.rc == 0
    assert {(e["line"], e["stream"]) for e in ran.events("agent stderr")} == {
        ("x" * 99, "agent_stderr")
    }
    config = write_config(tmp_path / "c.yaml", "agent:\n  stderr: log\n")
    ran = await run(
        proxy_cmd(
            "--config",
            config,
            "--agent-stderr",
            "passthrough",
            "--log-format",
            "json",
            agent=["--stderr-bytes", "300"],
        ),
        request(1, "initialize", {}),
    )
    assert ran.rc == 0
    assert ran.events("agent stderr") == []
    assert ran.stderr.count(b"x" * 99 + b"\n") >= 3  # as the agent wrote them


async def test_replay_as_client_against_the_recorded_agent_and_another(tmp_path: Path) -> None:
    # The recorded client side played to a real agent: the same deterministic agent writes
    # what the record says (exit 0); another agent is reported message by message (exit 1).
    record = tmp_path / "demo.jsonl"
    demo_agent = [sys.executable, "-m", "acp_proxy.demo.agent"]
    client = (
        request(0, "initialize", {"protocolVersion": 2, "clientCapabilities": {}})
        + request(1, "session/new", {"cwd": "/tmp", "mcpServers": []})
        + request(
            2,
            "session/prompt",
            {"sessionId": "sess_demo_001", "prompt": [{"type": "text", "text": "Fix it"}]},
        )
    )
    config = str(REPO / "config" / "example.yaml")
    ran = await run(
        [
            sys.executable,
            "-m",
            "acp_proxy",
            "--config",
            config,
            "--record",
            str(record),
            "--",
            *demo_agent,
        ],
        client,
    )
    assert ran.rc == 0, ran.stderr
    expected = sum(1 for e in read_record(record) if e.get("dir") == "agent_to_client")
    same = subprocess.run(
        [
            sys.executable,
            "-m",
            "acp_proxy",
            "replay",
            "--as-client",
            "--speed",
            "0",
            str(record),
            "--",
            *demo_agent,
        ],
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )
    assert same.returncode == 0, same.stderr
    assert (
        same.stderr
        == f"acp-proxy replay: the agent wrote the {expected} messages of the record\n".encode()
    )
    other = subprocess.run(
        [
            sys.executable,
            "-m",
            "acp_proxy",
            "replay",
            "--as-client",
            "--speed",
            "0",
            str(record),
            "--",
            sys.executable,
            str(REPO / "tests" / "tiny_agent.py"),
        ],
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )
    assert other.returncode == 1
    report = other.stderr.decode().splitlines()
    assert report[0].startswith("acp-proxy replay: agent message 1 differs: expected ")
    assert report[-1] == f"acp-proxy replay: the agent wrote 3 messages; the record has {expected}"


async def test_show_follow_tails_a_record_being_written(tmp_path: Path) -> None:
    record = tmp_path / "live.jsonl"
    show_cmd = [sys.executable, "-m", "acp_proxy", "show", "--follow", str(record)]
    with anyio.fail_after(TIMEOUT):
        async with await anyio.open_process(
            proxy_cmd("--record", str(record)), env=proxy_env(), cwd=str(REPO)
        ) as proxy:
            assert proxy.stdin is not None and proxy.stdout is not None
            await proxy.stdin.send(request(1, "initialize", {}))
            answers = Lines(proxy.stdout)
            await answers.line()
            async with await anyio.open_process(
                show_cmd, env=proxy_env(), cwd=str(REPO)
            ) as show_proc:
                assert show_proc.stdout is not None
                rows = Lines(show_proc.stdout)
                assert (await rows.line()).startswith(b"session 1: record of ")
                assert (await rows.line()).endswith(b"C\xe2\x86\x92A initialize #1\n")
                assert (await rows.line()).endswith(b"--- protocol version 2\n")
                assert b"A\xe2\x86\x92C response #1 to initialize after " in await rows.line()
                # A frame written after show started: it appears as it happens.
                await proxy.stdin.send(request(2, "later", {}))
                await answers.line()
                assert (await rows.line()).endswith(b"C\xe2\x86\x92A later #2\n")
                assert b"A\xe2\x86\x92C response #2 to later after " in await rows.line()
                await proxy.stdin.aclose()
                assert await proxy.wait() == 0
                # The trailer ends --follow.
                assert b"--- session ended: exited with status 0" in await rows.line()
                assert await show_proc.wait() == 0


def test_writer_drops_and_counts_instead_of_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    # A disk that does not keep up (here: a pipe nobody reads yet) never blocks the session:
    # past QUEUE_BYTES, lines are dropped and counted, and a "lost" line says how many.
    import threading

    from acp_proxy.shell.record import recorder

    monkeypatch.setattr(recorder, "QUEUE_BYTES", 256 * 1024)
    read_end, write_end = os.pipe()
    writer = recorder._Writer(write_end, "<pipe>")
    line = b'{"x":"' + b"y" * 1000 + b'"}\n'
    accepted = [writer.put(line, 1.0, 0.0) for _ in range(2000)]  # ~2 MB: pipe + queue overflow
    dropped = accepted.count(False)
    assert dropped > 0
    chunks: list[bytes] = []

    def drain() -> None:
        while data := os.read(read_end, 1 << 16):
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    while not writer.put(b'{"last":true}\n', 2.0, 0.0):
        dropped += 1  # room comes back as the pipe drains; until then this line is dropped too
    writer.close(timeout=TIMEOUT)
    reader.join(TIMEOUT)
    os.close(read_end)
    lines = b"".join(chunks).splitlines()
    assert lines[-1] == b'{"last":true}'
    # The writer may drain between puts, so drops can be reported by more than one "lost" line
    # (each written before the next accepted line); together they count every drop.
    lost = [orjson.loads(line) for line in lines if line.startswith(b'{"t":')]
    assert lost and all(e["event"] == "lost" for e in lost)
    # Each is stamped with the time of the accepted line it precedes: 1.0 when the writer
    # drained during the first puts (seen in CI under load), 2.0 for drops reported by "last".
    assert all(set(e) == {"t", "event", "frames"} and e["t"] in (1.0, 2.0) for e in lost)
    assert sum(e["frames"] for e in lost) == dropped
    assert len(lines) == accepted.count(True) + 1 + len(lost)


async def test_agent_output_quoted_in_the_log_is_redacted() -> None:
    secret = "sk-" + "Q" * 30
    ran = await run(
        proxy_cmd("--log-format", "json", agent=["--banner", f"[INFO] using key {secret}"]),
        request(1, "initialize", {}),
    )
    assert ran.rc == 0
    [warning] = ran.events(
        "agent wrote non-JSON output; diverted to the log "
        "(further lines of this kind are only counted)"
    )
    assert warning["sample"] == "[INFO] using key [REDACTED]"
    # (The "starting" line quotes the agent's command line, where this test put the secret.)
    others = [e for e in ran.log_events() if e["event"] != "starting"]
    assert secret not in json.dumps(others)
