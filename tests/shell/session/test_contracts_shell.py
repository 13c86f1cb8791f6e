"""Contracts of the shell end to end: behaviours no narrower test pins down.

Real ``python -m acp_proxy`` subprocesses, real fake agents, real pipes and sockets (loopback and
Unix paths only). Every wait is bounded (``anyio.fail_after`` or a subprocess timeout).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson
import pytest
from proxy_harness import (
    REPO,
    TESTS,
    Lines,
    children,
    close_pipes,
    echo_response,
    error_line,
    init_response,
    pipe_full,
    proxy_cmd,
    proxy_env,
    request,
    run,
    stdin_full,
    write_config,
)

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.wire.chain import FORWARD, Chain, Direction, Link, MessageContext, Replace, Verdict

pytestmark = pytest.mark.anyio

PROXY = [sys.executable, "-m", "acp_proxy"]
TINY = [sys.executable, "-S", str(TESTS / "tiny_agent.py")]
TIMEOUT = 15.0


def env_with(*paths: Path, **extra: str) -> dict[str, str]:
    """``proxy_env`` with ``tests/`` (and ``paths``) importable, for ``use: module:Class``."""
    env = proxy_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in paths), str(TESTS), env["PYTHONPATH"]])
    return env


def json_lines(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in data.splitlines() if line.startswith(b"{")]


def frame(obj: object) -> bytes:
    return orjson.dumps(obj) + b"\n"


@dataclass
class Session:
    """An interactive proxy on stdio: send frames, read answer lines, collect stderr."""

    proc: anyio.abc.Process
    out: Lines
    err: list[bytes] = field(default_factory=list)

    async def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send(data)

    async def finish(self) -> tuple[int, bytes, list[dict[str, Any]]]:
        """Close the client's input; (exit code, rest of stdout, JSON log events)."""
        assert self.proc.stdin is not None
        await self.proc.stdin.aclose()
        rest = await self.out.rest()
        rc = await self.proc.wait()
        return rc, rest, json_lines(b"".join(self.err))


