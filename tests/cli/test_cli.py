"""The command line: options, sub-commands, config errors before spawn, where logs go."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from proxy_harness import REPO, init_response, proxy_cmd, proxy_env, request, run, write_config

from acp_proxy import __version__, cli
from acp_proxy.cli import options as options_module
from acp_proxy.config import ConfigError, explain_config, load_config
from acp_proxy.wire.raw.block_scan import SCANNER

pytestmark = pytest.mark.anyio

PROXY = [sys.executable, "-m", "acp_proxy"]


async def test_version() -> None:
    ran = await run([*PROXY, "--version"])
    assert (ran.rc, ran.stdout) == (0, f"acp-proxy {__version__}\nscanner: {SCANNER}\n".encode())


async def test_help_has_usage_and_examples() -> None:
    ran = await run([*PROXY, "--help"])
    assert ran.rc == 0
    text = ran.stdout.decode()
    for needle in (
        "usage: acp-proxy [OPTIONS] -- AGENT_CMD [ARG...]",
        "acp-proxy check-config FILE",
        "acp-proxy demo",
        "--config FILE",
        "--log-level",
        "--log-format",
        "--log-file FILE",
        "--max-frame-bytes SIZE",
        "examples:",
        "ACP_PROXY_CONFIG",
    ):
        assert needle in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "missing AGENT_CMD"),
        (["--log-level", "debug"], "missing AGENT_CMD"),
        (["--log-level", "loud", "--", "agent"], "invalid choice: 'loud'"),
        (["--max-frame-bytes", "0", "--", "agent"], "must be positive: '0'"),
        (["--bogus", "--", "agent"], "unrecognized arguments: --bogus"),
    ],
)
async def test_usage_errors_exit_2(argv: list[str], message: str) -> None:
    ran = await run([*PROXY, *argv])
    assert ran.rc == 2
    assert ran.stdout == b""
    assert message in ran.stderr.decode()


async def test_agent_command_without_double_dash() -> None:
    ran = await run(
        [*PROXY, "--log-level", "error", sys.executable, str(REPO / "tests" / "fake_agent.py")],
        request(1, "initialize", {}),
    )
    assert (ran.rc, ran.stdout) == (0, init_response(1))


# --- check-config ------------------------------------------------------------------------------


async def test_check_config_explains_a_valid_file() -> None:
    path = str(REPO / "config" / "example.yaml")
    ran = await run([*PROXY, "check-config", path])
    assert ran.rc == 0, ran.stderr
    expected = explain_config(load_config(path, proxy_env()))
    assert ran.stdout.decode() == (expected if expected.endswith("\n") else expected + "\n")


async def test_check_config_reports_the_error(tmp_path: Path) -> None:
    path = write_config(tmp_path / "bad.yaml", "rules: 5\n")
    ran = await run([*PROXY, "check-config", path])
    assert ran.rc == 2
    assert ran.stdout == b""
    with pytest.raises(ConfigError) as caught:
        load_config(path, os.environ)
    assert ran.stderr == f"acp-proxy: {caught.value}\n".encode()


# --- config errors surface before the agent is spawned -------------------------------------------


async def test_bad_config_fails_before_spawn(tmp_path: Path) -> None:
    path = write_config(tmp_path / "bad.yaml", "rules:\n  - name: x\n    set_meta: {plain: 1}\n")
    ready = tmp_path / "agent-started"
    ran = await run(proxy_cmd("--config", path, agent=["--ready", str(ready)]), b"")
    assert ran.rc == 2
    assert ran.stdout == b""
    with pytest.raises(ConfigError) as caught:
        load_config(path, os.environ)
    assert ran.stderr == f"acp-proxy: {caught.value}\n".encode()
    assert not ready.exists()


async def test_missing_config_file_fails_before_spawn(tmp_path: Path) -> None:
    ready = tmp_path / "agent-started"
    missing = str(tmp_path / "nope.yaml")
    ran = await run(proxy_cmd("--config", missing, agent=["--ready", str(ready)]), b"")
    assert ran.rc == 2
    assert ran.stderr.startswith(f"acp-proxy: {missing}".encode())
    assert not ready.exists()


async def test_config_from_environment_variable(tmp_path: Path) -> None:
    bad = write_config(tmp_path / "env.yaml", "rules: 5\n")
    ran = await run(proxy_cmd(), b"", env=proxy_env(ACP_PROXY_CONFIG=bad))
    assert ran.rc == 2
    assert ran.stderr.startswith(f"acp-proxy: {bad}:".encode())
    # --config wins over the environment.
    good = write_config(tmp_path / "good.yaml", "non_json: forward\n")
    ran = await run(
        proxy_cmd("--config", good, agent=["--banner", "hi"]),
        request(1, "initialize", {}),
        env=proxy_env(ACP_PROXY_CONFIG=bad),
    )
    assert (ran.rc, ran.stdout) == (0, b"hi\n" + init_response(1))


# --- logging destinations ----------------------------------------------------------------------


async def test_log_file_receives_the_log_and_stdout_stays_clean(tmp_path: Path) -> None:
    log_file = tmp_path / "proxy.log"
    ran = await run(
        proxy_cmd("--log-format", "json", "--log-file", str(log_file), "--log-level", "debug"),
        request(1, "initialize", {}),
    )
    assert ran.rc == 0
    assert ran.stdout == init_response(1)
    assert ran.stderr == b""
    events = [orjson.loads(line) for line in log_file.read_bytes().splitlines()]
    assert events[0]["event"] == "starting"
    assert events[-1]["event"] == "exit"
    assert all({"event", "level", "timestamp"} <= set(e) for e in events)


async def test_console_format_is_plain_text_on_stderr() -> None:
    ran = await run(
        proxy_cmd("--log-format", "console", "--log-level", "info"), request(1, "initialize", {})
    )
    assert ran.rc == 0
    assert ran.stdout == init_response(1)
    text = ran.stderr.decode()
    assert "starting" in text and "exit" in text
    assert "\x1b[" not in text  # not a terminal: no colours


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_each_log_line_is_one_write(fmt: str) -> None:
    """The agent may write to the same stderr (passthrough): a line of the proxy's stays whole
    only if it is written in one call (a pipe keeps a write under PIPE_BUF together). With an
    unbuffered stderr (``python -u``, ``PYTHONUNBUFFERED``), ``print`` made two writes, the
    line and its newline, and an agent's output could land between them."""
    code = (
        "import io, sys\n"
        "class Recording(io.RawIOBase):\n"
        "    calls = []\n"
        "    def writable(self): return True\n"
        "    def write(self, b): self.calls.append(bytes(b)); return len(b)\n"
        "sys.stderr = io.TextIOWrapper(Recording(), write_through=True)\n"
        "from acp_proxy.shell.log.logsetup import configure_logging, get_logger\n"
        f"configure_logging('info', {fmt!r})\n"
        "get_logger().info('hello', key=1)\n"
        "get_logger().warning('again')\n"
        "print(repr(Recording.calls), file=sys.__stdout__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-u", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=proxy_env(),
        timeout=60,
    ).stdout
    calls = ast.literal_eval(out)  # the repr of a list of bytes, printed by the line above
    assert len(calls) == 2
    assert all(call.endswith(b"\n") and call.count(b"\n") == 1 for call in calls)
    assert b"hello" in calls[0] and b"again" in calls[1]


