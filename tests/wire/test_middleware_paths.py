"""Middleware from a directory the proxy's Python does not search: ``middleware_paths:`` in the
config (relative to the config file), ``--middleware-path DIR``, and the hint when ``PYTHONPATH``
is set but ignored (``python -E``, as pipx starts its tools). Real ``python -E`` subprocesses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from proxy_harness import FAKE_AGENT, REPO, init_response, proxy_env, request

from acp_proxy.config import ConfigError, json_schema, parse_config

MODULE = """\
from acp_proxy.middleware import FORWARD, BaseMiddleware


class Tag(BaseMiddleware):
    def __call__(self, message, ctx):
        return FORWARD
"""


def package(tmp_path: Path, name: str) -> Path:
    """A directory holding the module ``name`` with a middleware class ``Tag``."""
    where = tmp_path / "mw"
    where.mkdir()
    (where / f"{name}.py").write_text(MODULE, encoding="utf-8")
    return where


def run_e(
    args: list[str], *, cwd: Path, stdin: bytes = b"", **env: str
) -> subprocess.CompletedProcess[bytes]:
    """``python -E -m acp_proxy ARGS``: PYTHONPATH ignored, as under pipx."""
    return subprocess.run(
        [sys.executable, "-E", "-m", "acp_proxy", *args],
        input=stdin,
        capture_output=True,
        cwd=str(cwd),
        env=proxy_env(**env),
        timeout=30,
        check=False,
    )


def test_middleware_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    package(tmp_path, "paths_mw_a")
    config = tmp_path / "c.yaml"
    config.write_text(
        "middleware_paths: [mw]\nmiddleware:\n  - use: paths_mw_a:Tag\n", encoding="utf-8"
    )
    done = run_e(["check-config", str(config)], cwd=REPO)  # another working directory
    assert (done.returncode, done.stderr) == (0, b"")
    lines = done.stdout.decode().splitlines()
    assert f"middleware paths: {tmp_path / 'mw'}" in lines
    assert "  1. Tag = paths_mw_a:Tag; fail-open" in lines


def test_middleware_path_option_runs_the_proxy_with_the_middleware(tmp_path: Path) -> None:
    where = package(tmp_path, "paths_mw_b")
    config = tmp_path / "c.yaml"
    config.write_text("middleware:\n  - use: paths_mw_b:Tag\n", encoding="utf-8")
    argv = ["--log-level", "error", "--middleware-path", str(where), "--config", str(config)]
    done = run_e(
        [*argv, "--", sys.executable, str(FAKE_AGENT)],
        cwd=tmp_path,
        stdin=request(1, "initialize", {}),
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, init_response(1), b"")
    # check-config takes it too, relative to the working directory.
    done = run_e(["check-config", "--middleware-path", "mw", str(config)], cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, b"")


def test_a_middleware_path_that_is_not_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    done = run_e(["--middleware-path", str(missing), "--", "true"], cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.decode().splitlines()[-1] == (
        f"acp-proxy: error: --middleware-path {missing}: not a directory"
    )


def test_an_ignored_pythonpath_is_named_in_the_import_error(tmp_path: Path) -> None:
    where = package(tmp_path, "paths_mw_c")
    config = tmp_path / "c.yaml"
    config.write_text("middleware:\n  - use: paths_mw_c:Tag\n", encoding="utf-8")
    done = run_e(["check-config", str(config)], cwd=tmp_path, PYTHONPATH=str(where))
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode() == (
        f'acp-proxy: {config}:2: middleware[0].use: cannot import module "paths_mw_c": No '
        "module named 'paths_mw_c' (PYTHONPATH is set but this Python ignores it: it runs "
        "with -E, as pipx starts its tools; name the directory under middleware_paths: in the "
        "config or pass --middleware-path DIR, or install the package into the tool's "
        "environment: pipx inject acp-proxy PACKAGE)\n"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "middleware_paths: [nope]\n",
            'c.yaml:1: middleware_paths[0]: "nope" is not a directory ({base}/nope does not '
            "exist); a relative path is taken from the config file's directory",
        ),
        (
            "middleware_paths: mw\n",
            'c.yaml:1: middleware_paths: expected a list of directories, got a string ("mw")',
        ),
        (
            'middleware_paths: [""]\n',
            "c.yaml:1: middleware_paths[0]: must not be empty",
        ),
        (
            "middleware_paths: [c.yaml]\n",
            'c.yaml:1: middleware_paths[0]: "c.yaml" is not a directory ({base}/c.yaml is a '
            "file); a relative path is taken from the config file's directory",
        ),
    ],
)
def test_middleware_paths_errors(
    text: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "c.yaml", {})
    assert caught.value.messages() == [message.format(base=tmp_path)]


def test_middleware_paths_in_the_schema() -> None:
    schema: Any = json_schema()
    declared = schema["properties"]["middleware_paths"]
    assert (declared["type"], declared["items"]) == (
        ["array", "null"],
        {"type": "string", "minLength": 1},
    )