@contextlib.asynccontextmanager
async def interactive(cmd: list[str], env: dict[str, str]) -> AsyncIterator[Session]:
    async with await anyio.open_process(cmd, env=env, cwd=str(REPO)) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        session = Session(proc, Lines(proc.stdout))

        async def drain() -> None:
            assert proc.stderr is not None
            async for chunk in proc.stderr:
                session.err.append(chunk)

        try:
            with anyio.fail_after(TIMEOUT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(drain)
                    yield session
        finally:
            if proc.returncode is None:
                proc.kill()
                with anyio.CancelScope(shield=True):
                    await proc.wait()


# --- configuration sources -----------------------------------------------------------------------


async def test_acp_proxy_config_is_used_when_config_flag_is_absent(tmp_path: Path) -> None:
    # "ACP_PROXY_CONFIG may name the config file." The good file switches non-JSON agent
    # output to "forward", which is visible on stdout (the default would divert the banner).
    good = write_config(tmp_path / "env.yaml", "non_json: forward\n")
    ran = await run(
        proxy_cmd("--log-format", "json", agent=["--banner", "hello banner"]),
        request(1, "initialize", {}),
        env=proxy_env(ACP_PROXY_CONFIG=good),
    )
    assert (ran.rc, ran.stdout) == (0, b"hello banner\n" + init_response(1))
    assert ran.events("starting")[0]["config"] == good


async def test_max_frame_bytes_flag_wins_over_the_config_file(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", "max_frame_bytes: 64MiB\n")
    big = request(2, "x/pad", {"p": "a" * 200})
    ran = await run(
        proxy_cmd("--config", config, "--max-frame-bytes", "100", "--log-level", "error"),
        request(1, "initialize", {}) + big,
    )
    assert ran.rc == 0
    assert sorted(ran.stdout.splitlines(keepends=True)) == sorted(
        [
            init_response(1),
            error_line(
                2,
                -32600,
                f"acp-proxy: message of {len(big) - 1} bytes exceeds the 100-byte limit; "
                "not forwarded",
            ),
        ]
    )


# --- logging destinations ------------------------------------------------------------------------


async def test_log_file_is_appended_in_console_format_and_stdout_stays_protocol(
    tmp_path: Path,
) -> None:
    log_file = tmp_path / "proxy.log"
    log_file.write_text("previous line\n")
    log_file.chmod(0o600)  # an existing log must be private (tests/shell/log/test_log_file.py)
    for rid in (1, 2):
        ran = await run(
            proxy_cmd("--log-format", "console", "--log-file", str(log_file)),
            request(rid, "initialize", {}),
        )
        assert (ran.rc, ran.stdout, ran.stderr) == (0, init_response(rid), b"")
    text = log_file.read_text()
    assert text.startswith("previous line\n")  # appended, never truncated
    lines = text.splitlines()[1:]
    assert sum("starting" in line for line in lines) == 2
    assert sum(" exit " in f" {line} " for line in lines) == 2
    assert "\x1b[" not in text  # no colours in a file
    assert not any(line.startswith("{") for line in lines)  # console, not JSON


# --- the rules file end to end -------------------------------------------------------------------


async def test_target_message_rule_end_to_end(tmp_path: Path) -> None:
    """``target: message`` sets ``params._meta`` (a plain object) on matching messages only, with
    ``${VAR}`` resolved at start-up; a key the message already sets keeps its value; unmatched
    frames and malformed client frames reach the agent byte for byte."""
    config = write_config(
        tmp_path / "trace.yaml",
        "rules:\n"
        "  - name: trace\n"
        "    match: {direction: client_to_agent, method: session/prompt}\n"
        "    target: message\n"
        "    set_meta: {traceparent: '${TP}', example.dev/by: proxy}\n",
    )
    record = tmp_path / "agent_received"
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    cmd = proxy_cmd("--config", config, agent=["--record", str(record)])
    prompt = {"sessionId": "s", "prompt": [{"type": "text", "text": "hi"}]}
    own_meta = {"sessionId": "s", "_meta": {"example.dev/by": "client", "x.dev/k": None}}
    other = b'{"jsonrpc":"2.0", "id":4, "method":"session/load", "params":{"n":1}}\n'
    garbage = b'{"jsonrpc":"2.0","id":5,"method":\n'
    async with interactive(cmd, proxy_env(TP=tp)) as s:
        await s.send(request(1, "initialize", {}))
        assert await s.out.line() == init_response(1)
        await s.send(request(2, "session/prompt", prompt))
        annotated = {**prompt, "_meta": {"traceparent": tp, "example.dev/by": "proxy"}}
        assert await s.out.line() == echo_response(2, annotated)
        await s.send(request(3, "session/prompt", own_meta))
        kept = {
            "sessionId": "s",
            "_meta": {"example.dev/by": "client", "x.dev/k": None, "traceparent": tp},
        }
        assert await s.out.line() == echo_response(3, kept)
        await s.send(other + garbage)
        assert await s.out.line() == echo_response(4, {"n": 1})
        rc, rest, _ = await s.finish()
    assert (rc, rest) == (0, b"")
    assert record.read_bytes() == (
        request(1, "initialize", {})
        + frame({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": annotated})
        + frame({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": kept})
        + other
        + garbage
    )


def tool_call_update(call: str, meta: object = ..., **extra: object) -> dict[str, Any]:
    update: dict[str, Any] = {"sessionUpdate": "tool_call_update", "toolCallId": call, **extra}
    if meta is not ...:
        update["_meta"] = meta
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": "s", "update": update},
    }


async def test_batch_with_annotated_entries_is_one_array_then_the_follow_up(
    tmp_path: Path,
) -> None:
    """A batch passes the chain entry by entry and leaves as one array in the same order;
    the follow-up of a clear (``_meta: null`` + set_meta) is a separate frame right after the
    array, never wrapped into a batch; the next frame comes after both."""
    config = write_config(
        tmp_path / "rules.yaml",
        "rules:\n"
        "  - name: route\n"
        "    match: {direction: agent_to_client, update: [tool_call_update]}\n"
        "    set_meta: {example.dev/route: edge}\n",
    )
    chunk = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "s",
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "x"},
            },
        },
    }
    cleared = tool_call_update("t1", None, status="in_progress")
    plain = tool_call_update("t2", title="Read")
    batch = [chunk, cleared, plain]
    after = {"jsonrpc": "2.0", "id": "perm", "method": "session/request_permission_x"}
    script = tmp_path / "replay.txt"
    script.write_bytes(
        b"C "
        + request(1, "initialize", {})
        + b"A "
        + init_response(1)
        + b"A "
        + frame(batch)
        + b"A "
        + frame(after)
    )
    ran = await run(
        proxy_cmd("--config", config, agent=["--replay", str(script)]),
        request(1, "initialize", {}),
    )
    assert ran.rc == 0, ran.stderr
    plain_annotated = tool_call_update("t2", {"example.dev/route": "edge"}, title="Read")
    follow_up = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "s",
            "update": {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "t1",
                "_meta": {"example.dev/route": "edge"},
            },
        },
    }
    assert ran.stdout == (
        init_response(1)
        + frame([chunk, cleared, plain_annotated])
        + frame(follow_up)
        + frame(after)
    )


