"""The early start (issue 13, start-up as users feel it): on a plain stdio session the agent is
started before the proxy imports anyio and its runtime, so the agent boots while the proxy gets
ready; a signal that comes in that window takes the usual shutdown ladder.

Each case runs the real command line in a subprocess, with ``spawn.start_agent`` wrapped by a
few lines that report what the process had imported when the agent started, or send the signal
right after the early start: exact, no timing involved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from proxy_harness import REPO, proxy_env

from acp_proxy.config import AgentConfig, StderrMode
from acp_proxy.shell import spawn

# Runs ``acp_proxy.cli.main(argv[1:])`` with ``spawn.start_agent`` wrapped: each start prints
# whether anyio and the runtime were imported then; with ACTION=term, the first start is
# followed by a SIGTERM to the proxy itself.
WRAPPED = """
import os, signal, sys
from acp_proxy.shell import spawn
real = spawn.start_agent
def start_agent(*args, **kwargs):
    started = real(*args, **kwargs)
    seen = ("anyio" in sys.modules, "acp_proxy.shell.runtime" in sys.modules)
    print("START anyio=%s runtime=%s" % seen, file=sys.stderr, flush=True)
    if os.environ.get("ACTION") == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    return started
spawn.start_agent = start_agent
from acp_proxy import cli
sys.exit(cli.main(sys.argv[1:]))
"""

READ_TO_EOF = [sys.executable, "-c", "import sys; sys.stdin.buffer.read()"]


def _run(
    *proxy_args: str, agent: list[str], action: str = "", stdin: int | None = None
) -> subprocess.CompletedProcess[str]:
    """The proxy's run; a proxy that does not end within 30 s fails the test (TimeoutExpired)."""
    return subprocess.run(
        [sys.executable, "-c", WRAPPED, "--log-level", "info", *proxy_args, "--", *agent],
        cwd=REPO,
        env=proxy_env(ACTION=action),
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _starts(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("START ")]


def test_the_agent_starts_before_the_event_loop_is_imported() -> None:
    done = _run(agent=["true"])
    assert done.returncode == 0, done.stderr
    # Started once, early, and the runtime took that one (no second start).
    assert _starts(done.stderr) == ["START anyio=False runtime=False"]


@pytest.mark.parametrize(
    "extra",
    [
        ["--record", "REC"],
        ["--metrics", "tcp://127.0.0.1:0"],
    ],
)
def test_a_session_something_can_still_refuse_starts_the_agent_in_the_runtime(
    extra: list[str], tmp_path: object
) -> None:
    args = [str(tmp_path) + "/rec.jsonl" if a == "REC" else a for a in extra]
    done = _run(*args, agent=["true"])
    assert done.returncode == 0, done.stderr
    assert _starts(done.stderr) == ["START anyio=True runtime=True"]


def test_a_signal_right_after_the_early_start_takes_the_ladder() -> None:
    """SIGTERM before the runtime's handlers exist: the proxy neither dies of it (the agent
    would be killed without its ladder) nor ignores it; the agent gets EOF on its stdin and
    exits, and the proxy exits with the agent's status. The client's side stays open, so only
    the signal can have ended the session."""
    with subprocess.Popen(["sleep", "60"], stdout=subprocess.PIPE) as client:
        assert client.stdout is not None
        try:
            done = _run(agent=READ_TO_EOF, action="term", stdin=client.stdout.fileno())
        finally:
            client.kill()
    assert _starts(done.stderr) == ["START anyio=False runtime=False"]
    assert done.returncode == 0, done.stderr
    assert "signal received; shutting the agent down" in done.stderr
    assert "signal=SIGTERM" in done.stderr


def test_an_agent_that_cannot_start_is_reported_once_by_the_runtime() -> None:
    done = _run(agent=["/nonexistent/agent"])
    assert done.returncode == 127
    assert done.stderr.count("/nonexistent/agent: command not found") == 1


def test_the_early_agent_is_taken_once_and_only_for_its_command() -> None:
    agent = AgentConfig()
    started = spawn.start_agent(["true"], agent)
    try:
        spawn._EARLY.agent = (("true",), agent, started)
        other = AgentConfig(stderr=StderrMode.LOG)
        assert spawn.take_early(["false"], agent) is None
        assert spawn.take_early(["true"], other) is None
        assert spawn.take_early(["true"], agent) is started
        assert spawn.take_early(["true"], agent) is None
    finally:
        spawn._EARLY.agent = None
        started.popen.wait()
        spawn.SUPERVISION.owned.discard(started.popen.pid)
        spawn._close_all(started.stdin_fd, started.stdout_fd, started.stderr_fd)


def test_signals_before_the_loop_are_recorded_once_each() -> None:
    """A sender repeating signals in the window before the runtime's handlers adds nothing: the
    record holds each signal once (at most the three the runtime handles), in first-come order,
    and is emptied when read."""
    saved = {signum: signal.getsignal(signum) for signum in spawn.EARLY_SIGNALS}
    try:
        spawn.catch_signals()
        for signum in [signal.SIGHUP] * 50 + [signal.SIGTERM, signal.SIGHUP, signal.SIGTERM]:
            os.kill(os.getpid(), signum)
        assert spawn._EARLY.signals == [signal.SIGHUP, signal.SIGTERM]
        assert spawn.early_signals() == [signal.SIGHUP, signal.SIGTERM]
        assert spawn.early_signals() == []
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
