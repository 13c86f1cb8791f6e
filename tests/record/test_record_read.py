"""Records read back by ``show`` and ``replay``: hostile and odd files, real processes.

A line that cannot be used is reported (``FILE:LINE: why``) and skipped, the rest shown; a deep
frame is summarised; every string from the record reaches the terminal escaped; a file written
by several sessions shows and replays each of them; ``--follow`` waits for the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from proxy_harness import REPO, TIMEOUT, proxy_env

from acp_proxy.record.format import Redactor, event_line, frame_line, header

R = Redactor.build()
C, A = "client_to_agent", "agent_to_client"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
INIT_OK = {"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 2}}
WRITE: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 9,
    "method": "fs/write_text_file",
    "params": {"sessionId": "s", "path": "/tmp/x", "content": "hi"},
}
WRITE_OK = {"jsonrpc": "2.0", "id": 9, "result": None}
# Control sequences an agent could plant: OSC title, clear screen, CSI via C1, bidi override.
EVIL = "x\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil\n"
UNSAFE_OUTPUT = ("\x1b]", "\x07", "\x1b[2J", "\x9b", "\u202e")


def head(agent: str = "agent") -> bytes:
    return header(
        started="2026-12-03T00:00:00.000+00:00",
        version="test",
        agent=[agent],
        connect=None,
        config=None,
        rules=[],
        middleware=[],
        conn=None,
        redactor=R,
    )


def frame(t: float, direction: str, message: Any) -> bytes:
    raw = message if isinstance(message, bytes) else json.dumps(message).encode()
    return frame_line(t, direction, raw, R)


def session(agent: str = "agent", *, end: bool = True) -> bytes:
    lines = [
        head(agent),
        frame(0.0, C, INIT),
        event_line(0.1, "version", protocolVersion=2),
        frame(0.1, A, INIT_OK),
        frame(0.2, A, WRITE),
        frame(0.3, C, WRITE_OK),
    ]
    if end:
        lines.append(event_line(0.4, "end", exit={"status": "exited with status 0"}, summary={}))
    return b"".join(lines)


def run_cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", *args],
        input=stdin,
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )


def client_lines(*messages: Any) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


# --- unusable lines ------------------------------------------------------------------------------


def hostile(tmp_path: Path) -> Path:
    record = tmp_path / "hostile.jsonl"
    good = session(end=False).splitlines(keepends=True)
    record.write_bytes(
        b"".join(
            [
                *good[:4],  # header, initialize, version, its response (lines 1-4)
                b'{"t":0.15,"dir":"agent_to_client","raw_b64":"%%%not base64"}\n',  # 5
                b'{"t":0.16,"dir":"agent_to_client","raw":{"not":"a string"}}\n',  # 6
                b'{"t":"soon","dir":"agent_to_client","raw":"{}"}\n',  # 7
                b"\x00\xffgarbage\n",  # 8
                *good[4:],  # the agent's fs/write_text_file and the client's answer (9, 10)
                b'{"t":0.5,"dir":"agent_to_cl',  # 11: torn by a crash
            ]
        )
    )
    return record


EXPECTED_REPORTS = [
    '{f}:5: "raw_b64" is not valid base64; skipped',
    '{f}:6: "raw" is not a string; skipped',
    '{f}:7: "t" is not a number; skipped',
    "{f}:8: not UTF-8 text; skipped",
    "{f}:11: not JSON (unexpected end of data); skipped",
]


def reports(stderr: bytes, record: Path) -> list[str]:
    return [
        line.removeprefix(f"acp-proxy {cmd}: ")
        for line in stderr.decode().splitlines()
        for cmd in ("show", "replay")
        if line.startswith(f"acp-proxy {cmd}: ")
    ]


def test_show_reports_and_skips_unusable_lines_and_shows_the_rest(tmp_path: Path) -> None:
    record = hostile(tmp_path)
    expected = [r.format(f=record) for r in EXPECTED_REPORTS]
    done = run_cli("show", str(record))
    assert done.returncode == 0, done.stderr
    assert reports(done.stderr, record) == expected
    text = done.stdout.decode()
    assert "A→C fs/write_text_file #9" in text
    assert "C→A response #9 to fs/write_text_file after 100 ms" in text
    rows = run_cli("show", "--json", str(record))
    assert rows.returncode == 0
    assert reports(rows.stderr, record) == expected
    methods = [
        m.get("method")
        for r in map(json.loads, rows.stdout.splitlines())
        for m in r.get("messages", [])
    ]
    assert methods == ["initialize", "initialize", "fs/write_text_file", "fs/write_text_file"]
    state = run_cli("show", "--state", str(record))
    assert state.returncode == 0
    assert json.loads(state.stdout)["protocolVersion"] == 2


def test_replay_skips_unusable_lines_and_plays_the_rest(tmp_path: Path) -> None:
    record = hostile(tmp_path)
    done = run_cli("replay", "--speed", "0", str(record), stdin=client_lines(INIT, WRITE_OK))
    assert reports(done.stderr, record) == [r.format(f=record) for r in EXPECTED_REPORTS]
    assert done.returncode == 0, done.stderr
    assert [json.loads(x) for x in done.stdout.splitlines()] == [INIT_OK, WRITE]


HAND_MADE = [
    (
        b'{"t":0.2,"dir":"agent_to_client","raw":"{}","raw_b64":"e30="}',
        'a frame with both "raw" and "raw_b64"',
    ),
    (b'{"t":-1,"dir":"agent_to_client","raw":"{}"}', '"t" is negative'),
    (b'{"t":0.2,"dir":"agent_to_client","raw":"{}","kind":5}', '"kind" is not a string'),
    (
        b'{"t":0.2,"dir":"agent_to_client","raw":"{}","generated":"yes"}',
        '"generated" is not true or false',
    ),
    (
        b'{"t":0.2,"dir":"agent_to_client","raw":"{}","redacted":1}',
        '"redacted" is not true or false',
    ),
    (b'{"t":0.2,"dir":"agent_to_client","raw":["{}"]}', '"raw" is not a string'),
    (b'{"t":0.2,"dir":"agent_to_client","raw_b64":"e30"}', '"raw_b64" is not valid base64'),
    (b'{"t":null,"dir":"agent_to_client","raw":"{}"}', '"t" is not a number'),
]


def test_hand_made_lines_of_the_wrong_shape_are_reported_by_line(tmp_path: Path) -> None:
    record = tmp_path / "hand.jsonl"
    good = session().splitlines(keepends=True)
    record.write_bytes(b"".join([*good[:4], *(line + b"\n" for line, _ in HAND_MADE), *good[4:]]))
    expected = [f"{record}:{n}: {why}; skipped" for n, (_, why) in enumerate(HAND_MADE, 5)]
    for cmd in (["show"], ["show", "--state"], ["replay", "--speed", "0"]):
        done = run_cli(*cmd, str(record), stdin=client_lines(INIT, WRITE_OK))
        assert reports(done.stderr, record) == expected, cmd
        assert done.returncode == 0, done.stderr


def test_a_frame_nested_too_deep_is_summarised_and_the_next_one_shown(tmp_path: Path) -> None:
    deep = b'{"jsonrpc":"2.0","method":"x","params":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    record = tmp_path / "deep.jsonl"
    lines = session(end=False).splitlines(keepends=True)
    record.write_bytes(b"".join([*lines[:4], frame(0.15, A, deep), *lines[4:]]))
    for mode in ((), ("--json",), ("--state",)):
        done = run_cli("show", *mode, str(record))
        assert done.returncode == 0, done.stderr
        assert done.stderr == b""
        assert b"fs/write_text_file" in done.stdout or mode == ("--state",)
    text = run_cli("show", str(record)).stdout.decode()
    assert "A→C (a frame nested too deeply to describe)" in text
    done = run_cli("replay", "--speed", "0", str(record), stdin=client_lines(INIT, WRITE_OK))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == deep  # sent as recorded


def test_dev_zero_and_a_directory_are_refused_not_read_into_memory() -> None:
    for cmd in ("show", "replay"):
        done = run_cli(cmd, "/dev/zero")
        assert done.returncode == 2
        assert done.stderr.decode() == (
            f"acp-proxy {cmd}: /dev/zero: not a record: the first line is longer than a header "
            "can be\n"
        )


def test_replay_of_a_record_from_a_pipe(tmp_path: Path) -> None:
    # replay reads the record once per side: one given as a FIFO (`<(cat rec)`) is copied first.
    fifo = tmp_path / "record.fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as f:
            f.write(session())

    writer = threading.Thread(target=feed)
    writer.start()
    done = run_cli("replay", "--speed", "0", str(fifo), stdin=client_lines(INIT, WRITE_OK))
    writer.join(TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert [json.loads(x) for x in done.stdout.splitlines()] == [INIT_OK, WRITE]


# --- terminal escaping ---------------------------------------------------------------------------


def evil_record(tmp_path: Path) -> Path:
    record = tmp_path / "evil.jsonl"
    ask = {"jsonrpc": "2.0", "id": EVIL, "method": EVIL, "params": {}}
    fail = {"jsonrpc": "2.0", "id": EVIL, "error": {"code": -1, "message": EVIL}}
    tool = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": EVIL,
            "update": {
                "sessionUpdate": "tool_call_update",
                "toolCallId": EVIL,
                "title": EVIL,
            },
        },
    }
    record.write_bytes(
        b"".join(
            [
                head(EVIL),
                frame(0.0, C, ask),
                event_line(0.0, "version", protocolVersion=2),
                frame(0.1, A, fail),
                frame(0.2, A, tool),
                event_line(0.3, EVIL),
            ]
        )
    )
    return record


def test_show_never_writes_control_sequences_from_the_record(tmp_path: Path) -> None:
    record = evil_record(tmp_path)
    for mode in ((), ("--color", "always"), ("--json",), ("--state",), ("--list",)):
        done = run_cli("show", *mode, str(record))
        assert done.returncode == 0, (mode, done.stderr)
        out = done.stdout.decode()
        for bad in UNSAFE_OUTPUT:
            assert bad not in out, (mode, bad)
        if mode == ():
            assert "x\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202eevil\\x0a" in out
    # The JSON stays the same data: the escapes are JSON's own.
    rows = [json.loads(x) for x in run_cli("show", "--json", str(record)).stdout.splitlines()]
    assert rows[1]["messages"][0]["method"] == EVIL
    state = json.loads(run_cli("show", "--state", str(record)).stdout)
    assert state["entities"][0]["entity"] == ["tool_call", EVIL, EVIL]


def test_replay_reports_divergence_with_escaped_names(tmp_path: Path) -> None:
    record = evil_record(tmp_path)
    done = run_cli(
        "replay", "--speed", "0", str(record), stdin=client_lines({**INIT, "method": EVIL + "!"})
    )
    assert done.returncode == 1
    err = done.stderr.decode()
    assert "got request x\\x1b]0;pwned" in err
    for bad in UNSAFE_OUTPUT:
        assert bad not in err


# --- several sessions in one file ----------------------------------------------------------------


def two_sessions(tmp_path: Path) -> Path:
    record = tmp_path / "twice.jsonl"
    second = (
        session("second").replace(b'\\"id\\": 9', b'\\"id\\": 10').replace(b"/tmp/x", b"/tmp/y")
    )
    record.write_bytes(session("first") + second)
    return record


def test_show_lists_shows_and_selects_the_sessions_of_a_file(tmp_path: Path) -> None:
    record = two_sessions(tmp_path)
    listed = run_cli("show", "--list", str(record))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.decode().splitlines() == [
        "session 1 (line 1): record of 2026-12-03T00:00:00.000+00:00 by acp-proxy test: agent "
        "['first'], config None, rules []; 4 frames; session ended: exited with status 0",
        "session 2 (line 8): record of 2026-12-03T00:00:00.000+00:00 by acp-proxy test: agent "
        "['second'], config None, rules []; 4 frames; session ended: exited with status 0",
    ]
    text = run_cli("show", str(record)).stdout.decode().splitlines()
    starts = [i for i, line in enumerate(text) if line.startswith("session ")]
    assert [text[i][:10] for i in starts] == ["session 1:", "session 2:"]
    assert "fs/write_text_file #9" in "\n".join(text[: starts[1]])
    assert "fs/write_text_file #10" in "\n".join(text[starts[1] :])
    only = run_cli("show", "--session", "2", str(record)).stdout.decode()
    assert "#10" in only and "#9" not in only and "agent ['second']" in only
    rows = [json.loads(x) for x in run_cli("show", "--json", str(record)).stdout.splitlines()]
    assert [r["session"] for r in rows if r.get("event") == "session"] == [1, 2]
    assert run_cli("show", "--session", "3", str(record)).returncode == 2
    state = run_cli("show", "--state", str(record))
    assert state.returncode == 2
    assert b"holds more than one session" in state.stderr
    assert run_cli("show", "--state", "--session", "2", str(record)).returncode == 0


def test_replay_needs_a_session_of_a_file_of_several_and_plays_it(tmp_path: Path) -> None:
    record = two_sessions(tmp_path)
    done = run_cli("replay", "--speed", "0", str(record), stdin=client_lines(INIT))
    assert done.returncode == 2
    assert done.stderr.decode() == (
        f"acp-proxy replay: {record} holds 2 sessions (a record file written again): choose one "
        "with --session N (`acp-proxy show --list FILE` lists them)\n"
    )
    write2 = {**WRITE, "id": 10, "params": {**WRITE["params"], "path": "/tmp/y"}}
    done = run_cli(
        "replay",
        "--speed",
        "0",
        "--session",
        "2",
        str(record),
        stdin=client_lines(INIT, {**WRITE_OK, "id": 10}),
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(x) for x in done.stdout.splitlines()] == [INIT_OK, write2]


# --- show options --------------------------------------------------------------------------------


def tools_record(tmp_path: Path) -> Path:
    def tool(call: str, changed: bool) -> bytes:
        message = {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": "s",
                "update": {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call,
                    "title": call,
                },
            },
        }
        raw = json.dumps(message).encode()
        if not changed:
            return frame_line(0.2, A, raw, R)
        sent = json.loads(raw)
        sent["params"]["update"]["_meta"] = {"example.dev/route": "edge"}
        return frame_line(0.2, A, raw, R, sent=[json.dumps(sent).encode()], changed_by=["r"])

    record = tmp_path / "tools.jsonl"
    record.write_bytes(session(end=False) + tool("t1", True) + tool("t2", False))
    return record


def test_show_state_applies_entity(tmp_path: Path) -> None:
    record = tools_record(tmp_path)
    state = json.loads(run_cli("show", "--state", "--entity", "tool_call:t1", str(record)).stdout)
    assert [e["entity"] for e in state["entities"]] == [["tool_call", "s", "t1"]]
    every = json.loads(run_cli("show", "--state", str(record)).stdout)
    assert [e["entity"] for e in every["entities"]] == [
        ["tool_call", "s", "t1"],
        ["tool_call", "s", "t2"],
    ]


def test_show_json_gives_the_meta_diff_as_data(tmp_path: Path) -> None:
    record = tools_record(tmp_path)
    rows = [json.loads(x) for x in run_cli("show", "--json", str(record)).stdout.splitlines()]
    [changed] = [r for r in rows if "meta_diff" in r]
    assert changed["meta_diff"] == [
        {"op": "+", "key": "example.dev/route", "path": "params.update._meta", "value": "edge"}
    ]
    text = run_cli("show", str(record)).stdout.decode()
    assert '+ example.dev/route: "edge" (params.update._meta)' in text


def test_show_follow_waits_for_the_file_to_exist(tmp_path: Path) -> None:
    record = tmp_path / "later.jsonl"
    with subprocess.Popen(
        [sys.executable, "-m", "acp_proxy", "show", "--follow", str(record)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=proxy_env(),
        cwd=str(REPO),
    ) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        assert proc.stderr.readline().decode() == f"acp-proxy show: waiting for {record} to exist\n"
        assert proc.poll() is None
        tmp = tmp_path / "later.tmp"
        tmp.write_bytes(session())
        os.rename(tmp, record)
        out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert out.decode().splitlines()[-1].endswith("--- session ended: exited with status 0")


# --- bounded memory ------------------------------------------------------------------------------

MEASURE = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[2:], stdin=open(sys.argv[1], "rb"), stdout=subprocess.DEVNULL)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_rss_mib(stdin: Path, *cmd: str) -> tuple[int, float]:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(stdin), sys.executable, "-m", "acp_proxy", *cmd],
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=120,
        check=True,
    )
    rc, kib = done.stdout.split()
    return int(rc), int(kib) / 1024


def test_state_and_replay_of_a_big_record_stay_in_bounded_memory(tmp_path: Path) -> None:
    # 60,000 chunks of 400 bytes (28 MB): the whole record in memory costs several hundred MiB
    # in Python objects; streamed, the state (its chunks) and one line.
    chunk = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "s",
            "update": {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "t",
                "status": "in_progress",
                "rawOutput": {"text": "y" * 400},
            },
        },
    }
    line = frame(0.5, A, chunk)
    record = tmp_path / "big.jsonl"
    with record.open("wb") as f:
        f.write(session(end=False))
        for _ in range(60_000):
            f.write(line)
    stdin = tmp_path / "client.jsonl"
    stdin.write_bytes(client_lines(INIT, WRITE_OK))
    started = time.monotonic()
    rc, state_mib = peak_rss_mib(stdin, "show", "--state", str(record))
    assert rc == 0
    rc, replay_mib = peak_rss_mib(stdin, "replay", "--speed", "0", str(record))
    assert rc == 0
    assert max(state_mib, replay_mib) < 80, (state_mib, replay_mib, time.monotonic() - started)


CAPPED = """
import resource, subprocess, sys
cap = int(sys.argv[1])
def limit():
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
done = subprocess.run(sys.argv[3:], stdin=open(sys.argv[2], "rb"), capture_output=True,
                      preexec_fn=limit)