# --- user middleware by import path, end to end --------------------------------------------------


async def test_custom_middleware_by_import_path_with_options(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "mw.yaml",
        "middleware:\n"
        "  - use: custom_middleware:Tag\n"
        "    with: {key: example.dev/who, value: proxy}\n",
    )
    note: dict[str, Any] = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk"}},
    }
    script = tmp_path / "replay.txt"
    script.write_bytes(
        b"C " + request(1, "initialize", {}) + b"A " + init_response(1) + b"A " + frame(note)
    )
    ran = await run(
        proxy_cmd("--config", config, "--log-format", "json", agent=["--replay", str(script)]),
        request(1, "initialize", {}),
        env=env_with(),
    )
    assert ran.rc == 0, ran.stderr
    tagged = {**note, "params": {**note["params"], "_meta": {"example.dev/who": "proxy"}}}
    assert ran.stdout == init_response(1) + frame(tagged)
    assert ran.events("starting")[0]["middleware"] == ["Tag"]
    assert ran.events("exit")[0]["rewritten"] == 1


async def test_a_user_middleware_that_keeps_time_sends_on_its_ticks(tmp_path: Path) -> None:
    """``Ticking`` (the public base): what ``on_tick`` returns toward the client is sent about
    once a second while the session runs; a tick that raises is logged and the session goes on."""
    text = "middleware:\n  - use: custom_middleware:Ticker\n"
    cmd = proxy_cmd("--config", write_config(tmp_path / "tick.yaml", text), "--log-format", "json")
    tick = b'{"jsonrpc":"2.0","method":"x/tick","params":{"n":%d}}\n'
    async with interactive(cmd, env_with()) as s:
        await s.send(request(1, "initialize", {}))
        with anyio.fail_after(TIMEOUT):
            got = [await s.out.line() for _ in range(3)]
        # The ticks in order; the answer to initialize wherever it fell among them.
        assert [line for line in got if line != init_response(1)] == [tick % 1, tick % 3]
        assert init_response(1) in got
        rc, rest, events = await s.finish()
    assert rc == 0 and rest == b""
    failed = [e for e in events if e["event"] == "a middleware failed on its tick"]
    assert len(failed) == 1 and failed[0]["level"] == "error"


