"""No orphans, ever: real proxies, real agents, real signals, Linux /proc.

Each test fails on the code before the fix: the agent outliving ``kill -9`` of the proxy, a
SIGTERM right after the spawn killing the proxy by the default action, a ``setsid`` grandchild
surviving its session, zombies piling up under a proxy that is PID 1.

The proxy's stderr goes to a file, never a pipe: an orphan inherits it, and a pipe that an
orphan holds open would never reach EOF.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.abc
import orjson
import pytest
from proxy_harness import (
    FAKE_AGENT,
    REPO,
    Lines,
    init_response,
    proxy_cmd,
    proxy_env,
    request,
    write_config,
)

from acp_proxy.shell.spawn import SESSION_ENV

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux-only guarantees"),
]

PROXY = [sys.executable, "-m", "acp_proxy", "--log-format", "json"]
# Generous bounds against hangs on a loaded machine; nothing is timed.
BOUND = 20.0
GRACE = "agent:\n  grace_period: 0.1\n"
# A grandchild that leaves the agent's session and process group, then tells us its pid.
SETSID_GRANDCHILD = (
    "import os, sys, time\n"
    "os.setsid()\n"
    "with open(sys.argv[1] + '.tmp', 'w') as f: f.write(str(os.getpid()))\n"
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(300)\n"
)


def _state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` (R, S, Z, ...), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _is_dead(pid: int) -> bool:
    """Gone, or a zombie waiting for whoever adopted it (outside the proxy's control)."""
    return _state(pid) in (None, "Z", "X")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):
                found += [
                    int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                ]
    return found


