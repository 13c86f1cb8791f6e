"""The early start (start-up as users feel it): on a plain stdio session the agent is
started before the proxy imports anyio and its runtime, so the agent boots while the proxy gets
ready; a signal that comes in that window takes the usual shutdown ladder.

Each case runs the real command line in a subprocess, with ``spawn.start_agent`` wrapped by a
few lines that report what the process had imported when the agent started, or send the signal
right after the early start: exact, no timing involved.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from proxy_harness import REPO, proxy_env

from acp_proxy.cli import launch
from acp_proxy.config import AgentConfig, Config, StderrMode
from acp_proxy.shell.agent import spawn

# Runs ``acp_proxy.cli.main(argv[1:])`` with ``spawn.start_agent`` wrapped: each start prints
# whether anyio and the runtime were imported then; with ACTION=term, the first start is
# followed by a SIGTERM to the proxy itself.
WRAPPED = """
import os, signal, sys
from acp_proxy.shell.agent import spawn
real = spawn.start_agent
def start_agent(*args, **kwargs):
    started = real(*args, **kwargs)
    seen = tuple(m in sys.modules for m in ("anyio", "acp_proxy.shell.session.runtime",
    "acp_proxy.config"))
    print("START anyio=%s runtime=%s config=%s" % seen, file=sys.stderr, flush=True)
    if os.environ.get("ACTION") == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    return started
spawn.start_agent = start_agent
from acp_proxy import cli
sys.exit(cli.main(sys.argv[1:]))
"""

# An agent that scrapes the proxy's metrics socket (which is served by then: the agent is
# started after the bind), says what it got on stderr, and exits.
SCRAPE = """
import socket, sys, time
for _ in range(200):
    try:
        s = socket.socket(socket.AF_UNIX); s.connect(%r); break
    except OSError:
        time.sleep(0.05)
