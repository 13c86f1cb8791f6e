"""A paused client never hangs a session: random streams and random pause patterns, end to end.

A real proxy process runs a real agent (``random_stream_agent.py``: many entities, ``_meta``
clears and key removals, text chunks, snapshots) that streams as fast as its pipe takes it and
exits. This test process is the client: it reads the answer to its ``initialize``, then follows a
random pattern of pauses (reading nothing) and bursts of fast reading, then reads to the end.
Every run must end (EOF within a bound, never a hang) with the client in exactly the state the
agent's stream gives (coalescing merged, never lost, a clear or a key removal).

The lost wake-up this guards against: a reader stopped by the queue's paused-input cap was never
woken after the writer drained the queue into the client's pipe, and the session hung for ever.
``tests/shell/session/test_coalesce_pays.py`` reproduces it deterministically; these runs look for
it (and its
kind) where it struck, with timing as it comes.
"""

from __future__ import annotations

import os
import random
import select
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from acp_schema import validate_v2_message
from coalesce_harness import RANDOM_AGENT, random_agent_stream, v2_client_state
from proxy_harness import REPO, close_pipes

ROOT = REPO
AGENT = RANDOM_AGENT
UPDATES = 40_000
# A run reads ~10 MB after pauses of at most ~1.5 s in all; a hung one never ends.
RUN_BOUND_S = 30.0


_agent_stream = random_agent_stream
_state = v2_client_state


def _pattern(seed: int) -> list[tuple[float, int]]:
    """(pause in seconds, then bytes read as fast as possible) steps; the first pause starts
    right after the answer to ``initialize``. Several pauses: each one fills the proxy's queue
    and the client's pipe, and each resume is a chance for a lost wake-up."""
    rng = random.Random(seed ^ 0x5EED)
    steps = [(rng.uniform(0.3, 0.6), rng.choice([1, 4096, 256 * 1024, 2 << 20]))]
    for _ in range(rng.randrange(3, 6)):
        steps.append((rng.uniform(0.12, 0.35), rng.choice([1, 64 * 1024, 512 * 1024, 1 << 20])))
    return steps


def run_paused_client(
    seed: int, tmp_path: Path, updates: int = UPDATES, queue: int | None = None
) -> tuple[bytes, str]:
    """One session through a real proxy with a paused and resumed client: (what the client
    read after the answer to ``initialize``, the proxy's stderr). Fails on a hang."""
    err_path = tmp_path / f"stderr-{seed}"
    config = tmp_path / f"proxy-{seed}.yaml"
    config.write_text(f"coalesce: {{max_queue_messages: {queue}}}\n" if queue else "{}\n")
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "acp_proxy",
                "--config",
                str(config),
                "--",
                sys.executable,
                str(AGENT),
                "--seed",
                str(seed),
                "--updates",
                str(updates),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=ROOT,
        )
    assert proc.stdin is not None and proc.stdout is not None
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": 2, "clientCapabilities": {}},
    }
    received = bytearray()
    try:
        proc.stdin.write(orjson.dumps(init) + b"\n")
        proc.stdin.flush()
        # The answer to ``initialize`` read from the descriptor itself, as everything after it:
        # a buffered ``readline`` may take the first updates with it into a buffer that the
        # reads below never see (the stream would then start in the middle of a line).
        fd = proc.stdout.fileno()
        while b"\n" not in received:
            chunk = os.read(fd, 4096)
            assert chunk, "the proxy closed its output before answering initialize"
            received += chunk
        first, _, rest = bytes(received).partition(b"\n")
        received[:] = rest
        assert orjson.loads(first)["result"]["protocolVersion"] == 2
        deadline = time.monotonic() + RUN_BOUND_S
        for pause, amount in [*_pattern(seed), (0.0, -1)]:
            time.sleep(pause)
            want = len(received) + amount if amount >= 0 else None
            while want is None or len(received) < want:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([fd], [], [], max(0.0, left))
                if not ready:
                    proc.kill()
                    proc.wait()
                    tail = err_path.read_text(errors="replace")[-4000:]
                    lines = received.count(b"\n")
                    pytest.fail(
                        f"seed {seed}: no byte for the rest of {RUN_BOUND_S} s after "
                        f"{len(received)} bytes ({lines} lines); the proxy "
                        f"said:\n{tail}"
                    )
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                received += chunk
            else:
                continue
            break
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        close_pipes(proc)
    return bytes(received), err_path.read_text(errors="replace")


KINDS = {
    "tool_call_update",
    "agent_message_chunk",
    "agent_thought_chunk",
    "terminal_update",
    "plan_update",
    "usage_update",
    "agent_message",
}
# Each seed is a stream and a pause pattern, with a small queue bound (its paused-input cap is
# reached sooner) or the default one. Timing decides whether a lost wake-up strikes: before the
# fix, 3 of the first 12 seeds hung in one try (small bound) and 1 of these 12 runs in another.
SEEDS = [(seed, 256) for seed in range(10)] + [(10, None), (11, None)]


@pytest.mark.parametrize(("seed", "queue"), SEEDS)
def test_a_paused_then_resumed_client_gets_the_exact_state_and_the_end(
    seed: int, queue: int | None, tmp_path: Path
) -> None:
    received, stderr = run_paused_client(seed, tmp_path, queue=queue)
    lines = received.split(b"\n")
    assert lines[-1] == b""  # every line whole
    assert _state(lines[:-1]) == _state(_agent_stream(seed, UPDATES))
    assert "watchdog" not in stderr  # the queue's own wake-ups did it


def test_the_agent_s_streams_are_real_acp_v2() -> None:
    """Every shape of line the random agent draws (each kind with each set of fields and each
    kind of ``_meta``) validates against the official v2 schema."""
    shapes: set[tuple[str, tuple[str, ...], str]] = set()
    for seed in (0, 1, 2, 3):
        for line in _agent_stream(seed, 1500):
            message = orjson.loads(line)
            update = message["params"]["update"]
            meta = type(update.get("_meta", ...)).__name__
            shape = (update["sessionUpdate"], tuple(sorted(update)), meta)
            if shape not in shapes:
                shapes.add(shape)
                validate_v2_message(message)
    assert {meta for _kind, _keys, meta in shapes} == {"ellipsis", "dict", "NoneType"}
    seen = {kind for kind, _keys, _meta in shapes}
    assert seen == KINDS
