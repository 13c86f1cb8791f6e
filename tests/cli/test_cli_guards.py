"""The command line's guards against a newcomer's slips: a misspelled subcommand, a record
directory that does not exist under ``--listen``, and the address forms ``--ui`` and
``--metrics`` share."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from proxy_harness import proxy_cmd, proxy_env, run

from acp_proxy import cli
from acp_proxy.cli.options import one_edit_apart
from acp_proxy.config import parse_config
from acp_proxy.shell.sockets.address import Address, AddressError, parse_endpoint

PROXY = [sys.executable, "-m", "acp_proxy"]


# --- a misspelled subcommand -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "command"),
    [
        ("shwo", "show"),  # two letters swapped
        ("sho", "show"),  # one left out
        ("shows", "show"),  # one added
        ("replya", "replay"),
        ("schena", "schema"),  # one replaced
        ("check-conifg", "check-config"),
    ],
)
def test_a_first_word_one_edit_from_a_subcommand_gets_did_you_mean(
    word: str,
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no executable of that name
    with pytest.raises(SystemExit) as exited:
        cli.main([word, "x"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f'acp-proxy: error: unknown command "{word}"; did you mean {command}? '
        f"(to run an agent named {word}, put -- before it)"
    )


def _executable(directory: Path, name: str, code: int) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\nexit {code}\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.anyio
async def test_an_executable_on_path_one_edit_from_a_subcommand_runs(tmp_path: Path) -> None:
    _executable(tmp_path, "shwo", 7)
    env = proxy_env(PATH=os.pathsep.join([str(tmp_path), os.environ["PATH"]]))
    ran = await run([*PROXY, "--log-level", "error", "shwo", "x"], env=env)
    assert (ran.rc, ran.stdout, ran.stderr) == (7, b"", b"")


@pytest.mark.anyio
async def test_double_dash_runs_an_agent_named_like_a_misspelled_subcommand(
    tmp_path: Path,
) -> None:
    _executable(tmp_path, "shwo", 7)
    env = proxy_env(PATH=os.pathsep.join([str(tmp_path), os.environ["PATH"]]))
    ran = await run([*PROXY, "--log-level", "error", "--", "shwo"], env=env)
    assert (ran.rc, ran.stdout, ran.stderr) == (7, b"", b"")
    # Not on PATH either: the agent is looked for (127, not found), never a did-you-mean.
    ran = await run([*PROXY, "--log-format", "json", "--", "shwo"], env=proxy_env(PATH=""))
    assert ran.rc == 127
    assert b"did you mean" not in ran.stderr


# --- --listen with a record directory that does not exist --------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("form", ["dir", "pattern", "file"])
async def test_listen_refuses_a_record_directory_that_does_not_exist(
    tmp_path: Path, form: str
) -> None:
    missing = tmp_path / "missing"
    target = {
        "dir": f"{missing}{os.sep}",
        "pattern": f"{missing}{os.sep}conn-{{conn}}.jsonl",
        "file": f"{missing}{os.sep}all.jsonl",
    }[form]
    directory = f"{missing}{os.sep}" if form == "dir" else str(missing)
    ran = await run(proxy_cmd("--listen", "tcp://127.0.0.1:0", "--record", target))
    assert (ran.rc, ran.stdout, ran.stderr.decode()) == (
        2,
        b"",
        f"acp-proxy: --record {target}: the directory {directory} does not exist\n",
    )


@pytest.mark.anyio
async def test_listen_refuses_a_record_directory_of_the_config_that_does_not_exist(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "missing"
    config = tmp_path / "c.yaml"
    config.write_text(f"record:\n  path: {missing}/\n", encoding="utf-8")
    ran = await run(proxy_cmd("--config", str(config), "--listen", "tcp://127.0.0.1:0"))
    assert (ran.rc, ran.stdout, ran.stderr.decode()) == (
        2,
        b"",
        f"acp-proxy: {config}:1: record: record.path {missing}/: the directory {missing}/ "
        "does not exist\n",
    )


# --- one address syntax for the HTTP endpoints -------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["127.0.0.1:9464", "http://127.0.0.1:9464", "http://127.0.0.1:9464/", "tcp://127.0.0.1:9464"],
)
@pytest.mark.parametrize("browser", [False, True])
def test_ui_and_metrics_accept_the_same_address_forms(url: str, browser: bool) -> None:
    assert parse_endpoint(url, browser=browser) == Address("tcp", host="127.0.0.1", port=9464)


def test_only_metrics_takes_a_unix_socket() -> None:
    assert parse_endpoint("unix:///run/m.sock", browser=False) == Address(
        "unix", path="/run/m.sock"
    )
    with pytest.raises(AddressError) as caught:
        parse_endpoint("unix:///run/m.sock", browser=True)
    assert str(caught.value) == "the live view needs a tcp:// address (a browser speaks TCP)"


def test_the_config_file_takes_the_same_forms_for_ui_and_metrics() -> None:
    config = parse_config(
        "metrics: 127.0.0.1:9464\nui:\n  address: http://127.0.0.1:0\n", "c.yaml", {}
    )
    assert (config.metrics, config.ui.address) == ("tcp://127.0.0.1:9464", "tcp://127.0.0.1:0")


@pytest.mark.anyio
async def test_ui_takes_host_and_port_without_a_scheme() -> None:
    ran = await run(proxy_cmd("--log-format", "json", "--ui", "127.0.0.1:0"), b"")
    assert ran.rc == 0, ran.stderr
    assert b"http://127.0.0.1:" in ran.stderr


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("shwo", "show", True),
        ("sho", "show", True),
        ("shows", "show", True),
        ("xhow", "show", True),
        ("show", "show", False),
        ("swho", "show", False),  # two swaps
        ("owsh", "show", False),
        ("abcd", "badc", False),
        ("ui", "vi", True),
        ("", "a", True),
    ],
)
def test_one_edit_apart(a: str, b: str, expected: bool) -> None:
    assert (one_edit_apart(a, b), one_edit_apart(b, a)) == (expected, expected)


def test_component_takes_the_same_endpoint_forms(capsys: pytest.CaptureFixture[str]) -> None:
    from acp_proxy.shell.session import component_runtime as component

    # --metrics in the HOST:PORT form passes; the --ui on a Unix socket is what is refused.
    with pytest.raises(SystemExit) as exited:
        component.main(["--metrics", "127.0.0.1:9464", "--ui", "unix:///run/ui.sock"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "acp-proxy component: error: --ui: the live view needs a tcp:// address "
        "(a browser speaks TCP)"
    )
