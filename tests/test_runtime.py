"""The streaming shell end to end: real ``python -m acp_proxy``, real fake agents, real pipes.

Asserts exact bytes on the wire (style.md habit 9). Also drives ``pump_session`` in-process over
in-memory streams, the way the socket transports do.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import anyio
import anyio.abc
import orjson
import pytest
from proxy_harness import (
    GOLDEN,
    REPO,
    Lines,
    MemoryByteStream,
    blocked_writing,
    children,
    close_pipes,
    echo_response,
    error_line,
    init_response,
    measured_cmd,
    memory_pipe_pair,
    proxy_cmd,
    proxy_env,
    request,
    run,
    wait_until,
    write_config,
)

from acp_proxy.config import Config
from acp_proxy.shell.hooks import EndedSession
from acp_proxy.shell.session import PumpSession, pump_session
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.pipeline import Note, Observed

pytestmark = pytest.mark.anyio

# Golden files used by this module; test_every_golden_file_is_used checks the whole directory.
PASSTHROUGH_GOLDEN = ("session_v1.txt", "session_v2.txt")


def golden_sides(name: str) -> tuple[bytes, bytes]:
    """(what the client sends, what the agent sends) of a golden "C "/"A " session file."""
    client: list[bytes] = []
    agent: list[bytes] = []
    for line in (GOLDEN / name).read_bytes().split(b"\n"):
        if line:
            (client if line[:2] == b"C " else agent).append(line[2:] + b"\n")
    return b"".join(client), b"".join(agent)


# --- byte-exact pass-through -------------------------------------------------------------------


@pytest.mark.parametrize("name", PASSTHROUGH_GOLDEN)
async def test_golden_session_is_byte_exact_both_ways(name: str, tmp_path: Path) -> None:
    client, agent = golden_sides(name)
    record = tmp_path / "agent_received.txt"
    ran = await run(
        proxy_cmd(
            "--log-format", "json", agent=["--replay", str(GOLDEN / name), "--record", str(record)]
        ),
        client,
    )
    assert ran.rc == 0, ran.stderr
    assert ran.stdout == agent
    assert record.read_bytes() == client
    [summary] = ran.events("exit")
    version = 2 if name.endswith("v2.txt") else 1
    assert summary["version"] == version
    assert ran.events("protocol version negotiated")[0]["version"] == version
    assert summary["frames_client_to_agent"] == client.count(b"\n")
    assert summary["frames_agent_to_client"] == agent.count(b"\n")
    assert summary["rewritten"] == summary["errors"] == summary["diverted"] == 0


async def test_golden_session_with_example_rules_that_match_nothing(tmp_path: Path) -> None:
    # A config whose only rule can never match: every frame still leaves as its original bytes.
    config = write_config(
        tmp_path / "rules.yaml",
        "rules:\n"
        "  - name: never\n"
        "    match: {method: never/sent}\n"
        "    set_meta: {example.dev/x: y}\n",
    )
    client, agent = golden_sides("session_v2.txt")
    record = tmp_path / "agent_received.txt"
    ran = await run(
        proxy_cmd(
            "--config",
            config,
            agent=["--replay", str(GOLDEN / "session_v2.txt"), "--record", str(record)],
        ),
        client,
    )
    assert ran.rc == 0, ran.stderr
    assert ran.stdout == agent
    assert record.read_bytes() == client


def test_every_golden_file_is_used() -> None:
    """Every file under tests/golden/ is named by some test module (no dead goldens)."""
    sources = "".join(p.read_text(encoding="utf-8") for p in Path(__file__).parent.glob("*.py"))
    unused = [p.name for p in GOLDEN.iterdir() if p.is_file() and p.name not in sources]
    assert unused == []
    assert all((GOLDEN / name).is_file() for name in PASSTHROUGH_GOLDEN)


async def test_crlf_and_blank_lines_pass_unchanged(tmp_path: Path) -> None:
    # A CRLF writer's "\r" is part of the frame (byte-exact); blank lines carry no message.
    frames = (
        request(1, "initialize", {}) + b"\n   \n" + b'{"jsonrpc":"2.0","id":2,"method":"m"}\r\n'
    )
    record = tmp_path / "rec"
    ran = await run(proxy_cmd(agent=["--record", str(record)]), frames)
    assert ran.rc == 0
    assert record.read_bytes() == request(1, "initialize", {}) + (
        b'{"jsonrpc":"2.0","id":2,"method":"m"}\r\n'
    )
    assert ran.stdout == init_response(1) + echo_response(2, None)


async def test_batches_in_and_out() -> None:
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "method": "note"},
        {"jsonrpc": "2.0", "id": 2, "method": "a", "params": [1]},
    ]
    ran = await run(proxy_cmd(), orjson.dumps(batch) + b"\n")
    assert ran.rc == 0
    expected = [
        orjson.loads(init_response(1)),
        {"jsonrpc": "2.0", "id": 2, "result": {"echo": [1]}},
    ]
    assert ran.stdout == orjson.dumps(expected) + b"\n"


# --- oversize frames ---------------------------------------------------------------------------


def padded_request(rid: int, size: int) -> bytes:
    """A request frame of exactly ``size`` bytes (without its newline)."""
    base = request(rid, "x/pad", {"p": ""}).rstrip(b"\n")
    frame = base.replace(b'"p":""', b'"p":"' + b"a" * (size - len(base)) + b'"')
    assert len(frame) == size
    return frame


async def test_frames_just_under_and_just_over_the_limit(tmp_path: Path) -> None:
    limit = 1000
    at_limit = padded_request(1, limit)
    over = padded_request(2, limit + 1)
    record = tmp_path / "rec"
    config = write_config(tmp_path / "c.yaml", "non_json: log\n")
    ran = await run(
        proxy_cmd(
            "--config",
            config,
            "--max-frame-bytes",
            str(limit),
            "--log-format",
            "json",
            agent=["--record", str(record)],
        ),
        at_limit + b"\n" + over + b"\n",
    )
    assert ran.rc == 0
    # The agent got the frame at the limit, byte for byte, and never saw the one over it.
    assert record.read_bytes() == at_limit + b"\n"
    # Frame 2 was answered by the proxy itself with -32600 (the agent never saw it).
    reject = error_line(
        2,
        -32600,
        f"acp-proxy: message of {limit + 1} bytes exceeds the {limit}-byte limit; not forwarded",
    )
    # Two sources feed the client (the proxy's reply, the agent's answer): order between them
    # is not defined, each line is exact.
    assert sorted(ran.stdout.splitlines(keepends=True)) == sorted(
        [echo_response(1, orjson.loads(at_limit)["params"]), reject]
    )
    [warning] = ran.events("frame over the size limit discarded")
    assert (warning["size"], warning["limit"], warning["id"], warning["replied"]) == (
        limit + 1,
        limit,
        2,
        True,
    )


@pytest.mark.parametrize("data_size", [955, 956])
async def test_agent_response_just_under_and_just_over_the_limit(data_size: int) -> None:
    # The answer to request 1 is {"jsonrpc":"2.0","id":1,"result":{"data":"b..."}}: 45 + N bytes.
    limit = 1000
    ran = await run(
        proxy_cmd("--max-frame-bytes", str(limit), "--log-format", "json"),
        request(1, "_test/big", {"size": data_size}),
    )
    assert ran.rc == 0
    answer = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"data": "b" * data_size}})
    if len(answer) <= limit:
        assert len(answer) == limit
        assert ran.stdout == answer + b"\n"
    else:
        # The client would wait forever for id 1: it gets -32603 instead.
        assert ran.stdout == error_line(
            1,
            -32603,
            f"acp-proxy: the response was {len(answer)} bytes, over the {limit}-byte limit; "
            "dropped",
        )
        assert ran.events("frame over the size limit discarded")[0]["answered"] is True


def test_huge_oversize_line_keeps_memory_bounded(tmp_path: Path) -> None:
    """A ~100 MB line with a 1 MiB limit is discarded as it streams; the proxy's peak RSS stays
    far below the line's size (wait4 of the proxy forked from a small launcher: measured_cmd)."""
    size = 100 * 1024 * 1024
    head = b'{"jsonrpc":"2.0","id":"big","method":"x/huge","params":{"p":"'
    rss_file = tmp_path / "rss"
    proc = subprocess.Popen(
        measured_cmd(rss_file, proxy_cmd("--max-frame-bytes", str(1024 * 1024))),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=proxy_env(),
        cwd=str(REPO),
    )
    assert proc.stdin is not None and proc.stdout is not None
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))  # type: ignore[union-attr]
    reader.start()
    block = b"a" * (1024 * 1024)
    proc.stdin.write(head)
    for _ in range(size // len(block)):
        proc.stdin.write(block)
    proc.stdin.write(b'"}}\n' + request(1, "initialize", {}))
    proc.stdin.close()
    timer = threading.Timer(30, proc.kill)
    timer.start()
    try:
        _, status, _usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join(10)
    close_pipes(proc)
    assert proc.returncode == 0
    total = len(head) + size + 3
    assert out[0] == error_line(
        "big",
        -32600,
        f"acp-proxy: message of {total} bytes exceeds the 1048576-byte limit; not forwarded",
    ) + init_response(1)
    peak_mib = int(rss_file.read_text()) / 1024  # Linux: KiB
    assert peak_mib < 80, f"proxy peak RSS {peak_mib:.1f} MiB for a 100 MiB line"


# --- non-JSON agent output ---------------------------------------------------------------------


async def test_non_json_agent_output_is_diverted_and_warned_once() -> None:
    ran = await run(
        proxy_cmd(
            "--log-format",
            "json",
            agent=[
                "--banner",
                "Welcome to agent 1.0",
                "--banner",
                "loading...",
                "--banner",
                "\x1b[2J",
            ],
        ),
        request(1, "initialize", {}),
    )
    assert ran.rc == 0
    assert ran.stdout == init_response(1)
    warnings = [e for e in ran.log_events() if e["event"].startswith("agent wrote non-JSON")]
    assert [(w["kind"], w["sample"], w["level"]) for w in warnings] == [
        ("text", "Welcome to agent 1.0", "warning"),
        ("ansi-escape", "\x1b[2J", "warning"),
    ]
    assert ran.events("exit")[0]["diverted"] == 3


async def test_non_json_forward_policy_keeps_the_lines(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", "non_json: forward\n")
    ran = await run(
        proxy_cmd("--config", config, agent=["--banner", "hello"]), request(1, "initialize", {})
    )
    assert ran.rc == 0
    assert ran.stdout == b"hello\n" + init_response(1)


# --- the agent going away ----------------------------------------------------------------------


async def test_agent_crash_answers_requests_in_flight() -> None:
    frames = (
        request(1, "initialize", {})
        + request(2, "a")
        + request("three", "b")
        + b'{"jsonrpc":"2.0","method":"n"}\n'
        + request(4, "c")
    )
    ran = await run(
        proxy_cmd(agent=["--silent-after", "2", "--crash-after", "5", "--exit-code", "5"]), frames
    )
    assert ran.rc == 5
    assert ran.stdout == (
        init_response(1)
        + echo_response(2, None)
        + error_line("three", -32603, "agent exited with status 5 during b")
        + error_line(4, -32603, "agent exited with status 5 during c")
    )


async def test_agent_killed_by_signal_names_the_signal() -> None:
    frames = request(1, "initialize", {}) + request(2, "a")
    ran = await run(proxy_cmd(agent=["--silent-after", "1", "--kill-self", "SIGKILL"]), frames)
    assert ran.rc == 128 + 9
    assert ran.stdout == init_response(1) + error_line(
        2, -32603, "agent was killed by SIGKILL (status 137) during a"
    )


async def test_client_eof_closes_agent_stdin_and_exits_with_its_code() -> None:
    ran = await run(proxy_cmd(agent=["--exit-code", "7"]), request(1, "initialize", {}))
    assert ran.rc == 7
    assert ran.stdout == init_response(1)


async def test_interactive_round_trips_are_not_buffered() -> None:
    # Each answer arrives while the client keeps its input open: nothing waits for more input.
    async with await anyio.open_process(
        proxy_cmd(), env=proxy_env(), cwd=str(REPO), stderr=subprocess.DEVNULL
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        lines = Lines(proc.stdout)
        with anyio.fail_after(20):
            await proc.stdin.send(request(1, "initialize", {}))
            assert await lines.line() == init_response(1)
            for i in range(2, 50):
                await proc.stdin.send(request(i, "m", {"i": i}))
                assert await lines.line() == echo_response(i, {"i": i})
            await proc.stdin.aclose()
            assert await lines.rest() == b""
            assert await proc.wait() == 0


async def test_slow_client_backpressure_bounds_memory() -> None:
    """The agent floods 100 MB while the client does not read: the proxy stops reading the agent
    (bounded queues), so its RSS stays far below the flood; then every byte arrives in order."""
    flood = 100 * 1024 * 1024
    async with await anyio.open_process(
        proxy_cmd(agent=["--flood", str(flood)]),
        env=proxy_env(),
        cwd=str(REPO),
        stderr=subprocess.DEVNULL,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        with anyio.fail_after(40):
            # The agent fills the pipes and the proxy's queue, and then waits in a write.
            await wait_until(
                lambda: any(map(blocked_writing, children(proc.pid))), "the agent blocked"
            )
            rss_kib = _rss_kib(proc.pid)
            await proc.stdin.aclose()
            received = 0
            lines = 0
            tail = b""
            while True:
                try:
                    chunk = await proc.stdout.receive(1 << 20)
                except anyio.EndOfStream:
                    break
                received += len(chunk)
                lines += chunk.count(b"\n")
                tail = (tail + chunk)[-2000:]
            assert await proc.wait() == 0
    note_len = len(b'{"jsonrpc":"2.0","method":"_vendor/log","params":{"text":""}}\n') + 900
    assert received == (flood // note_len + 1) * note_len
    assert lines == flood // note_len + 1
    assert tail.endswith(b'"}}\n')
    assert rss_kib < 80 * 1024, f"proxy RSS {rss_kib / 1024:.1f} MiB while the client is stalled"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# --- logging -----------------------------------------------------------------------------------


async def test_debug_log_has_one_line_per_frame() -> None:
    update = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk"}},
    }
    frames = request(1, "initialize", {}) + orjson.dumps(update) + b"\n"
    ran = await run(proxy_cmd("--log-level", "debug", "--log-format", "json"), frames)
    assert ran.rc == 0
    frames_logged = [
        (e["direction"], e["method"], e["id"], e["update"], e["size"]) for e in ran.events("frame")
    ]
    assert frames_logged == [
        ("client_to_agent", "initialize", 1, None, len(request(1, "initialize", {})) - 1),
        (
            "client_to_agent",
            "session/update",
            None,
            "agent_message_chunk",
            len(frames) - 1 - len(request(1, "initialize", {})),
        ),
        ("agent_to_client", None, 1, None, len(init_response(1)) - 1),
    ]


async def test_debug_log_names_the_rules_that_changed_a_frame(tmp_path: Path) -> None:
    update = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "s",
            "update": {"sessionUpdate": "tool_call_update", "toolCallId": "t1"},
        },
    }
    script = tmp_path / "replay.txt"
    script.write_bytes(
        b"C "
        + request(1, "initialize", {})
        + b"A "
        + init_response(1)
        + b"A "
        + orjson.dumps(update)
        + b"\n"
    )
    config = write_config(
        tmp_path / "rules.yaml",
        "rules:\n  - name: tag\n    match: {update: [tool_call_update]}\n"
        "    set_meta: {example.dev/k: v}\n",
    )
    ran = await run(
        proxy_cmd(
            "--config",
            config,
            "--log-level",
            "debug",
            "--log-format",
            "json",
            agent=["--replay", str(script)],
        ),
        request(1, "initialize", {}),
    )
    assert ran.rc == 0
    annotated = {
        **update,
        "params": {
            "sessionId": "s",
            "update": {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "t1",
                "_meta": {"example.dev/k": "v"},
            },
        },
    }
    assert ran.stdout == init_response(1) + orjson.dumps(annotated) + b"\n"
    changed = [e["changed_by"] for e in ran.events("frame") if e["update"] == "tool_call_update"]
    assert changed == [["rules:tag"]]


async def test_info_log_has_start_version_and_exit_summary() -> None:
    ran = await run(proxy_cmd("--log-format", "json"), request(1, "initialize", {}))
    names = [e["event"] for e in ran.log_events()]
    assert names[0] == "starting"
    assert "protocol version negotiated" in names
    assert names[-1] == "exit"
    assert not ran.events("frame")  # per-frame lines only at debug
    summary = ran.events("exit")[0]
    assert {
        k: summary[k]
        for k in (
            "exit_code",
            "frames_client_to_agent",
            "frames_agent_to_client",
            "rewritten",
            "coalesced",
            "diverted",
            "errors",
        )
    } == {
        "exit_code": 0,
        "frames_client_to_agent": 1,
        "frames_agent_to_client": 1,
        "rewritten": 0,
        "coalesced": 0,
        "diverted": 0,
        "errors": 0,
    }


# --- pump_session over in-memory streams (the transport-agnostic core) ----------------------------


def _pipe_pair() -> tuple[MemoryByteStream, MemoryByteStream]:
    return memory_pipe_pair(16)


async def test_pump_session_over_memory_streams() -> None:
    client_side, proxy_client = _pipe_pair()
    proxy_agent, agent_side = _pipe_pair()

    async def agent() -> None:
        lines = Lines(agent_side)
        first = await lines.line()
        assert first == request(1, "initialize", {})
        # Two frames split across sends, one partial line completed later.
        reply = init_response(1) + b'{"jsonrpc":"2.0","method":"n","params":{}}\n'
        await agent_side.send(reply[:10])
        await agent_side.send(reply[10:])
        second = await lines.line()
        assert second == request(2, "hang")
        await agent_side.send_eof()

    reasons: list[str] = []

    async def reason() -> str:
        reasons.append("asked")
        return "agent connection lost"

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent)
            await client_side.send(request(1, "initialize", {}))
            await client_side.send(request(2, "hang"))
            session = await pump_session(
                Config(),
                proxy_client,
                proxy_client,
                proxy_agent,
                proxy_agent,
                agent_exit_reason=reason,
            )
        assert isinstance(session, PumpSession)
        await client_side.send_eof()
        got = Lines(client_side)
        out = b"".join([await got.line() for _ in range(3)])
    assert out == (
        init_response(1)
        + b'{"jsonrpc":"2.0","method":"n","params":{}}\n'
        + error_line(2, -32603, "agent connection lost during hang")
    )
    assert reasons == ["asked"]
    assert session.connection.version == 2
    assert session.stats.to_client.writes >= 1


class _Recorder:
    """A SessionObserver that keeps what it is told."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, bytes, tuple[bytes, ...] | None]] = []
        self.generated: list[tuple[str, tuple[bytes, ...]]] = []
        self.ended = 0

    def on_notes(self, notes: tuple[Note, ...], now: float) -> None:
        for note in notes:
            if isinstance(note, Observed):
                self.frames.append((str(note.direction), note.raw, note.sent))

    def on_generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        self.generated.append((str(direction), frames))

    def on_end(self, session: EndedSession, now: float) -> None:
        self.ended += 1


async def test_observers_see_every_frame_and_what_the_proxy_generated() -> None:
    client_side, proxy_client = _pipe_pair()
    proxy_agent, agent_side = _pipe_pair()

    async def agent() -> None:
        lines = Lines(agent_side)
        await lines.line()
        await agent_side.send(init_response(1))
        await lines.line()
        await agent_side.send_eof()

    recorder = _Recorder()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent)
            await client_side.send(request(1, "initialize", {}))
            await client_side.send(request(2, "hang"))
            await pump_session(
                Config(),
                proxy_client,
                proxy_client,
                proxy_agent,
                proxy_agent,
                observers=[recorder],
            )
    assert recorder.frames == [
        ("client_to_agent", request(1, "initialize", {})[:-1], None),
        ("client_to_agent", request(2, "hang")[:-1], None),
        ("agent_to_client", init_response(1)[:-1], None),
    ]
    assert recorder.generated == [
        ("agent_to_client", (error_line(2, -32603, "agent closed its output during hang")[:-1],))
    ]
    assert recorder.ended == 1