async def test_log_level_error_is_quiet() -> None:
    ran = await run(proxy_cmd("--log-level", "error"), request(1, "initialize", {}))
    assert (ran.rc, ran.stdout, ran.stderr) == (0, init_response(1), b"")


async def test_unwritable_log_file_is_a_usage_error(tmp_path: Path) -> None:
    target = str(tmp_path / "missing-dir" / "x.log")
    ran = await run(proxy_cmd("--log-file", target), b"")
    assert ran.rc == 2
    assert ran.stderr.startswith(f"acp-proxy: --log-file {target}:".encode())


# --- in-process dispatch -----------------------------------------------------------------------


def test_demo_subcommand_is_dispatched_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    from acp_proxy import demo

    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 0

    monkeypatch.setattr(demo, "main", fake_main)
    assert cli.main(["demo", "--x"]) == 0
    assert seen == [["--x"]]


def test_connect_with_agent_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # Found after the options were read: argparse prints it, and the proxy answers the
    # client's requests with it before exiting 2 (tests/shell/agent/test_startup_errors.py).
    assert cli.main(["--connect", "tcp://127.0.0.1:1", "--", "agent"]) == 2
    assert "an AGENT_CMD cannot be used with it" in capsys.readouterr().err


def test_ctrl_c_before_the_handlers_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(argv: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_main", interrupted)
    assert cli.main(["--", "agent"]) == 130


def test_check_config_into_a_closed_pipe_exits_141_without_traceback() -> None:
    import subprocess

    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: the first write fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "acp_proxy", "check-config", str(REPO / "config/example.yaml")],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=proxy_env(),
            cwd=str(REPO),
            timeout=30,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141
    assert done.stderr == b""