sys.stdout.buffer.write(done.stdout)
sys.stderr.buffer.write(done.stderr)
sys.exit(done.returncode)
"""


def capped(cap_mib: int, stdin: Path, *cmd: str) -> subprocess.CompletedProcess[bytes]:
    """``acp-proxy CMD`` run with its address space capped at ``cap_mib`` MiB."""
    runner = [sys.executable, "-c", CAPPED, str(cap_mib << 20), str(stdin)]
    return subprocess.run(
        [*runner, sys.executable, "-m", "acp_proxy", *cmd],
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=120,
        check=False,
    )


def test_state_and_replay_of_a_long_message_fit_an_address_space_smaller_than_its_text(
    tmp_path: Path,
) -> None:
    # One message of 500 chunks of 64 KiB: 32 MiB of text, and the process may map 40 MiB in
    # all. The state keeps where each chunk is in the file and reads it back as it prints it;
    # holding the chunks' text, the process runs out of memory (its lines are then reported
    # as unreadable and the state is wrong). The replay writes the frames as they come (a
    # batch of due frames is bounded in bytes, not only in number).
    n, text = 500, "y" * 65536
    chunk = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "s",
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "messageId": "m",
                "content": {"type": "text", "text": text},
            },
        },
    }
    record = tmp_path / "long.jsonl"
    with record.open("wb") as f:
        f.write(session(end=False))
        f.write(frame(0.5, A, chunk) * n)
    stdin = tmp_path / "client.jsonl"
    stdin.write_bytes(client_lines(INIT, WRITE_OK))
    done = capped(40, stdin, "show", "--state", str(record))
    assert (done.returncode, done.stderr) == (0, b"")
    [message] = json.loads(done.stdout)["entities"]
    assert message["entity"] == ["agent_message", "s", "m"]
    assert message["fields"]["content"] == [{"type": "text", "text": text}] * n
    played = capped(40, stdin, "replay", "--speed", "0", str(record))
    assert (played.returncode, played.stderr) == (0, b"")
    assert played.stdout.count(b"\n") == 2 + n