async def test_raising_middleware_fails_open_and_forwards_the_exact_bytes(tmp_path: Path) -> None:
    config = write_config(tmp_path / "boom.yaml", "middleware:\n  - use: custom_middleware:Boom\n")
    record = tmp_path / "agent_received"
    # Spacing and a big integer: a re-encoded frame could not keep them.
    prompt = b'{"jsonrpc":"2.0", "id":2, "method":"session/prompt", "params":{"n":%d}}\n' % 2**70
    cmd = proxy_cmd("--config", config, "--log-format", "json", agent=["--record", str(record)])
    async with interactive(cmd, env_with()) as s:
        await s.send(request(1, "initialize", {}))
        assert await s.out.line() == init_response(1)
        await s.send(prompt)
        assert await s.out.line() == b'{"jsonrpc":"2.0","id":2,"result":{"echo":{"n":%d}}}\n' % (
            2**70
        )
        rc, rest, events = await s.finish()
    assert (rc, rest) == (0, b"")
    assert record.read_bytes() == request(1, "initialize", {}) + prompt
    failed = [e for e in events if e["event"] == "middleware failed"]
    # The request (client to agent) and its response (agent to client) each passed Boom.
    assert [(e["middleware"], e["error"], e["policy"], e["level"]) for e in failed] == [
        ("Boom", "RuntimeError: boom", "fail-open: message forwarded unchanged", "error")
    ] * 2
    [summary] = [e for e in events if e["event"] == "exit"]
    assert (summary["errors"], summary["dropped"], summary["rewritten"]) == (2, 0, 0)


async def test_fail_closed_middleware_answers_the_requester_and_drops(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "boom.yaml",
        "middleware:\n  - use: custom_middleware:Boom\n    fail_closed: true\n",
    )
    record = tmp_path / "agent_received"
    cmd = proxy_cmd("--config", config, "--log-format", "json", agent=["--record", str(record)])
    async with interactive(cmd, env_with()) as s:
        await s.send(request(1, "initialize", {}))
        assert await s.out.line() == init_response(1)
        await s.send(request("p", "session/prompt", {"a": 1}))
        assert await s.out.line() == error_line("p", -32603, "acp-proxy: middleware Boom failed")
        # A notification has nobody to answer: it is dropped, silently for the client.
        await s.send(b'{"jsonrpc":"2.0","method":"session/cancel","params":{}}\n')
        rc, rest, events = await s.finish()
    assert (rc, rest) == (0, b"")
    assert record.read_bytes() == request(1, "initialize", {})
    failed = [e for e in events if e["event"] == "middleware failed"]
    assert [e["policy"] for e in failed] == ["fail-closed: message dropped"] * 2
    dropped = [(e["method"], e["by"]) for e in events if e["event"].startswith("message dropped")]
    assert dropped == [("session/prompt", "Boom"), ("session/cancel", "Boom")]


RESPONSE_BOOM = '''
from acp_proxy.wire.chain import FORWARD, BaseMiddleware, MessageContext, Verdict
from acp_proxy.base.jsontypes import JsonObject


class BoomOnResults(BaseMiddleware):
    """Raises on responses only (messages with a result)."""

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        if "result" in message:
            raise RuntimeError("bad result")
        return FORWARD
'''


async def test_fail_closed_on_a_response_does_not_leave_the_request_hanging(
    tmp_path: Path,
) -> None:
    (tmp_path / "review_boom.py").write_text(RESPONSE_BOOM)
    config = write_config(
        tmp_path / "boom.yaml",
        "middleware:\n  - use: review_boom:BoomOnResults\n    fail_closed: true\n",
    )
    cmd = proxy_cmd("--config", config, "--log-format", "json")
    async with interactive(cmd, env_with(tmp_path)) as s:
        await s.send(request(1, "initialize", {}))
        assert await s.out.line() == init_response(1)
        await s.send(request(2, "session/prompt", {}))
        # The agent answered; the answer was dropped. The client must not wait forever for id 2.
        answer = b""
        with anyio.move_on_after(3):
            answer = await s.out.line()
        rc, rest, _ = await s.finish()
    assert answer != b"", "no answer to request 2 within 3 s"
    assert orjson.loads(answer)["id"] == 2
    assert orjson.loads(answer)["error"]["code"] == -32603
    assert (rc, rest) == (0, b"")


