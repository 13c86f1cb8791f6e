"""Start-up failures the editor can show: the pending request is answered with what happened.

- An agent that exits before answering: its requests get ``agent exited with status 1 during
  initialize: LAST STDERR LINE`` (the line bounded and redacted), with the tail of the agent's
  stderr (bounded, redacted) in ``error.data``, in both ``agent.stderr`` modes (``passthrough``
  copies the agent's stderr to the proxy's unchanged while keeping the tail).
- Either way the proxy lingers briefly, answering every request the client sends with the same
  error, until the client closes its side or a bounded time passes (a request written just after
  the first error is answered, never met with EOF).
- An agent command that cannot be started: the client's requests get ``agent could not be
  started (...) during initialize`` before the proxy exits 127 (it used to exit without a word
  on stdout, leaving the editor waiting).
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import orjson
import pytest
from proxy_harness import REPO, Lines, proxy_env, request, run, write_config

from acp_proxy.shell.agent.stderr import MAX_STDERR_MESSAGE_CHARS, MAX_STDERR_TAIL_BYTES

pytestmark = pytest.mark.anyio

PROXY = [sys.executable, "-m", "acp_proxy", "--log-format", "json"]
LOGGED = "agent:\n  stderr: log\n"


async def test_an_agent_that_dies_at_start_says_why_in_the_error(tmp_path: Path) -> None:
    script = (
        "cat >/dev/null & "  # reads its input, as an agent does, then dies
        "echo 'starting agent' >&2; "
        "echo 'error: no API key (token sk-ant-api03-abcdefghijklmnopqrstuvwxyz)' >&2; "
        "sleep 0.2; exit 1"
    )
    config = write_config(tmp_path / "c.yaml", LOGGED)
    cmd = [*PROXY, "--config", config, "--", "sh", "-c", script]
    ran = await run(cmd, request(1, "initialize", {}))
    assert ran.rc == 1
    [answer] = [orjson.loads(line) for line in ran.stdout.splitlines()]
    assert answer == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {
            "code": -32603,
            "message": "agent exited with status 1 during initialize: "
            "error: no API key (token [REDACTED])",
            "data": {"stderr": "starting agent\nerror: no API key (token [REDACTED])"},
        },
    }


async def test_the_stderr_tail_is_bounded(tmp_path: Path) -> None:
    script = (
        "cat >/dev/null & "
        "i=0; while [ $i -lt 400 ]; do echo \"line $i: $(printf 'x%.0s' $(seq 40))\" >&2; "
        "i=$((i+1)); done; sleep 0.2; exit 3"
    )
    config = write_config(tmp_path / "c.yaml", LOGGED)
    cmd = [*PROXY, "--config", config, "--", "sh", "-c", script]
    ran = await run(cmd, request(7, "initialize", {}))
    [answer] = [orjson.loads(line) for line in ran.stdout.splitlines()]
    error = answer["error"]
    assert error["message"] == "agent exited with status 3 during initialize: line 399: " + "x" * 40
    tail = error["data"]["stderr"]
    assert len(tail.encode()) <= MAX_STDERR_TAIL_BYTES
    assert tail.endswith("line 399: " + "x" * 40)  # the last lines, whole


async def test_a_missing_agent_command_answers_initialize() -> None:
    frames = request(1, "initialize", {}) + b'{"jsonrpc":"2.0","id":"two","method":"x"}\n'
    ran = await run([*PROXY, "--", "no-such-agent-for-acp-proxy"], frames)
    assert ran.rc == 127
    reason = "agent could not be started (no-such-agent-for-acp-proxy: command not found)"
    assert ran.stdout == (
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"'
        + reason.encode()
        + b' during initialize"}}\n'
        b'{"jsonrpc":"2.0","id":"two","error":{"code":-32603,"message":"'
        + reason.encode()
        + b' during x"}}\n'
    )
    assert b"acp-proxy: no-such-agent-for-acp-proxy: command not found\n" in ran.stderr


async def test_with_passthrough_the_error_names_the_agents_last_line() -> None:
    script = (
        "cat >/dev/null & echo 'starting agent' >&2; "
        "echo 'Error: ANTHROPIC_API_KEY not set (was sk-ant-api03-abcdefghijklmnopqrstuvwxyz)' "
        ">&2; "
        "sleep 0.2; exit 1"
    )
    ran = await run([*PROXY, "--", "sh", "-c", script], request(1, "initialize", {}))
    assert ran.rc == 1
    assert ran.stdout == (
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32603,'
        b'"message":"agent exited with status 1 during initialize: '
        b'Error: ANTHROPIC_API_KEY not set (was [REDACTED])",'
        b'"data":{"stderr":"starting agent\\n'
        b'Error: ANTHROPIC_API_KEY not set (was [REDACTED])"}}}\n'
    )
    # The editor still reads the agent's own words, as the agent wrote them.
    assert (
        b"starting agent\nError: ANTHROPIC_API_KEY not set "
        b"(was sk-ant-api03-abcdefghijklmnopqrstuvwxyz)\n" in ran.stderr
    )


async def test_passthrough_copies_the_agents_stderr_byte_for_byte() -> None:
    script = r"cat >/dev/null & printf 'one\n\000\377 two\r\nno newline' >&2; sleep 0.2; exit 1"
    cmd = [sys.executable, "-m", "acp_proxy", "--log-level", "error", "--", "sh", "-c", script]
    ran = await run(cmd, request(1, "initialize", {}))
    assert ran.stderr == b"one\n\x00\xff two\r\nno newline"
    [answer] = [orjson.loads(line) for line in ran.stdout.splitlines()]
    assert answer["error"]["message"] == "agent exited with status 1 during initialize: no newline"


async def test_the_last_line_in_the_message_is_bounded() -> None:
    script = "cat >/dev/null & printf 'E%.0s' $(seq 3000) >&2; echo >&2; sleep 0.2; exit 1"
    ran = await run([*PROXY, "--", "sh", "-c", script], request(1, "initialize", {}))
    [answer] = [orjson.loads(line) for line in ran.stdout.splitlines()]
    cut = "E" * (MAX_STDERR_MESSAGE_CHARS - 1) + "…"
    assert answer["error"]["message"] == f"agent exited with status 1 during initialize: {cut}"


def _died(rid: int, method: str) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":%d,"error":{"code":-32603,"message":"agent exited with status 1 '
        b'during %s: Error: no key","data":{"stderr":"Error: no key"}}}\n' % (rid, method.encode())
    )


async def test_a_request_sent_after_the_crash_error_is_answered_too() -> None:
    script = "cat >/dev/null & echo 'Error: no key' >&2; sleep 0.2; exit 1"
    with anyio.fail_after(10):
        cmd = [*PROXY, "--", "sh", "-c", script]
        async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            out = Lines(proc.stdout)
            await proc.stdin.send(request(1, "initialize", {}))
            first = await out.line()
            await proc.stdin.send(request(2, "session/new", {}))
            second = await out.line()
            await proc.stdin.aclose()  # the client is done: the proxy exits at once
            rest = await out.rest()
            rc = await proc.wait()
    assert (first, second, rest, rc) == (_died(1, "initialize"), _died(2, "session/new"), b"", 1)


async def test_a_request_sent_after_the_agent_died_is_answered() -> None:
    script = "echo 'Error: no key' >&2; exit 1"
    with anyio.fail_after(10):
        cmd = [*PROXY, "--log-level", "info", "--", "sh", "-c", script]
        async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            assert proc.stderr is not None
            log = Lines(proc.stderr)
            while b'"agent exited with status 1"' not in await log.line():
                pass  # the proxy saw the agent die before the client said anything
            await proc.stdin.send(request(1, "initialize", {}))
            out = Lines(proc.stdout)
            first = await out.line()
            await proc.stdin.aclose()
            rest = await out.rest()
            rc = await proc.wait()
    assert (first, rest, rc) == (_died(1, "initialize"), b"", 1)


# --- the proxy refuses to start ----------------------------------------------------------------

TWO_REQUESTS = request(1, "initialize", {}) + request("b", "session/new", {})


def _refused(*messages: str) -> bytes:
    """What the client reads when the proxy refuses to start: each request answered."""
    reason = messages[0] + (f"; and {len(messages) - 1} more" if len(messages) > 1 else "")
    data = {"errors": list(messages)}
    return b"".join(
        orjson.dumps(
            {
                "jsonrpc": "2.0",
                "id": rid,
                "error": {
                    "code": -32603,
                    "message": f"acp-proxy could not start ({reason}) during {method}",
                    "data": data,
                },
            }
        )
        + b"\n"
        for rid, method in ((1, "initialize"), ("b", "session/new"))
    )


def _said(stderr: bytes) -> list[str]:
    """The ``acp-proxy: MESSAGE`` lines of stderr, as messages."""
    return [
        line.removeprefix(b"acp-proxy: ").decode()
        for line in stderr.splitlines()
        if line.startswith(b"acp-proxy: ")
    ]


async def test_a_config_error_reaches_the_log_file_and_the_editor(tmp_path: Path) -> None:
    config = write_config(tmp_path / "rules.yaml", "rulez: []\nmax_frame_bytes: -1\n")
    log_file = tmp_path / "proxy.log"
    cmd = [sys.executable, "-m", "acp_proxy", "--config", config, "--log-file", str(log_file)]
    ran = await run([*cmd, "--", "my-agent"], TWO_REQUESTS)
    assert ran.rc == 2
    said = _said(ran.stderr)
    assert len(said) == 2 and all(m.startswith(f"{config}:") for m in said)
    assert ran.stdout == _refused(*said)
    text = log_file.read_text()  # the README's editor recipe: console format, in the file
    assert [line.split("cannot start", 1)[1].strip() for line in text.splitlines()] == [
        f"error={m!r}" if " " in m else f"error={m}" for m in said
    ]


async def test_a_config_error_is_an_event_of_the_json_log() -> None:
    config_missing = "/nonexistent-acp-proxy-dir/rules.yaml"
    cmd = [*PROXY, "--config", config_missing, "--", "my-agent"]
    ran = await run(cmd, TWO_REQUESTS)
    assert ran.rc == 2
    message = f"{config_missing}: cannot read the config file: No such file or directory"
    assert ran.stderr.splitlines()[0] == f"acp-proxy: {message}".encode()
    assert [(e["level"], e["error"]) for e in ran.events("cannot start")] == [("error", message)]
    assert ran.stdout == _refused(message)


async def test_a_record_path_that_cannot_be_opened_is_answered(tmp_path: Path) -> None:
    log_file = tmp_path / "proxy.log"
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    for record, why in (
        (tmp_path / "missing" / "s.jsonl", "No such file or directory"),
        (
            tmp_path / "link.jsonl",
            "it is a symbolic link (a record is never written through a link)",
        ),
    ):
        cmd = [*PROXY, "--log-file", str(log_file), "--record", str(record), "--", "my-agent"]
        ran = await run(cmd, TWO_REQUESTS)
        assert ran.rc == 2
        assert ran.stdout == _refused(f"--record {record}: {why}")
        events = [orjson.loads(line) for line in log_file.read_bytes().splitlines()]
        assert [e["error"] for e in events if e["event"] == "cannot open the record file"][
            -1
        ] == why


async def test_a_usage_error_after_the_options_is_answered() -> None:
    cmd = [*PROXY, "--connect", "tcp://127.0.0.1:9", "--", "my-agent"]
    ran = await run(cmd, TWO_REQUESTS)
    assert ran.rc == 2
    message = (
        "--connect names the agent's address; an AGENT_CMD cannot be used with it "
        "(drop one of them)"
    )
    assert f"\nacp-proxy: error: {message}\n".encode() in ran.stderr  # argparse's own line
    assert [e["error"] for e in ran.events("cannot start")] == [message]
    assert ran.stdout == _refused(message)


async def test_a_log_file_that_cannot_be_opened_is_answered(tmp_path: Path) -> None:
    log_file = tmp_path / "missing" / "proxy.log"
    ran = await run([*PROXY, "--log-file", str(log_file), "--", "my-agent"], TWO_REQUESTS)
    assert ran.rc == 2
    message = f"--log-file {log_file}: No such file or directory"
    assert ran.stderr == f"acp-proxy: {message}\n".encode()
    assert ran.stdout == _refused(message)


# --- what an editor's error box shows ----------------------------------------------------------


async def test_on_stdio_the_agents_words_are_not_buried_under_the_proxys_log() -> None:
    script = "cat >/dev/null & echo 'Error: ANTHROPIC_API_KEY not set' >&2; sleep 0.2; exit 1"
    cmd = [sys.executable, "-m", "acp_proxy", "--", "sh", "-c", script]
    ran = await run(cmd, request(1, "initialize", {}), env=proxy_env(NO_COLOR="1"))
    assert ran.rc == 1
    lines = ran.stderr.decode().splitlines()
    # The agent's line first; after it only the proxy's warnings, none of its info lines
    # (``starting``, the exit summary).
    assert lines[0] == "Error: ANTHROPIC_API_KEY not set"
    assert all("[warning  ]" in line for line in lines[1:]), lines


@pytest.mark.parametrize(
    ("options", "info"),
    [
        ((), False),  # console on stderr of a stdio session: warnings and errors only
        (("--log-level", "info"), True),
        (("--log-format", "json"), True),  # a machine reads it
    ],
)
async def test_the_default_level_on_stderr(options: tuple[str, ...], info: bool) -> None:
    cmd = [sys.executable, "-m", "acp_proxy", *options, "--", "sh", "-c", "exit 0"]
    ran = await run(cmd, b"")
    assert (b"starting" in ran.stderr, b"exit" in ran.stderr) == (info, info)


async def test_with_a_log_file_the_default_level_is_info(tmp_path: Path) -> None:
    log_file = tmp_path / "proxy.log"
    ran = await run([*PROXY[:3], "--log-file", str(log_file), "--", "sh", "-c", "exit 0"])
    assert ran.rc == 0
    assert ran.stderr == b""
    assert "starting" in log_file.read_text() and " exit " in log_file.read_text()
