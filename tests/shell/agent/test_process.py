"""The agent process: spawn errors, exit codes, signals, the shutdown ladder, no orphans, stderr.

Real ``python -m acp_proxy`` processes and real fake agents (tests/fake_agent.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import orjson
import pytest
from proxy_harness import (
    REPO,
    Lines,
    init_response,
    proxy_cmd,
    proxy_env,
    request,
    run,
    write_config,
)

from acp_proxy.shell.agent.process import describe_status, exit_code_of

pytestmark = pytest.mark.anyio


def test_exit_code_and_status_text() -> None:
    assert exit_code_of(0) == 0
    assert exit_code_of(3) == 3
    assert exit_code_of(-signal.SIGTERM) == 143
    assert describe_status(3) == "exited with status 3"
    assert describe_status(-9) == "was killed by SIGKILL (status 137)"


# --- spawn failures ----------------------------------------------------------------------------


async def test_agent_not_found_exits_127() -> None:
    ran = await run(
        [sys.executable, "-m", "acp_proxy", "--", "no-such-agent-xyz", "--acp"],
        b"",
        env=proxy_env(),
    )
    assert ran.rc == 127
    assert ran.stdout == b""
    assert ran.stderr.splitlines()[-1] == b"acp-proxy: no-such-agent-xyz: command not found"


async def test_agent_not_executable_exits_126(tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    ran = await run([sys.executable, "-m", "acp_proxy", "--", str(script)], b"")
    assert ran.rc == 126
    assert ran.stderr.splitlines()[-1] == (
        f"acp-proxy: {script}: cannot execute: Permission denied".encode()
    )


# --- exit codes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent_args", "expected"),
    [
        (["--exit-code", "0"], 0),
        (["--exit-code", "42"], 42),
        (["--kill-self", "SIGUSR1"], 128 + signal.SIGUSR1),
        (["--kill-self", "SIGTERM"], 128 + signal.SIGTERM),
    ],
)
async def test_proxy_exits_with_the_agent_status(agent_args: list[str], expected: int) -> None:
    ran = await run(proxy_cmd(agent=agent_args), request(1, "initialize", {}))
    assert ran.rc == expected
    assert ran.stdout == init_response(1)


# --- environment and working directory ---------------------------------------------------------


async def test_agent_inherits_env_with_overrides_and_cwd(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", "agent:\n  env:\n    FAKE_OVERRIDE: from-config\n")
    frames = (
        request(1, "_test/env", {"name": "FAKE_INHERITED"})
        + request(2, "_test/env", {"name": "FAKE_OVERRIDE"})
        + request(3, "_test/cwd")
    )
    ran = await run(
        proxy_cmd("--config", config),
        frames,
        env=proxy_env(FAKE_INHERITED="inherited", FAKE_OVERRIDE="env"),
    )
    assert ran.rc == 0, ran.stderr
    assert ran.stdout == (
        b'{"jsonrpc":"2.0","id":1,"result":{"value":"inherited"}}\n'
        b'{"jsonrpc":"2.0","id":2,"result":{"value":"from-config"}}\n'
        + orjson.dumps({"jsonrpc": "2.0", "id": 3, "result": {"cwd": str(REPO)}})
        + b"\n"
    )


# --- signals and the shutdown ladder -----------------------------------------------------------


async def _start_and_signal(
    sig: int, agent_args: list[str], proxy_args: list[str] | None = None
) -> tuple[int, bytes, bytes]:
    """Start the proxy, do one round trip (so it is running), send ``sig``, collect the rest."""
    async with await anyio.open_process(
        proxy_cmd("--log-format", "json", *(proxy_args or []), agent=agent_args),
        env=proxy_env(),
        cwd=str(REPO),
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        lines = Lines(proc.stdout)
        errors: list[bytes] = []

        async def drain_stderr() -> None:
            assert proc.stderr is not None
            async for chunk in proc.stderr:
                errors.append(chunk)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drain_stderr)
                await proc.stdin.send(request(1, "initialize", {}))
                first = await lines.line()
                proc.send_signal(signal.Signals(sig))
                rest = await lines.rest()
                rc = await proc.wait()
    return rc, first + rest, b"".join(errors)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
async def test_signal_to_proxy_closes_agent_stdin_and_exits_with_its_code(sig: int) -> None:
    # The agent exits 3 when its stdin closes: the first rung of the ladder is enough.
    rc, out, err = await _start_and_signal(sig, ["--exit-code", "3"])
    assert rc == 3
    assert out == init_response(1)
    events = [orjson.loads(line) for line in err.splitlines() if line.startswith(b"{")]
    assert {
        "event": "signal received; shutting the agent down",
        "signal": signal.Signals(sig).name,
    }.items() <= next(e for e in events if e["event"].startswith("signal")).items()
    assert not any("SIGTERM" in e["event"] for e in events)


async def test_agent_that_ignores_stdin_eof_gets_sigterm(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", "agent:\n  grace_period: 0.2\n")
    rc, out, err = await _start_and_signal(signal.SIGTERM, ["--hang-at-eof"], ["--config", config])
    assert rc == 128 + signal.SIGTERM
    assert out == init_response(1)
    assert b"sending SIGTERM" in err
    assert b"SIGKILL" not in err


async def test_agent_that_ignores_sigterm_gets_sigkill(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", "agent:\n  grace_period: 0.2\n")
    ran = await run(
        proxy_cmd(
            "--config", config, agent=["--hang-at-eof", "--ignore-term", "--silent-after", "1"]
        ),
        request(1, "initialize", {}) + request(2, "pending"),
    )
    assert ran.rc == 128 + signal.SIGKILL
    # Request 2 was never answered: the client still gets an answer for it.
    assert ran.stdout == init_response(1) + (
        b'{"jsonrpc":"2.0","id":2,"error":{"code":-32603,'
        b'"message":"agent was killed by SIGKILL (status 137) during pending"}}\n'
    )
    assert b"sending SIGTERM" in ran.stderr and b"sending SIGKILL" in ran.stderr


# --- no orphans --------------------------------------------------------------------------------


def _is_dead(pid: int) -> bool:
    """Gone, or a zombie waiting for init (a container's PID 1 may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.mark.parametrize("ending", ["eof", "crash", "signal"])
async def test_grandchild_is_reaped(ending: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    agent = ["--grandchild", str(pidfile)]
    if ending == "crash":
        ran = await run(
            proxy_cmd(agent=[*agent, "--crash-after", "1", "--exit-code", "1"]),
            request(1, "initialize", {}),
        )
        assert ran.rc == 1
    elif ending == "eof":
        ran = await run(proxy_cmd(agent=agent), request(1, "initialize", {}))
        assert ran.rc == 0
    else:
        rc, _, _ = await _start_and_signal(signal.SIGTERM, agent)
        assert rc == 0
    grandchild = int(pidfile.read_text())
    with anyio.fail_after(5):
        while not _is_dead(grandchild):
            await anyio.sleep(0.02)


# --- stderr ------------------------------------------------------------------------------------


async def test_chatty_stderr_passthrough_does_not_stall() -> None:
    size = 20 * 1024 * 1024
    ran = await run(proxy_cmd(agent=["--stderr-bytes", str(size)]), request(1, "initialize", {}))
    assert ran.rc == 0
    assert ran.stdout == init_response(1)
    # Every byte the agent wrote arrived. Counted in bytes, not whole lines: the agent and the
    # proxy share this stderr, and a log line of the proxy's (its "starting" line, now that the
    # agent starts before the proxy's event loop) may land inside one of the agent's writes,
    # which are larger than PIPE_BUF and so not atomic on a pipe.
    # Without the proxy's own lines (each one write, under PIPE_BUF, so whole), what is left is
    # exactly what the agent wrote (tests/fake_agent.py: lines of 99 x, 1000 a write).
    agent_out = re.sub(rb"\d{4}-\d\d-\d\dT[^\n]*\n", b"", ran.stderr)
    written = sum(min(1000, left // 100 + 1) for left in range(size, 0, -100_000))
    assert agent_out == (b"x" * 99 + b"\n") * written


async def test_a_stderr_nobody_reads_never_holds_the_proxys_exit(tmp_path: Path) -> None:
    """``passthrough`` copies the agent's stderr to the proxy's; when nobody reads that, the
    agent is held back (as without the proxy) and the ladder ends it, and the proxy exits: the
    copy never leaves a write behind that would hold the process."""
    config = write_config(tmp_path / "c.yaml", "agent: {grace_period: 0.2}\n")
    agent = "head -c 400000 /dev/zero | tr '\\0' x >&2; exit 0"
    proxy = subprocess.Popen(
        [sys.executable, "-m", "acp_proxy", "--config", config, "--", "sh", "-c", agent],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,  # never read until the proxy exited
        env=proxy_env(),
        cwd=str(REPO),
    )
    try:
        with anyio.fail_after(10):
            while proxy.poll() is None:
                await anyio.sleep(0.02)
    finally:
        if proxy.poll() is None:
            proxy.kill()
        proxy.wait()
        assert proxy.stderr is not None
        held = proxy.stderr.read()
        proxy.stderr.close()
    assert proxy.returncode == 128 + signal.SIGTERM  # the ladder ended the agent held back
    assert held.startswith(b"x" * 1024)


async def test_chatty_stderr_log_mode_drains_into_the_log(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", "agent:\n  stderr: log\n")
    size = 2 * 1024 * 1024
    ran = await run(
        proxy_cmd("--config", config, "--log-format", "json", agent=["--stderr-bytes", str(size)]),
        request(1, "initialize", {}),
    )
    assert ran.rc == 0
    assert ran.stdout == init_response(1)
    lines = ran.events("agent stderr")
    # Every line the agent wrote is either in the log or counted as dropped: the log writer
    # never blocks the session, so when this test's reader falls behind by more than the log's
    # backlog, lines are dropped and counted ("log lines dropped"), never lost silently.
    dropped = sum(e["count"] for e in ran.events("log lines dropped (stderr was not read)"))
    written = sum(min(1000, left // 100 + 1) for left in range(size, 0, -100_000))
    assert len(lines) + dropped == written
    assert len(lines) > 0
    assert {(e["line"], e["stream"]) for e in lines} == {("x" * 99, "agent_stderr")}


def test_stdout_may_be_dev_null_or_a_file(tmp_path: Path) -> None:
    """Pipe transports refuse a regular file or /dev/null as stdout; the proxy must not."""
    out_file = tmp_path / "out"
    for target in (os.devnull, str(out_file)):
        with open(target, "wb") as out:
            done = subprocess.run(
                proxy_cmd(),
                input=request(1, "initialize", {}),
                stdout=out,
                stderr=subprocess.PIPE,
                env=proxy_env(),
                cwd=str(REPO),
                timeout=20,
                check=False,
            )
        assert done.returncode == 0, done.stderr
    assert out_file.read_bytes() == init_response(1)


def test_stdin_may_be_a_file(tmp_path: Path) -> None:
    frames = tmp_path / "in"
    frames.write_bytes(request(1, "initialize", {}))
    with open(frames, "rb") as stdin:
        done = subprocess.run(
            proxy_cmd(),
            stdin=stdin,
            capture_output=True,
            env=proxy_env(),
            cwd=str(REPO),
            timeout=20,
            check=False,
        )
    assert done.returncode == 0
    assert done.stdout == init_response(1)


def test_stdout_and_stderr_sharing_one_pipe() -> None:
    """Under ``2>&1`` stdout and stderr share one open file description: making stdout
    non-blocking there would make blocking log writes fail with EAGAIN. The proxy writes
    through a private copy, so a flood of frames and debug logs through one slow pipe is fine."""
    flood = 4 * 1024 * 1024
    proc = subprocess.Popen(
        proxy_cmd("--log-level", "debug", "--log-format", "json", agent=["--flood", str(flood)]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=proxy_env(),
        cwd=str(REPO),
    )
    try:
        out, _ = proc.communicate(request(1, "initialize", {}), timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    lines = out.splitlines()
    notes = [line for line in lines if line.startswith(b'{"jsonrpc":"2.0","method":"_vendor/log"')]
    assert len(notes) == flood // len(notes[0] + b"\n") + 1
    assert init_response(1) in out
    assert b'"event":"exit"' in out