# --- backpressure toward the agent ---------------------------------------------------------------

NOT_READING_AGENT = "import time\nwhile True:\n    time.sleep(60)\n"
# The pipes found full for this long: the proxy stopped reading (not a pause between reads);
# then it must go on reading nothing for STILL_STALLED_S.
SETTLED_S = 0.2
STILL_STALLED_S = 1.0


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_agent_that_stops_reading_stops_the_proxy_reading_the_client(tmp_path: Path) -> None:
    """When one side stops reading, the proxy stops reading from the other side.
    The agent never reads its stdin; the client writes as fast as it can. The proxy must stop
    accepting client bytes after a bounded amount (pipes + its bounded queue), not buffer the
    whole stream; SIGTERM then takes the ladder down (agent ignores EOF: SIGTERM ends it)."""
    config = write_config(tmp_path / "c.yaml", "agent:\n  grace_period: 0.2\n")
    proc = subprocess.Popen(
        [
            *PROXY,
            "--config",
            config,
            "--log-level",
            "error",
            "--",
            sys.executable,
            "-c",
            NOT_READING_AGENT,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=proxy_env(),
        cwd=str(REPO),
    )
    assert proc.stdin is not None and proc.stdout is not None
    line = b'{"jsonrpc":"2.0","method":"_vendor/n","params":{"t":"' + b"n" * 960 + b'"}}\n'
    block = line * 1024  # ~1 MiB
    written = [0]
    stop = threading.Event()

    def writer() -> None:
        assert proc.stdin is not None
        try:
            while not stop.is_set() and written[0] < 300 * len(block):
                proc.stdin.write(block)
                proc.stdin.flush()
                written[0] += len(block)
        except (BrokenPipeError, ValueError, OSError):
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        # The proxy stopped reading its stdin: the agent's stdin pipe is full (it never reads),
        # and the pipe toward the proxy stays full while the writer waits.
        deadline = time.monotonic() + TIMEOUT
        full_since: float | None = None
        while full_since is None or time.monotonic() - full_since < SETTLED_S:
            assert time.monotonic() < deadline, f"the proxy still reads after {written[0]} bytes"
            agents = children(proc.pid)
            full = len(agents) == 1 and stdin_full(agents[0]) and pipe_full(proc.stdin.fileno())
            full_since = (full_since or time.monotonic()) if full else None
            time.sleep(0.02)
        first = written[0]
        time.sleep(STILL_STALLED_S)
        second = written[0]
        rss_kib = _rss_kib(proc.pid)
        proc.send_signal(signal.SIGTERM)
        stop.set()
        rc = proc.wait(timeout=TIMEOUT)
        out = proc.stdout.read()
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait(timeout=5)
        thread.join(5)
        close_pipes(proc)
    # Stalled: nothing more was accepted in the second interval, and far less than was offered.
    assert second == first, (first, second)
    assert second < 64 * len(block), f"proxy accepted {second / 2**20:.0f} MiB without a reader"
    assert rss_kib < 100 * 1024, f"proxy RSS {rss_kib / 1024:.1f} MiB"
    assert rc == 128 + signal.SIGTERM
    assert out == b""


# --- sockets: options from the YAML file ---------------------------------------------------------


async def _connect_unix(path: Path) -> anyio.abc.SocketStream:
    """Connect once the proxy listens (the file exists between bind and listen: retry)."""
    while True:
        try:
            return await anyio.connect_unix(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            await anyio.sleep(0.02)


async def test_listen_from_the_config_file_logs_to_file_and_sigint_removes_the_socket(
    tmp_path: Path,
) -> None:
    """``listen:`` in the YAML file alone (no --listen) serves clients; with --log-file nothing
    goes to stdout or stderr; SIGINT is a graceful shutdown (exit 0) that removes the socket."""
    sock = tmp_path / "acp.sock"
    log_file = tmp_path / "proxy.log"
    config = write_config(tmp_path / "listen.yaml", f"listen: unix://{sock}\n")
    cmd = [*PROXY, "--config", config, "--log-format", "json", "--log-file", str(log_file)]
    with anyio.fail_after(TIMEOUT):
        async with await anyio.open_process(
            [*cmd, "--", *TINY], env=proxy_env(), cwd=str(REPO)
        ) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            try:
                while not any(e["event"] == "listening" for e in json_lines(_read(log_file))):
                    await anyio.sleep(0.02)
                stream = await anyio.connect_unix(str(sock))
                lines = Lines(stream)
                await stream.send(request(1, "initialize", {}))
                assert await lines.line() == init_response(1)
                await stream.send(request(2, "x", {"k": "é"}))
                assert await lines.line() == echo_response(2, {"k": "é"})
                await stream.send_eof()
                assert await lines.rest() == b""
                await stream.aclose()
                proc.send_signal(signal.SIGINT)
                out = await Lines(proc.stdout).rest()
                err = await Lines(proc.stderr).rest()
                rc = await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    with anyio.CancelScope(shield=True):
                        await proc.wait()
    assert (rc, out, err) == (0, b"", b"")
    assert not sock.exists()
    events = json_lines(log_file.read_bytes())
    [listening] = [e for e in events if e["event"] == "listening"]
    assert (listening["address"], listening["config"]) == (f"unix://{sock}", config)
    assert [e["signal"] for e in events if e["event"] == "signal received; shutting down"] == [
        "SIGINT"
    ]
    assert events[-1]["event"] == "exit"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


async def test_connect_from_the_config_file_without_agent_command(tmp_path: Path) -> None:
    """``connect:`` in the YAML file alone: no AGENT_CMD needed; the session runs over it."""
    agent_sock = tmp_path / "agent.sock"
    config = write_config(tmp_path / "connect.yaml", f"connect: unix://{agent_sock}\n")
    received: list[bytes] = []

    async def agent(stream: anyio.abc.SocketStream) -> None:
        lines = Lines(stream)
        received.append(await lines.line())
        await stream.send(init_response(1))
        received.append(await lines.rest())
        await stream.aclose()

    with anyio.fail_after(TIMEOUT):
        listener = await anyio.create_unix_listener(agent_sock)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, agent)
            ran = await run(
                [*PROXY, "--config", config, "--log-format", "json"], request(1, "initialize", {})
            )
            tg.cancel_scope.cancel()
    assert (ran.rc, ran.stdout) == (0, init_response(1))
    assert received == [request(1, "initialize", {}), b""]
    assert ran.events("connecting to the agent")[0]["address"] == f"unix://{agent_sock}"


async def test_connect_timeout_from_the_config_file(tmp_path: Path) -> None:
    """``connect_timeout:`` in the YAML file bounds a connect that gets no answer (a loopback
    listener whose accept queue is full drops further SYNs): exit 1 with the documented message,
    after about that long."""
    holder = socket.socket()
    fillers: list[socket.socket] = []
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen(0)
        port = holder.getsockname()[1]
        # Fill the accept queue (nobody accepts) until a connect gets no answer.
        for _ in range(16):
            filler = socket.socket()
            filler.settimeout(0.3)
            fillers.append(filler)
            try:
                filler.connect(("127.0.0.1", port))
            except TimeoutError:
                break
        else:
            pytest.skip("could not fill the loopback accept queue")
        url = f"tcp://127.0.0.1:{port}"
        config = write_config(tmp_path / "c.yaml", f"connect: {url}\nconnect_timeout: 1\n")
        started = time.monotonic()
        ran = await run([*PROXY, "--config", config], request(1, "initialize", {}))
        elapsed = time.monotonic() - started
    finally:
        for filler in fillers:
            filler.close()
        holder.close()
    assert (ran.rc, ran.stdout) == (1, b"")
    assert ran.stderr.endswith(
        f"acp-proxy: cannot connect to the agent at {url}: no answer within 1 s "
        "(--connect-timeout)\n".encode()
    )
    assert 1.0 <= elapsed < TIMEOUT


COUNTER = '''
from acp_proxy.wire.chain import FORWARD, BaseMiddleware, MessageContext, Replace, Verdict
from acp_proxy.base.jsontypes import JsonObject


class Counter(BaseMiddleware):
    """Stamps how many session/prompt requests this instance has seen into params._meta."""

    needles = (b'"session/prompt"',)

    def __init__(self, key: str) -> None:
        self.key = key
        self.seen = 0

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        params = message.get("params")
        if message.get("method") != "session/prompt" or not isinstance(params, dict):
            return FORWARD
        self.seen += 1
        return Replace(({**message, "params": {**params, "_meta": {self.key: self.seen}}},))
'''


async def test_listen_sessions_have_their_own_middleware_and_version(tmp_path: Path) -> None:
    """Each connection has its own chain (middleware instances) and its own protocol
    version: a counter middleware counts per connection, and a connection that has not
    negotiated yet is forwarded untouched even though another one has."""
    (tmp_path / "review_counter.py").write_text(COUNTER)
    sock = tmp_path / "acp.sock"
    config = write_config(
        tmp_path / "mw.yaml",
        "middleware:\n  - use: review_counter:Counter\n    with: {key: example.dev/n}\n",
    )
    cmd = [*PROXY, "--config", config, "--log-format", "json", "--listen", f"unix://{sock}"]
    with anyio.fail_after(TIMEOUT):
        async with await anyio.open_process(
            [*cmd, "--", *TINY],
            env=env_with(tmp_path),
            cwd=str(REPO),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ) as proc:
            try:
                a = await _connect_unix(sock)
                b = await _connect_unix(sock)
                a_lines, b_lines = Lines(a), Lines(b)

                async def ask(stream: anyio.abc.SocketStream, lines: Lines, data: bytes) -> bytes:
                    await stream.send(data)
                    return await lines.line()

                prompt = request(2, "session/prompt", {"sessionId": "s"})
                assert await ask(a, a_lines, request(1, "initialize", {})) == init_response(1)
                assert await ask(a, a_lines, prompt) == echo_response(
                    2, {"sessionId": "s", "_meta": {"example.dev/n": 1}}
                )
                # B has not negotiated a version: its prompt passes untouched.
                assert await ask(b, b_lines, prompt) == echo_response(2, {"sessionId": "s"})
                assert await ask(b, b_lines, request(1, "initialize", {})) == init_response(1)
                assert await ask(b, b_lines, request(3, "session/prompt", {})) == echo_response(
                    3, {"_meta": {"example.dev/n": 1}}
                )
                assert await ask(a, a_lines, request(3, "session/prompt", {})) == echo_response(
                    3, {"_meta": {"example.dev/n": 2}}
                )
                for stream, lines in ((a, a_lines), (b, b_lines)):
                    await stream.send_eof()
                    assert await lines.rest() == b""
                    await stream.aclose()
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0
            finally:
                if proc.returncode is None:
                    proc.kill()
                    with anyio.CancelScope(shield=True):
                        await proc.wait()
    assert not sock.exists()


# --- the chain (pure): found while reading chain.py ---------------------------------------------


class _SplitInTwo:
    name = "split"

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        return Replace(({**message, "n": 1}, {**message, "n": 2}))


class _FailOnSecond:
    name = "fail-on-second"

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        if message.get("n") == 2:
            raise RuntimeError("second")
        return FORWARD


class _Stamp:
    name = "stamp"

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        return Replace(({**message, "stamped": True},))


def test_fail_closed_link_does_not_let_siblings_skip_later_links() -> None:
    chain = Chain([Link(_SplitInTwo()), Link(_FailOnSecond(), fail_closed=True), Link(_Stamp())])
    outcome = chain.run(
        {"jsonrpc": "2.0", "method": "x"}, MessageContext(Direction.CLIENT_TO_AGENT, 2)
    )
    # Whatever is forwarded has been through every link after the one that failed.
    assert all(m.get("stamped") is True for m in outcome.messages), outcome.messages