async def _eventually(condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` became true within the (generous) bound."""
    with anyio.move_on_after(BOUND):
        while not condition():
            await anyio.sleep(0.02)
    return condition()


async def _read_pid(path: Path) -> int:
    assert await _eventually(path.exists), f"{path} was never written"
    return int(path.read_text())


def _kill_quietly(*pids: int | None) -> None:
    for pid in pids:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _events(log: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in log.read_bytes().splitlines() if line.startswith(b"{")]


def _listening(log: Path) -> bool:
    return any(event["event"] == "listening" for event in _events(log))


def _setsid_agent(pidfile: Path) -> list[str]:
    """An agent (fake_agent.py) whose first act is to start SETSID_GRANDCHILD, detached from
    its stdio so that only the process itself can outlive the session."""
    script = (
        f'{sys.executable} -c "$GRANDCHILD" {pidfile} </dev/null >/dev/null 2>&1 & '
        f"exec {sys.executable} {FAKE_AGENT}"
    )
    return ["sh", "-c", script]


@contextlib.asynccontextmanager
async def _proxy(cmd: list[str], log: Path, **env: str) -> AsyncIterator[anyio.abc.Process]:
    with log.open("wb") as err:
        process = await anyio.open_process(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=proxy_env(**env),
            cwd=str(REPO),
        )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()
            await process.aclose()


# --- the agent dies with the proxy, even on kill -9 -----------------------------------------------


async def test_kill_9_of_the_proxy_takes_the_agent_with_it(tmp_path: Path) -> None:
    # The agent ignores stdin EOF and SIGTERM: only the kernel's parent-death signal can end it.
    cmd = proxy_cmd(agent=["--hang-at-eof", "--ignore-term"])
    agent: int | None = None
    async with _proxy(cmd, tmp_path / "log") as proxy:
        assert proxy.stdin is not None and proxy.stdout is not None
        try:
            with anyio.fail_after(BOUND):
                await proxy.stdin.send(request(1, "initialize", {}))
                assert await Lines(proxy.stdout).line() == init_response(1)
            [agent] = _children(proxy.pid)
            proxy.kill()
            assert await proxy.wait() == -signal.SIGKILL
            assert await _eventually(lambda: _is_dead(agent)), f"agent {agent} outlived the proxy"
        finally:
            _kill_quietly(agent)


# --- signals are handled from before the spawn --------------------------------------------------


async def test_sigterm_right_after_the_spawn_takes_the_ladder(tmp_path: Path) -> None:
    """The agent's first act is SIGTERM to the proxy, so the signal lands while the proxy is
    still setting the session up. Every time: the proxy's handler runs the ladder (exit code
    the agent's, 128 + SIGTERM: it ignores stdin EOF, so the ladder's SIGTERM ends it), and the
    agent is gone when the proxy has exited."""
    config = write_config(tmp_path / "c.yaml", GRACE)
    runs = 12
    results: list[tuple[int, int, list[dict[str, object]]]] = []
    limiter = anyio.CapacityLimiter(4)

    async def once(i: int) -> None:
        pidfile = tmp_path / f"agent{i}.pid"
        script = (
            f"echo $$ > {pidfile}; kill -TERM $PPID; "
            f"exec {sys.executable} {FAKE_AGENT} --hang-at-eof"
        )
        log = tmp_path / f"log{i}"
        agent: int | None = None
        async with (
            limiter,
            _proxy(
                [*PROXY, "--config", config, "--", "sh", "-c", script],
                log,
            ) as proxy,
        ):
            try:
                with anyio.fail_after(BOUND):
                    rc = await proxy.wait()  # the client (we) never closes stdin first
                agent = await _read_pid(pidfile)
                dead = _is_dead(agent)
            finally:
                _kill_quietly(agent)
        results.append((rc, int(dead), _events(log)))

    async with anyio.create_task_group() as tg:
        for i in range(runs):
            tg.start_soon(once, i)
    assert [(rc, dead) for rc, dead, _ in results] == [(128 + signal.SIGTERM, 1)] * runs
    for _, _, events in results:
        signals = [e for e in events if e["event"] == "signal received; shutting the agent down"]
        assert [e["signal"] for e in signals] == ["SIGTERM"]


def test_the_agent_never_inherits_a_blocked_signal_mask(tmp_path: Path) -> None:
    """A proxy started with SIGHUP, SIGINT and SIGTERM blocked (exec keeps a mask) still starts
    its agent with none blocked: the ladder's SIGTERM must reach it."""
    blocked = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM}
    # Shell builtins only: a forking shell blocks every signal around its fork, so a child
    # reading the shell's status could catch that moment.
    report = (
        'while read -r line; do case "$line" in SigBlk*) echo "$line" >&2;; esac; done '
        f"</proc/$$/status; exec {sys.executable} {FAKE_AGENT}"
    )
    done = subprocess.run(
        [*PROXY, "--", "sh", "-c", report],
        input=request(1, "initialize", {}),
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=BOUND,
        check=False,
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, blocked),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == init_response(1)
    assert [line for line in done.stderr.splitlines() if line.startswith(b"SigBlk:")] == [
        b"SigBlk:\t0000000000000000"
    ]


# --- descendants that leave the agent's session ---------------------------------------------------


async def test_setsid_grandchild_is_gone_after_the_proxy_exits(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    grandchild: int | None = None
    async with _proxy(
        [sys.executable, "-m", "acp_proxy", "--", *_setsid_agent(pidfile)],
        tmp_path / "log",
        GRANDCHILD=SETSID_GRANDCHILD,
    ) as proxy:
        assert proxy.stdin is not None and proxy.stdout is not None
        try:
            with anyio.fail_after(BOUND):
                await proxy.stdin.send(request(1, "initialize", {}))
                assert await Lines(proxy.stdout).line() == init_response(1)
            grandchild = await _read_pid(pidfile)
            [agent] = _children(proxy.pid)
            # It really left: its own session, not the agent's (the old clean-up's reach).
            assert os.getsid(grandchild) == grandchild != os.getsid(agent)
            await proxy.stdin.aclose()
            with anyio.fail_after(BOUND):
                assert await proxy.wait() == 0
            assert await _eventually(lambda: _is_dead(grandchild)), (
                f"grandchild {grandchild} survived"
            )
        finally:
            _kill_quietly(grandchild)


async def test_listen_kills_a_sessions_leftovers_when_that_session_ends(tmp_path: Path) -> None:
    """With many sessions in one proxy, a session's leftovers are told apart by the session
    cookie in their environment: ending one session kills its setsid grandchild and spares
    the grandchild of the session still open."""
    sock = tmp_path / "acp.sock"
    log = tmp_path / "log"
    pidfile = tmp_path / "grandchild.pid"
    cmd = [*PROXY, "--listen", f"unix://{sock}", "--", *_setsid_agent(pidfile)]
    grandchildren: list[int] = []
    async with _proxy(cmd, log, GRANDCHILD=SETSID_GRANDCHILD) as proxy:
        try:
            assert await _eventually(lambda: _listening(log)), "never listened"
            clients = []
            for _ in range(2):
                client = await anyio.connect_unix(str(sock))
                clients.append(client)
                with anyio.fail_after(BOUND):
                    await client.send(request(1, "initialize", {}))
                    assert await Lines(client).line() == init_response(1)
                grandchildren.append(await _read_pid(pidfile))
                pidfile.unlink()
            first, second = grandchildren
            cookies = [_environ(pid).get(SESSION_ENV) for pid in grandchildren]
            assert cookies == [f"{proxy.pid}.1", f"{proxy.pid}.2"]

            await _close_session(clients[0])
            assert await _eventually(lambda: _is_dead(first)), (
                "the first session's grandchild survived"
            )
            assert _is_dead(second) is False  # the open session's is untouched
            await _close_session(clients[1])
            assert await _eventually(lambda: _is_dead(second)), (
                "the second session's grandchild survived"
            )

            proxy.send_signal(signal.SIGTERM)
            with anyio.fail_after(BOUND):
                assert await proxy.wait() == 0
        finally:
            _kill_quietly(*grandchildren)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().partition("=")[::2] for item in raw.split(b"\0") if item)


async def _close_session(client: anyio.abc.SocketStream) -> None:
    await client.send_eof()
    with anyio.fail_after(BOUND):
        await Lines(client).rest()
    await client.aclose()


REAPER = """
import anyio, os, subprocess, sys
from acp_proxy.config import AgentConfig
from acp_proxy.shell.process import reap_adopted, spawn_agent
from acp_proxy.shell.spawn import enable_supervision

async def main():
    enable_supervision()
    agent = await spawn_agent(["sh", "-c", "exit 3"], AgentConfig())
    stranger = subprocess.Popen(["true"])  # not an agent: a zombie for the reaper to take
    while not all(
        open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
        for pid in (agent.pid, stranger.pid)
    ):
        await anyio.sleep(0.01)
    print(reap_adopted(), os.path.exists(f"/proc/{stranger.pid}"), await agent.wait())
    stranger.returncode = 0  # reaped above: no waitpid at exit

anyio.run(main)
"""


def test_the_reaper_never_takes_an_agents_exit_status() -> None:
    """Both children are zombies: the reaper reaps the stranger only, and the agent's own
    status (3) still reaches the agent's waiter."""
    done = subprocess.run(
        [sys.executable, "-c", REAPER],
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=BOUND,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"1 False 3\n", b"")


# --- PID 1 in a container -------------------------------------------------------------------------


def _unshare_reason() -> str | None:
    """Why a PID namespace cannot be made here (None: it can)."""
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"],
        capture_output=True,
        check=False,
        timeout=BOUND,
    )
    if done.returncode != 0:
        return f"unshare --pid --fork --mount-proc failed: {done.stderr.decode().strip()}"
    return None


async def test_as_pid_1_the_proxy_reaps_the_orphans_it_adopts(tmp_path: Path) -> None:
    """Three sessions whose agents leave a grandchild (killed with the agent's group): as PID 1
    the proxy adopts each one, and reaps it; no ``<defunct>`` is left."""
    reason = _unshare_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        pytest.skip(reason)
    sock = tmp_path / "acp.sock"
    log = tmp_path / "log"
    cmd = ["unshare", "--pid", "--fork", "--mount-proc"]
    cmd += [*PROXY, "--listen", f"unix://{sock}", "--", sys.executable, str(FAKE_AGENT)]
    cmd += ["--grandchild", str(tmp_path / "grandchild.pid")]
    async with _proxy(cmd, log) as unshare:
        proxy: int | None = None
        try:
            assert await _eventually(lambda: _listening(log)), "never listened"
            [proxy] = _children(unshare.pid)  # PID 1 inside, this pid outside
            status = Path(f"/proc/{proxy}/status").read_text()
            assert status.split("NSpid:")[1].splitlines()[0].split()[-1] == "1"
            for _ in range(3):
                client = await anyio.connect_unix(str(sock))
                with anyio.fail_after(BOUND):
                    await client.send(request(1, "initialize", {}))
                    assert await Lines(client).line() == init_response(1)
                await _close_session(client)

            def closed() -> bool:
                return sum(e["event"] == "connection closed" for e in _events(log)) == 3

            assert await _eventually(closed), "sessions did not close"
            await _eventually(lambda: _children(proxy) == [])
            assert _zombies(proxy) == []
            os.kill(proxy, signal.SIGTERM)
            with anyio.fail_after(BOUND):
                assert await unshare.wait() == 0
        finally:
            _kill_quietly(proxy)  # PID 1: takes the whole namespace with it


def _zombies(pid: int) -> list[tuple[int, str | None]]:
    return [(child, _state(child)) for child in _children(pid)]