# Modules that a plain ``acp-proxy -- AGENT`` (stdio, no config, no --record, no debug log) must
# not load (start-up time): each is imported when the command line asks for it.
_NOT_AT_START_UP = (
    "yaml",  # a config file
    "structlog",  # the first log event at an enabled level (none at --log-level warning)
    "argparse",  # an option spelling that the fast path leaves to argparse, or an error
    "difflib",  # a misspelled subcommand
    "acp_proxy.demo",
    "acp_proxy.shell.sockets",  # --listen, --connect, --metrics
    "acp_proxy.shell.telemetry.metrics_server",
    "acp_proxy.shell.telemetry.tracing",
    "acp_proxy.telemetry",
    "acp_proxy.shell.record.recorder",  # --record
    "acp_proxy.record.format",  # --record, the debug log
    "acp_proxy.record.replay",
    "acp_proxy.record.transcript",
    "acp_proxy.shell.log.framelog",  # --log-level debug
    "acp_proxy.config.parser",  # a config file
    "acp_proxy.config.reading",
    "acp_proxy.config.schema",  # check-config, schema
    "acp_proxy.rules.engine",  # rules in a config file
    "acp_proxy.meta.annotate",
)


def _loaded_by(argv: list[str]) -> tuple[int, list[str]]:
    """The exit code of ``cli.main(argv)`` in a fresh interpreter, and which of
    ``_NOT_AT_START_UP`` it imported (a module or any submodule of it)."""
    code = (
        "import sys\n"
        "from acp_proxy import cli\n"
        f"rc = cli.main({argv!r})\n"
        f"names = {_NOT_AT_START_UP!r}\n"
        "loaded = sorted(n for n in names if any(m == n or m.startswith(n + '.') "
        "for m in sys.modules))\n"
        "import json\n"
        "print(json.dumps([rc, loaded]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        timeout=60,
        check=True,
        stdin=subprocess.DEVNULL,
        env=proxy_env(),
    ).stdout
    rc, loaded = orjson.loads(out.splitlines()[-1])
    return rc, loaded


def test_stdio_start_up_loads_only_what_stdio_mode_needs() -> None:
    """Start-up time: ``acp-proxy -- AGENT`` without a config file imports only what
    stdio mode needs: no PyYAML, no structlog until something is logged, no argparse for the
    usual options, no socket layer, recorder, debug frame log, rules engine or demo."""
    assert _loaded_by(["--log-level", "warning", "--", "true"]) == (0, [])
    assert _loaded_by(["--log-level=ERROR", "--log-format", "json", "--", "true"]) == (0, [])


