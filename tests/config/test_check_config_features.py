"""check-config refuses what the run refuses about optional features: tracing enabled without
the OpenTelemetry SDK, a record path in a directory that does not exist (FILE:LINE, exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from proxy_harness import proxy_env


def _run(*args: str, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = proxy_env()
    if pythonpath is not None:  # ahead of everything, the repository included
        env["PYTHONPATH"] = f"{pythonpath}:{env['PYTHONPATH']}"
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _without_otel(tmp_path: Path) -> Path:
    """A directory that shadows the `opentelemetry` package with one that has no SDK."""
    shadow = tmp_path / "shadow"
    (shadow / "opentelemetry").mkdir(parents=True)
    (shadow / "opentelemetry" / "__init__.py").write_text("", encoding="utf-8")
    return shadow


def test_tracing_without_the_sdk_is_refused_like_the_run(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("rules: []\ntracing:\n  enabled: true\n", encoding="utf-8")
    shadow = _without_otel(tmp_path)
    checked = _run("check-config", "c.yaml", cwd=tmp_path, pythonpath=shadow)
    assert checked.returncode == 2
    assert checked.stdout == ""
    (line,) = checked.stderr.splitlines()
    assert line.startswith(
        "acp-proxy: c.yaml:2: tracing: tracing is enabled but the OpenTelemetry SDK (the otel "
        "extra) is not installed; add it with: "
    )
    ran = _run("--config", "c.yaml", "--", sys.executable, "-c", "pass", cwd=tmp_path,
               pythonpath=shadow)  # fmt: skip
    assert ran.returncode == 2  # the run refuses it too
    # With the SDK (the test extra), the same file is accepted.
    assert _run("check-config", "c.yaml", cwd=tmp_path).returncode == 0


def test_record_path_in_a_missing_directory_is_refused_like_the_run(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    (tmp_path / "c.yaml").write_text(f"record:\n  path: {missing}/r.jsonl\n", encoding="utf-8")
    checked = _run("check-config", "c.yaml", cwd=tmp_path)
    assert (checked.returncode, checked.stdout) == (2, "")
    assert checked.stderr == (
        f"acp-proxy: c.yaml:1: record: record.path {missing}/r.jsonl: the directory {missing} "
        "does not exist\n"
    )
    ran = _run("--config", "c.yaml", "--", sys.executable, "-c", "pass", cwd=tmp_path)
    assert ran.returncode == 2
    (missing / "..").resolve().mkdir(exist_ok=True)
    missing.mkdir()
    assert _run("check-config", "c.yaml", cwd=tmp_path).returncode == 0