s.sendall(b"GET /healthz HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
print("SCRAPED", s.recv(100).split(b"\\r\\n")[0].decode(), file=sys.stderr)
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
    # Started once, early (before the config model too: no config file), and the runtime took
    # that one (no second start).
    assert _starts(done.stderr) == ["START anyio=False runtime=False config=False"]


@pytest.mark.parametrize("options", [["--log-format", "json"], ["--log-frames"]])
def test_log_options_leave_the_start_before_the_config(options: list[str]) -> None:
    done = _run(*options, agent=["true"])
    assert done.returncode == 0, done.stderr
    assert _starts(done.stderr) == ["START anyio=False runtime=False config=False"]


def test_with_a_config_file_the_agent_starts_once_it_is_read(tmp_path: Path) -> None:
    """The file may refuse the session or change the agent's settings: read first, then the
    agent starts, still before the event loop; with the file's settings (here its stderr is
    logged, so the START line the agent's start prints is the only stderr line not logged)."""
    config = tmp_path / "rules.yaml"
    config.write_text("agent:\n  stderr: log\n")
    agent = [sys.executable, "-c", "import sys; print('from the agent', file=sys.stderr)"]
    done = _run("--config", str(config), agent=agent)
    assert done.returncode == 0, done.stderr
    assert _starts(done.stderr) == ["START anyio=False runtime=False config=True"]
    assert "from the agent" in done.stderr
    assert "\nfrom the agent\n" not in "\n" + done.stderr  # a log event, not passed through


def test_an_option_that_can_still_refuse_the_session_waits_for_the_config() -> None:
    """--log-file is opened after the agent could start early; one that cannot be opened must
    refuse the session with no agent started."""
    done = _run("--log-file", "/nonexistent/dir/log", agent=["true"])
    assert done.returncode == 2
    assert _starts(done.stderr) == []
    assert "--log-file /nonexistent/dir/log" in done.stderr


def test_a_session_something_can_still_refuse_starts_the_agent_in_the_runtime() -> None:
    """An endpoint whose address is a name needs a lookup, done in the event loop: the
    agent starts there, once the address is bound."""
    done = _run("--metrics", "tcp://localhost:0", agent=["true"])
    assert done.returncode == 0, done.stderr
    assert _starts(done.stderr) == ["START anyio=True runtime=True config=True"]


@pytest.mark.parametrize(
    "options",
    [
        ["--metrics", "tcp://127.0.0.1:0"],
        ["--ui", "tcp://127.0.0.1:0"],
        ["--metrics", "tcp://127.0.0.1:0", "--ui", "tcp://[::1]:0"],
    ],
)
def test_endpoints_on_an_ip_are_bound_first_and_the_agent_starts_early(
    options: list[str],
) -> None:
    """``--metrics`` and ``--ui`` on an IP literal are bound before the event loop (no lookup
    to wait for), so the agent starts early with them too; they are then served as before."""
    done = _run(*options, agent=["true"])
    assert done.returncode == 0, done.stderr
    assert _starts(done.stderr) == ["START anyio=False runtime=False config=True"]
    if "--ui" in options:
        host = "[::1]" if "tcp://[::1]:0" in options else "127.0.0.1"
        assert f"acp-proxy: live view at http://{host}:" in done.stderr, done.stderr


@pytest.mark.parametrize("option", ["--metrics", "--ui"])
def test_an_endpoint_that_cannot_be_bound_refuses_the_session_with_no_agent(option: str) -> None:
    """Bound first, before the early start: a port in use refuses the session with exit 1
    and the usual words, and no agent was started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run(option, f"tcp://127.0.0.1:{port}", agent=["true"])
    assert done.returncode == 1, done.stderr
    assert _starts(done.stderr) == []
    said = [line for line in done.stderr.splitlines() if line.startswith("acp-proxy: ")]
    assert said == [
        f"acp-proxy: {option}: cannot listen on tcp://127.0.0.1:{port}: port {port} is already "
        "in use (another process is listening on it)"
    ], done.stderr


def test_a_metrics_socket_bound_first_is_served_and_removed_at_exit(tmp_path: Path) -> None:
    """``--metrics unix://PATH`` needs no lookup either: bound before the agent starts,
    served by the event loop (a scrape answers), its socket file removed when the proxy ends."""
    path = tmp_path / "metrics.sock"
    agent = [sys.executable, "-c", SCRAPE % str(path)]
    done = _run("--metrics", f"unix://{path}", agent=agent)
    assert done.returncode == 0, done.stderr
    assert _starts(done.stderr) == ["START anyio=False runtime=False config=True"]
    assert "SCRAPED HTTP/1.1 200" in done.stderr, done.stderr
    assert not path.exists()


@pytest.mark.parametrize("target", ["rec.jsonl", "records/"])
def test_a_record_that_can_be_written_starts_the_agent_early(tmp_path: Path, target: str) -> None:
    """--record: the file (or a file in the directory) can be opened, so the agent starts
    before the event loop, and the record is whole (its header, then the session's frames)."""
    (tmp_path / "records").mkdir()
    done = _run("--record", str(tmp_path / target), agent=["true"])
    assert done.returncode == 0, done.stderr
    assert _starts(done.stderr) == ["START anyio=False runtime=False config=True"]
    (record,) = tmp_path.rglob("*.jsonl")
    assert oct(record.stat().st_mode & 0o777) == oct(0o600)
    header, end = (json.loads(line) for line in record.read_text().splitlines())
    assert (header["acp-proxy-record"], header["agent"]) == (1, ["true"])
    assert (end["event"], end["exit"]["code"]) == ("end", 0)


def test_a_record_that_cannot_be_written_refuses_the_session_with_no_agent() -> None:
    done = _run("--record", "/nonexistent/dir/rec.jsonl", agent=["true"])
    assert done.returncode == 2
    assert _starts(done.stderr) == []
    assert "cannot open the record file" in done.stderr


def test_a_record_fifo_is_opened_once_by_the_recorder(tmp_path: Path) -> None:
    """--record to a FIFO (a reader collects the record): the command line must not open it to
    check it (closing it would give the reader its EOF, and the recorder's own open would then
    wait for a reader forever), so the agent starts in the runtime and the reader gets the
    whole record."""
    fifo = tmp_path / "record.fifo"
    os.mkfifo(fifo, 0o600)  # a record target must be private to the user
    got: list[bytes] = []

    def read_all() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read_all)
    reader.start()
    try:
        done = _run("--record", str(fifo), agent=["true"])
    finally:
        if reader.is_alive():  # the proxy never opened it: let the reader go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert done.returncode == 0, done.stderr
    assert _starts(done.stderr) == ["START anyio=True runtime=True config=True"]
    header, end = (json.loads(line) for line in got[0].splitlines())
    assert (header["acp-proxy-record"], end["event"]) == (1, "end")


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
    assert _starts(done.stderr) == ["START anyio=False runtime=False config=False"]
    assert done.returncode == 0, done.stderr
    assert "signal received; shutting the agent down" in done.stderr
    assert "signal=SIGTERM" in done.stderr


def test_an_agent_that_cannot_start_is_reported_once_by_the_runtime() -> None:
    done = _run(agent=["/nonexistent/agent"])
    assert done.returncode == 127
    assert done.stderr.count("/nonexistent/agent: command not found") == 1


def _start_early_sleeper(agent: AgentConfig) -> spawn.Started:
    """``start_early`` of ``sleep 60`` with ``agent``, without its signal handlers (a test
    process keeps its own)."""
    started = spawn.start_agent(["sleep", "60"], agent)
    spawn._EARLY.agent = (spawn._key(["sleep", "60"], agent), started)
    return started


def _forget(started: spawn.Started) -> None:
    started.popen.kill()
    started.popen.wait()
    spawn.SUPERVISION.owned.discard(started.popen.pid)
    for fd in (started.stdin_fd, started.stdout_fd, started.stderr_fd):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def test_the_early_agent_is_taken_once_and_only_for_its_command() -> None:
    agent = AgentConfig()
    started = _start_early_sleeper(agent)
    try:
        assert spawn.started_early()
        assert spawn.take_early(["sleep", "60"], agent) is started
        assert spawn.take_early(["sleep", "60"], agent) is None
        assert not spawn.started_early()
        assert started.popen.poll() is None  # taken, and running
    finally:
        spawn._EARLY.agent = None
        _forget(started)


@pytest.mark.parametrize(
    ("argv", "agent"),
    [
        (["sleep", "61"], AgentConfig()),
        (["sleep", "60"], AgentConfig(stderr=StderrMode.LOG)),
        (["sleep", "60"], AgentConfig(env={"A": "1"})),
    ],
)
def test_an_early_agent_for_another_command_or_settings_is_killed_not_taken(
    argv: list[str], agent: AgentConfig
) -> None:
    """Never run with the wrong command or settings, and never left behind: killed (SIGKILL,
    its process group) and reaped, its pipes closed."""
    started = _start_early_sleeper(AgentConfig())
    try:
        assert spawn.take_early(argv, agent) is None
        assert started.popen.returncode == -signal.SIGKILL  # reaped by take_early
        assert started.popen.pid not in spawn.SUPERVISION.owned
        with pytest.raises(OSError):
            os.fstat(started.stdout_fd)
        assert not spawn.started_early()
    finally:
        spawn._EARLY.agent = None
        if started.popen.returncode is None:
            _forget(started)


def test_the_start_before_the_config_uses_the_default_configs_agent_settings() -> None:
    """What the command line starts an agent with before it reads the config is what the
    default config says (else the runtime would kill that agent and start another)."""
    argv = ["agent", "--flag"]
    assert spawn._key(argv, launch.UNCONFIGURED_AGENT) == spawn._key(argv, Config().agent)


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