def test_start_up_loads_what_the_command_line_asks_for(tmp_path: Path) -> None:
    # On stdio the default level on stderr is warning: nothing is logged, structlog never
    # comes in. At info, "starting" is logged: structlog comes in then (and only structlog).
    assert _loaded_by(["--", "true"]) == (0, [])
    assert _loaded_by(["--log-level", "info", "--", "true"]) == (0, ["structlog"])
    rc, names = _loaded_by(["--log-level", "debug", "--", "true"])
    assert (rc, names) == (
        0,
        ["acp_proxy.record.format", "acp_proxy.shell.log.framelog", "structlog"],
    )
    rc, names = _loaded_by(
        ["--log-level", "warning", "--record", str(tmp_path / "r.jsonl"), "--", "true"]
    )
    assert (rc, names) == (0, ["acp_proxy.record.format", "acp_proxy.shell.record.recorder"])
    # An abbreviation is argparse's to read.
    assert _loaded_by(["--log-l", "warning", "--", "true"]) == (0, ["argparse"])


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--log-level", "warning"],
        ["--log-level", "DEBUG", "--log-level=Info"],
        ["--log-format", "json", "--log-file", "x.log", "--log-frames"],
        ["--config", "rules.yaml", "--agent-stderr", "log", "--record=r.jsonl"],
        ["--config="],
        ["--listen", "tcp://127.0.0.1:1", "--allow-remote", "--metrics", "unix:///m.sock"],
        ["--connect", "unix:///a.sock"],
    ],
)
def test_the_fast_option_path_reads_what_argparse_reads(options: list[str]) -> None:
    fast = options_module.fast_options(options)
    parsed, extra = cli.build_parser().parse_known_args(options)
    assert fast is not None
    assert (vars(fast), extra) == (vars(parsed), [])


@pytest.mark.parametrize(
    "options",
    [
        ["--log-l", "debug"],  # an abbreviation
        ["--log-level", "verbose"],  # not a choice: argparse's error
        ["--log-level"],  # no value
        ["--config", "-x"],  # a value that looks like an option
        ["--log-frames=1"],
        ["--max-frame-bytes", "1k"],
        ["-V"],
        ["--help"],
        ["my-agent"],
    ],
)
def test_the_fast_option_path_leaves_the_rest_to_argparse(options: list[str]) -> None:
    assert options_module.fast_options(options) is None


def test_garbage_collection_is_off_only_during_start_up() -> None:
    """Start-up time: the collector is off while the command line, the config and the
    modules are loaded, frozen-and-on once the proxy's first coroutine runs, and as it was
    before for an in-process caller afterwards (the command itself exits frozen)."""
    code = (
        "import gc\n"
        "from acp_proxy import cli\n"
        "from acp_proxy.shell.session import runtime\n"
        "seen = []\n"
        "real = runtime.run_proxy\n"
        "async def spy(*args, **kwargs):\n"
        "    seen.append([gc.isenabled(), gc.get_freeze_count() > 0])\n"
        "    return await real(*args, **kwargs)\n"
        "runtime.run_proxy = spy\n"
        "rc = cli.main(['--log-level', 'error', '--', 'true'])\n"
        "print(rc, seen, gc.isenabled(), gc.get_freeze_count())\n"
        "gc.disable()\n"
        "cli.main(['--log-level', 'error', '--', 'true'])\n"
        "print(gc.isenabled())\n"
        "gc.enable()\n"
        "import sys\n"
        "sys.argv = ['acp-proxy', '--log-level', 'error', '--', 'true']\n"
        "cli.main()\n"  # the command itself: start-up's objects stay frozen until exit
        "print(gc.isenabled(), gc.get_freeze_count() > 0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        timeout=60,
        check=True,
        stdin=subprocess.DEVNULL,
        env=proxy_env(),
    ).stdout
    assert out == b"0 [[True, True]] True 0\nFalse\nTrue True\n"
