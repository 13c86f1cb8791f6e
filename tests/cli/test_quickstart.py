"""The quick start and the package's version, as a newcomer meets them: every command of
docs/quickstart.md that runs without a network runs here (the install itself, `pipx install`,
is run by scripts/check-wheel in CI), and the version that -V prints is the CHANGELOG's newest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
from proxy_harness import REPO

import acp_proxy

QUICKSTART = (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8")


def _cli(
    *args: str, stdin: bytes = b"", cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _commands() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", QUICKSTART, re.S)
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("acp-proxy")]


def test_the_quick_start_commands_are_the_ones_tested_here() -> None:
    assert _commands() == [
        "acp-proxy -V",
        "acp-proxy demo",
        "acp-proxy check-config rules.yaml",
        "acp-proxy --config rules.yaml --log-file ~/.cache/acp-proxy.log -- npx -y "
        "@agentclientprotocol/claude-agent-acp",
    ]


def test_version_agrees_with_the_changelog_and_the_package() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    newest = re.search(r"^## (\d+\.\d+\.\d+) ", changelog, re.M)
    assert newest is not None
    assert newest.group(1) == acp_proxy.__version__
    assert 'dynamic = ["version"]' in (REPO / "pyproject.toml").read_text(encoding="utf-8")
    out = _cli("-V")
    assert out.returncode == 0
    assert out.stdout.decode().splitlines()[0] == f"acp-proxy {acp_proxy.__version__}"


def test_the_quick_start_rules_are_valid(tmp_path: Path) -> None:
    rules = re.search(r"```yaml\n# rules.yaml\n(.*?)```", QUICKSTART, re.S)
    assert rules is not None
    (tmp_path / "rules.yaml").write_text(rules.group(1), encoding="utf-8")
    out = _cli("check-config", "rules.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert b"edge-route" in out.stdout


def test_the_quick_start_session_line_with_the_demo_agent(tmp_path: Path) -> None:
    """The editor's command line of step 4, with the bundled agent in place of the real one."""
    rules = re.search(r"```yaml\n# rules.yaml\n(.*?)```", QUICKSTART, re.S)
    assert rules is not None
    (tmp_path / "rules.yaml").write_text(rules.group(1), encoding="utf-8")
    log = tmp_path / "acp-proxy.log"
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 2}}
    out = _cli(
        "--config", "rules.yaml", "--log-file", str(log), "--",
        sys.executable, "-m", "acp_proxy.demo.agent",
        stdin=orjson.dumps(init) + b"\n",
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (answer,) = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert answer["id"] == 0
    assert answer["result"]["protocolVersion"] == 2
    assert "starting" in log.read_text(encoding="utf-8")


def test_mypy_strict_checks_a_user_middleware_against_the_install(tmp_path: Path) -> None:
    """Outside the checkout, with no MYPYPATH: mypy must find the installed package (an
    editable install's import hook is invisible to it; the plain .pth file is not)."""
    (tmp_path / "mw.py").write_text(
        "from acp_proxy.middleware import FORWARD, BaseMiddleware, JsonObject, MessageContext,"
        " Verdict\n\n\nclass Tag(BaseMiddleware):\n"
        "    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:\n"
        "        return FORWARD\n",
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "c"), "mw.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("Success: no issues found in 1 source file")
