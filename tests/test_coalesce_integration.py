"""Coalescing end to end: a real slow client (this test process) reading from a real proxy
process in front of a real fake agent that bursts 50,000 tool-call progress updates.

Asserts exact final client state, a strict bound on the messages that arrive, and a bound on the
proxy's peak RSS (``ru_maxrss`` from ``os.wait4``, taken by a small launcher: see
``proxy_harness.measured_cmd``); with ``coalesce: {enabled: false}`` every
message arrives.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from proxy_harness import close_pipes, measured_cmd

from acp_proxy.meta.state import ClientModel

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "tests" / "fake_coalesce_agent.py"
SESSION = "sess_1"
TOOLS = 10
# Generous: the proxy's Python interpreter plus a bounded queue (default max 16 MiB).
MAX_RSS_MB = 96  # measured ~40 MiB on 2026-12-02 (idle proxy ~30 MiB)


def burst(updates: int, tools: int) -> list[dict[str, Any]]:
    """The fake agent's burst, computed by the agent's own code (the script is not a module)."""
    spec = importlib.util.spec_from_file_location("fake_coalesce_agent", AGENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result: list[dict[str, Any]] = module.burst(updates, tools)
    return result


def _run(tmp_path: Path, enabled: bool, updates: int) -> tuple[list[dict[str, Any]], int, int]:
    """One prompt through the proxy, read slowly: (messages, session/updates, maxrss KiB)."""
    config = tmp_path / "proxy.yaml"
    config.write_text(f"coalesce: {{enabled: {'true' if enabled else 'false'}}}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rss_file = tmp_path / f"rss-{enabled}"
    proc = subprocess.Popen(
        measured_cmd(
            rss_file,
            [
                sys.executable,
                "-m",
                "acp_proxy",
                "--config",
                str(config),
                "--",
                sys.executable,
                str(AGENT),
                "--updates",
                str(updates),
                "--tools",
                str(TOOLS),
            ],
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": 2, "info": {"name": "t", "version": "1"}, "capabilities": {}},
    }
    prompt = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "session/prompt",
        "params": {"sessionId": SESSION, "prompt": []},
    }
    proc.stdin.write(orjson.dumps(init) + b"\n")
    proc.stdin.flush()
    fd = proc.stdout.fileno()
    buffer = b""
    messages: list[dict[str, Any]] = []
    sent_prompt = False
    done = False
    while not done:
        data = os.read(fd, 8192)
        if not data:
            break
        buffer += data
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            message = orjson.loads(line)
            messages.append(message)
            if message.get("id") == 1 and not sent_prompt:
                proc.stdin.write(orjson.dumps(prompt) + b"\n")
                proc.stdin.flush()
                sent_prompt = True
            if message.get("id") == 2:
                done = True
        if sent_prompt:
            time.sleep(0.004)  # the slow client
    proc.stdin.close()
    proc.stdout.read()
    _, status, _usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    close_pipes(proc)
    assert done, "the prompt response never arrived"
    count = sum(1 for m in messages if m.get("method") == "session/update")
    return messages, count, int(rss_file.read_text())


def _expected_state(updates: int) -> dict[str, Any]:
    model = ClientModel(2)
    for update in burst(updates, TOOLS):
        model.apply(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": SESSION, "update": update},
            }
        )
    return model.snapshot()


def _state(messages: list[dict[str, Any]]) -> dict[str, Any]:
    model = ClientModel(2)
    for message in messages:
        model.apply(message)
    return model.snapshot()


@pytest.mark.slow
def test_slow_client_gets_exact_state_from_far_fewer_messages(tmp_path: Path) -> None:
    updates = 50_000
    messages, count, maxrss_kib = _run(tmp_path, True, updates)
    assert _state(messages) == _expected_state(updates)
    assert messages[-1] == {"jsonrpc": "2.0", "id": 2, "result": {}}  # after every update
    assert count < updates // 2, f"{count} of {updates} updates arrived"
    assert maxrss_kib < MAX_RSS_MB * 1024, f"proxy peak RSS {maxrss_kib} KiB"
    print(f"coalescing on: {updates} updates in, {count} out, proxy peak RSS {maxrss_kib} KiB")


@pytest.mark.slow
def test_without_coalescing_every_message_arrives(tmp_path: Path) -> None:
    updates = 10_000
    messages, count, _ = _run(tmp_path, False, updates)
    assert count == updates
    assert _state(messages) == _expected_state(updates)
