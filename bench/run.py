"""The acp-proxy benchmark suite (issue 6): one command, ratios against same-run baselines.

Contract: owns the benchmark harness. It generates (or reuses) the data sets of
``bench/generate.py``, runs every variant of every scenario interleaved (repetition 1 of every
variant, then repetition 2, ...), and prints a Markdown table per scenario to stdout and writes
all numbers to a JSON file. It measures and reports; it never asserts a timing.

Scenarios:
  1. throughput agent -> client (MB/s, messages/s) per profile: ``cat`` between two pipes, a C
     byte relay, the minimal Python line relay and orjson parse+inject relay
     (``bench/relay_min.py``), and the proxy with a pass-through config and with the annotation
     rule (each with coalescing on, the default, and off), and with config/example.yaml;
  2. CPU per message (user+sys of the relay process from ``os.wait4``, minus the same variant's
     start-up cost measured on an empty data set, divided by the messages), same runs as 1;
  3. round-trip latency of sequential small request/response pairs, direct vs through the proxy;
  4. peak RSS (``ru_maxrss``, via bench/spawn_rusage.c) with a 10 MB line, over a ~1 GB stream
     against one pass, and with a slow client (coalescing on and off);
  5. TCP and Unix-socket throughput relative to stdio (``--listen``), or an "n/a" row;
  6. start-up wall and CPU time of ``acp-proxy -- true`` against the minimal relay's
     (``bench/startup.py``).

The peers (issue 13; installed by ``bench/setup_peers.py``, skipped with the reason when they
are not): the TypeScript conductor with no components and with one annotating component, and a
relay on the official Python SDK, are rows of scenarios 1, 2, 3, 4 and 6 (scenario 5: an "n/a"
row each, neither can listen). Both renumber request ids, so their agent is
``replay_agent.py --renumber`` (it answers the ids it receives); their output is checked as JSON
(message by message, agent requests' ids aside) instead of byte for byte, and the output cell
says what came out (the conductor drops JSON-RPC batches; the SDK's Connection stops reading at
the first one).

Usage: ``python bench/run.py`` (full, ~50 MB per data set) or ``python bench/run.py --quick``
(seconds; the CI smoke run); ``--out results.json``; ``--help`` for the rest.
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import datetime
import json
import math
import os
import platform
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
import relay_min
import setup_peers
from generate import DEFAULT_SEED, Dataset, ensure, parse_size

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
SCHEMA = "acp-proxy-bench/1"

# Variants of scenarios 1 and 2, in run order. Baselines first, then the proxy.
BASELINES = ("pipe-cat", "c-relay", "py-line", "py-inject")
PROXY_VARIANTS = (
    "proxy-passthrough",
    "proxy-passthrough-nc",
    "proxy-annotate",
    "proxy-annotate-nc",
    "proxy-example",
)
VARIANT_TITLES = {
    "pipe-cat": "cat between two pipes",
    "c-relay": "C byte relay (bench/relay.c)",
    "py-line": "Python line relay (relay_min.py line)",
    "py-inject": "Python orjson parse+inject (relay_min.py inject)",
    "proxy-passthrough": "acp-proxy, pass-through rules",
    "proxy-passthrough-nc": "acp-proxy, pass-through rules, coalescing off",
    "proxy-annotate": "acp-proxy, annotation rule",
    "proxy-annotate-nc": "acp-proxy, annotation rule, coalescing off",
    "proxy-example": "acp-proxy, config/example.yaml",
}
PROFILES = (("mixed", 2), ("mixed", 1), ("chunks", 2))
# Issue 13: the peers (installed by bench/setup_peers.py into the build dir). Scenario 3 has the
# two peers; scenarios 1, 2 and 4 also the conductor with one annotating component.
_CONDUCTOR = setup_peers.CONDUCTOR.removeprefix("@thinkwell/conductor@")
_SDK = setup_peers.SDK.removeprefix("agent-client-protocol==")
PEER_TITLES = {
    "conductor": f"TypeScript conductor (@thinkwell/conductor {_CONDUCTOR}, no components)",
    "sdk-relay": f"Python SDK relay (agent-client-protocol {_SDK}, a Connection each way)",
}
PEER_VARIANTS = ("conductor", "conductor-annotate", "sdk-relay")
VARIANT_TITLES.update(PEER_TITLES)
VARIANT_TITLES["conductor-annotate"] = (
    f"TypeScript conductor ({_CONDUCTOR}), one annotating component (in-process)"
)
# Scenario 5: why a peer has no socket row.
PEER_NO_LISTEN = {
    "conductor": "n/a: the conductor cannot listen for ACP clients: it serves one client through "
    "a ComponentConnection its embedder supplies; its connectors are stdio and in-process, its "
    "only listener the MCP bridge's HTTP one",
    "sdk-relay": "n/a: the SDK has no newline-delimited JSON listener; its servers are an "
    "experimental ASGI app (Streamable HTTP, WebSocket; the [http] extra and an ASGI server), "
    "another framing than --listen",
}
# The ratio columns of scenarios 1 and 2: each row divided by these baselines, rep by rep.
# "proxy-passthrough" (issue 13): the peers against the proxy, this row ÷ the proxy's.
RATIO_BASES = ("py-line", "py-inject", "c-relay", "proxy-passthrough")


# -- settings -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Settings:
    quick: bool
    reps: int
    size: int  # bytes per throughput data set
    bigline_size: int
    burst_size: int
    latency_pairs: int
    long_repeat: int  # passes over the notify data set for the long-stream memory row
    slow_read_bytes: int
    slow_sleep_s: float
    seed: int
    data_dir: Path
    build_dir: Path
    work_dir: Path
    annotate_config: Path
    passthrough_config: Path
    example_config: Path | None


def parse_args(argv: Sequence[str] | None) -> tuple[Settings, Path | None, set[int]]:
    ap = argparse.ArgumentParser(
        description="Run the acp-proxy benchmark suite (issue 6).",
        epilog="Full run: python bench/run.py --out bench/results/latest.json",
    )
    ap.add_argument("--quick", action="store_true", help="tiny data, 1 repetition (CI smoke run)")
    ap.add_argument("--out", type=Path, help="write the JSON results here")
    ap.add_argument("--reps", type=int, help="interleaved repetitions (default 3, quick 1)")
    ap.add_argument("--size", type=parse_size, help="throughput data set size (default 50M)")
    ap.add_argument("--latency-pairs", type=int, help="request/response pairs (default 10000)")
    ap.add_argument(
        "--long-repeat", type=int, help="passes for the long stream (default 20: ~1 GB)"
    )
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument(
        "--scenarios",
        type=lambda t: {int(x) for x in t.split(",")},
        default={1, 2, 3, 4, 5, 6},
        help="comma-separated subset, e.g. 3,4 (default: all; 1 and 2 share their runs; "
        "6 is start-up)",
    )
    ap.add_argument("--data-dir", type=Path, default=BENCH / "data")
    ap.add_argument("--build-dir", type=Path, default=BENCH / "build")
    ap.add_argument("--annotate-config", type=Path, default=BENCH / "rules-annotate.yaml")
    ap.add_argument("--passthrough-config", type=Path, default=BENCH / "rules-passthrough.yaml")
    a = ap.parse_args(argv)
    q = bool(a.quick)
    example = ROOT / "config" / "example.yaml"
    work = Path(tempfile.mkdtemp(prefix="acp-bench-"))
    s = Settings(
        quick=q,
        reps=a.reps or (1 if q else 3),
        size=a.size or (parse_size("256K") if q else parse_size("50M")),
        bigline_size=parse_size("1M") if q else 10 * 1024 * 1024,
        burst_size=parse_size("256K") if q else parse_size("16M"),
        latency_pairs=a.latency_pairs or (300 if q else 10_000),
        long_repeat=a.long_repeat or (4 if q else 20),
        slow_read_bytes=4096,
        slow_sleep_s=0.0002 if q else 0.001,
        seed=a.seed,
        data_dir=a.data_dir.resolve(),
        build_dir=a.build_dir.resolve(),
        work_dir=work,
        annotate_config=a.annotate_config.resolve(),
        passthrough_config=a.passthrough_config.resolve(),
        example_config=example if example.exists() else None,
    )
    return s, a.out, set(a.scenarios)


# -- statistics -----------------------------------------------------------------------------
def stats(values: Sequence[float]) -> dict[str, float | int] | None:
    """Median, min, max and count of finite values; None when there are none."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


# -- processes ------------------------------------------------------------------------------
@dataclass(slots=True)
class Exit:
    code: int | None  # None: had to be killed after the timeout
    cpu_s: float
    maxrss_kb: int


def wait_rusage(proc: subprocess.Popen[bytes], timeout: float) -> Exit:
    """Reap ``proc`` with ``os.wait4`` (its own rusage, including its reaped children)."""
    deadline = time.monotonic() + timeout
    killed = False
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        if time.monotonic() > deadline and not killed:
            _kill_group(proc)
            killed = True
            deadline = time.monotonic() + 5
        elif time.monotonic() > deadline:
            pid, status, ru = os.wait4(proc.pid, 0)
            break
        time.sleep(0.002)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Exit(None if killed else proc.returncode, ru.ru_utime + ru.ru_stime, int(ru.ru_maxrss))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group we created for ``proc`` (start_new_session=True)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env.update(extra)
    return env


def _feed(pipe: IO[bytes], data: bytes) -> None:
    """Write the client side's frames, then leave the pipe open (closed by the caller)."""
    with suppress(BrokenPipeError, OSError, ValueError):
        pipe.write(data)
        pipe.flush()


@dataclass(slots=True)
class Sink:
    bytes: int = 0
    lines: int = 0
    crc: int = 0
    first: float | None = None
    last: float | None = None
    timed_out: bool = False


def drain(
    fd: int,
    timeout: float,
    *,
    read_size: int = 1 << 20,
    sleep_s: float = 0.0,
    keep: IO[bytes] | None = None,
) -> Sink:
    """Read ``fd`` to EOF (the client side), counting bytes, lines and a CRC of the output;
    with ``keep``, the output is also written there (the peers' JSON check)."""
    sink = Sink()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            sink.timed_out = True
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        data = os.read(fd, read_size)
        now = time.perf_counter()
        if not data:
            break
        if sink.first is None:
            sink.first = now
        sink.bytes += len(data)
        sink.lines += data.count(b"\n")
        sink.crc = zlib.crc32(data, sink.crc)
        if keep is not None:
            keep.write(data)
        if sleep_s:
            time.sleep(sleep_s)
    sink.last = time.perf_counter()
    return sink


def file_crc(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


@dataclass(slots=True)
class Run:
    """One stream through one variant."""

    ok: bool
    error: str | None = None
    xfer_s: float = math.nan  # first output byte to EOF
    wall_s: float = math.nan  # spawn to exit
    cpu_s: float = math.nan  # the relay's own user+sys (agent subtracted for the proxy)
    maxrss_kb: int = 0
    out_bytes: int = 0
    out_lines: int = 0
    identical: bool = False
    json_check: dict[str, int] | None = None  # the peers: what came out, message by message


class Harness:
    """Spawns variants and measures them. Holds the few paths every run needs."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.c_relay: Path | None = None
        self.launcher: Path | None = None  # bench/spawn_rusage.c, for exact ru_maxrss
        self.c_error: str | None = None
        self.proxy_error: str | None = None
        self.peer_errors: dict[str, str | None] = {}  # issue 13: peer -> why it is skipped
        self.crcs: dict[str, int] = {}
        self.expected: dict[tuple[str, bool], tuple[Counter[bytes], int, int]] = {}
        self.counter = 0

    # -- set-up -------------------------------------------------------------------------------
    def build_c(self) -> None:
        """Compile the C relay and the rusage launcher into the build dir (skipped without cc)."""
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            self.c_error = "no C compiler (cc/gcc/clang) on PATH"
            return
        self.s.build_dir.mkdir(parents=True, exist_ok=True)
        for name in ("relay", "spawn_rusage"):
            out = self.s.build_dir / name
            tmp = self.s.build_dir / f"{name}.{os.getpid()}.tmp"
            res = subprocess.run(
                [cc, "-O2", "-o", str(tmp), str(BENCH / f"{name}.c")],
                capture_output=True,
                text=True,
                check=False,
            )
            if res.returncode != 0:
                self.c_error = f"cc failed on {name}.c: {res.stderr.strip().splitlines()[-1:]}"
                return
            os.replace(tmp, out)
        self.c_relay = self.s.build_dir / "relay"
        self.launcher = self.s.build_dir / "spawn_rusage"

    def wrap(self, argv: list[str], rusage_path: Path) -> list[str]:
        """``argv`` under the rusage launcher when it was built (see spawn_rusage.c)."""
        return [str(self.launcher), str(rusage_path), *argv] if self.launcher else argv

    def measured(self, rx: Exit, rusage_path: Path) -> Exit:
        """The launcher's figures for the command when available, else wait4's own."""
        if self.launcher is None:
            return rx
        cpu, rss = read_agent_rusage(rusage_path)
        return Exit(rx.code, cpu, rss) if rss else rx

    def check_proxy(self) -> None:
        """The proxy runs when ``python -m acp_proxy --help`` exits 0. Its package is
        byte-compiled first, as an installed copy is (with ``PYTHONDONTWRITEBYTECODE`` set, every
        start would otherwise compile the sources and count that as start-up CPU)."""
        compileall.compile_dir(str(ROOT / "acp_proxy"), quiet=1)
        try:
            res = subprocess.run(
                [PY, "-m", "acp_proxy", "--help"],
                capture_output=True,
                text=True,
                env=env_with(),
                timeout=60,
                check=False,
            )
        except subprocess.TimeoutExpired:
            self.proxy_error = "python -m acp_proxy --help timed out"
            return
        if res.returncode != 0:
            tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
            self.proxy_error = f"proxy not runnable: {tail}"

    def crc(self, ds: Dataset) -> int:
        if ds.agent_path not in self.crcs:
            self.crcs[ds.agent_path] = file_crc(ds.agent_path)
        return self.crcs[ds.agent_path]

    def tmp(self, name: str) -> Path:
        self.counter += 1
        return self.s.work_dir / f"{self.counter:05d}-{name}"

    # -- commands -----------------------------------------------------------------------------
    def relay_argv(self, variant: str) -> list[str] | None:
        if variant == "pipe-cat":
            return ["cat"]
        if variant == "c-relay":
            return [str(self.c_relay)] if self.c_relay else None
        if variant == "py-line":
            return [PY, str(BENCH / "relay_min.py"), "line"]
        if variant == "py-inject":
            return [PY, str(BENCH / "relay_min.py"), "inject"]
        raise ValueError(variant)

    def proxy_config(self, variant: str) -> Path:
        if variant.endswith("-nc"):
            return self.coalesce_config(self.proxy_config(variant.removesuffix("-nc")), False)
        return {
            "proxy-passthrough": self.s.passthrough_config,
            "proxy-annotate": self.s.annotate_config,
            "proxy-example": self.s.example_config or self.s.annotate_config,
        }[variant]

    def coalesce_config(self, base: Path, enabled: bool) -> Path:
        """``base`` plus an explicit ``coalesce: {enabled: ...}`` section (issue 4's switch)."""
        path = self.s.work_dir / f"{base.stem}-coalesce-{'on' if enabled else 'off'}.yaml"
        if not path.exists():
            flag = "true" if enabled else "false"
            path.write_text(base.read_text() + f"\ncoalesce:\n  enabled: {flag}\n")
        return path

    def proxy_argv(self, config: Path, agent: list[str], extra: Sequence[str] = ()) -> list[str]:
        return [PY, "-m", "acp_proxy", "--config", str(config), *extra, "--", *agent]

    def skip_reason(self, variant: str) -> str | None:
        if variant in PEER_VARIANTS:
            return self.peer_errors.get(peer_of(variant), "peers not checked")
        if variant == "c-relay" and self.c_relay is None:
            return self.c_error or "C relay not built"
        if variant.startswith("proxy"):
            if self.proxy_error:
                return self.proxy_error
            if variant == "proxy-example" and self.s.example_config is None:
                return "config/example.yaml not found"
        return None

    @staticmethod
    def timeout_for(ds: Dataset) -> float:
        return 60.0 + ds.bytes / 1e6  # generous: a 1 MB/s proxy still finishes

    # -- one stream ---------------------------------------------------------------------------
    def stream(
        self,
        variant: str,
        ds: Dataset,
        *,
        config: Path | None = None,
        slow: bool = False,
        repeat: int = 1,
    ) -> Run:
        """Stream ``ds`` through ``variant`` into a fast (or slow) client and measure it.

        ``repeat`` > 1 (proxy only) replays the body of a ``notify`` data set that many times.
        """
        read_size = self.s.slow_read_bytes if slow else 1 << 20
        sleep_s = self.s.slow_sleep_s if slow else 0.0
        timeout = self.timeout_for(ds) * (20 if slow else repeat)
        if variant.startswith("proxy"):
            cfg = config or self.proxy_config(variant)
            return self._stream_wrapped(
                lambda agent: self.proxy_argv(cfg, agent),
                env_with(),
                [PY, str(BENCH / "replay_agent.py"), ds.agent_path, str(repeat)],
                ds,
                timeout,
                read_size=read_size,
                sleep_s=sleep_s,
            )
        if variant in PEER_VARIANTS:
            replay = [PY, str(BENCH / "replay_agent.py"), "--renumber", ds.client_path]
            return self._stream_wrapped(
                lambda agent: self.peer_argv(variant, agent),
                self.peer_env(variant),
                [*replay, ds.agent_path, str(repeat)],
                ds,
                timeout * 3,  # the peers are slower than the proxy
                read_size=read_size,
                sleep_s=sleep_s,
                peer=(variant == "conductor-annotate", repeat),
            )
        argv = self.relay_argv(variant)
        assert argv is not None
        t0 = time.perf_counter()
        with open(ds.client_path, "rb") as client_in:
            agent = subprocess.Popen(
                [PY, str(BENCH / "replay_agent.py"), ds.agent_path],
                stdin=client_in,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
        assert agent.stdout is not None
        relay_ru = self.tmp("relay-rusage.json")
        relay = subprocess.Popen(
            self.wrap(argv, relay_ru),
            stdin=agent.stdout,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        agent.stdout.close()
        assert relay.stdout is not None
        sink = drain(relay.stdout.fileno(), timeout, read_size=read_size, sleep_s=sleep_s)
        relay.stdout.close()
        if sink.timed_out:
            _kill_group(agent)
            _kill_group(relay)
        rx = self.measured(wait_rusage(relay, 10), relay_ru)
        wait_rusage(agent, 10)
        return self._result(ds, sink, rx, t0, cpu_s=rx.cpu_s)

    # -- the peers (issue 13) ------------------------------------------------------------------
    def peer_argv(self, variant: str, agent: list[str]) -> list[str]:
        if variant == "sdk-relay":
            return [PY, str(BENCH / "peer_sdk_relay.py"), *agent]
        flags = ["--annotate"] if variant == "conductor-annotate" else []
        return ["node", str(BENCH / "peer_conductor.mjs"), *flags, *agent]

    def peer_env(self, variant: str) -> dict[str, str]:
        if variant == "sdk-relay":
            return env_with(PYTHONPATH=str(setup_peers.sdk_path(self.s.build_dir)))
        return env_with(CONDUCTOR_MODULE=str(setup_peers.conductor_module(self.s.build_dir)))

    def expected_messages(self, ds: Dataset, annotate: bool) -> tuple[Counter[bytes], int, int]:
        """The agent file's messages as ``json_key``s (annotated as the inject relay does when
        ``annotate``), with the number of batches and of messages inside them."""
        key = (ds.agent_path, annotate)
        if key not in self.expected:
            counts: Counter[bytes] = Counter()
            batches = in_batches = 0
            with open(ds.agent_path, "rb") as f:
                for line in f:
                    msg = orjson.loads(line)
                    entries = msg if isinstance(msg, list) else [msg]
                    if isinstance(msg, list):
                        batches += 1
                        in_batches += len(msg)
                    for entry in entries:
                        if annotate:
                            relay_min._inject_one(entry)
                        counts[json_key(entry)] += 1
            self.expected[key] = (counts, batches, in_batches)
        return self.expected[key]

    def check_json(self, ds: Dataset, out_path: Path, annotate: bool) -> dict[str, int]:
        """What a peer delivered, message by message, against the agent file (as JSON values;
        an agent request's id aside, since the peers renumber those too)."""
        expected, batches, in_batches = self.expected_messages(ds, annotate)
        got: Counter[bytes] = Counter()
        batches_out = unparsable = 0
        with open(out_path, "rb") as f:
            for line in f:
                try:
                    msg = orjson.loads(line)
                except orjson.JSONDecodeError:
                    unparsable += 1
                    continue
                if isinstance(msg, list):
                    batches_out += 1
                for entry in msg if isinstance(msg, list) else [msg]:
                    got[json_key(entry)] += 1
        equal = sum((expected & got).values())
        return {
            "messages_in": ds.messages,
            "messages_out": sum(got.values()),
            "messages_equal": equal,
            "batches_in": batches,
            "batch_messages_in": in_batches,
            "batches_out": batches_out,
            "unparsable_lines_out": unparsable,
        }

    def _stream_wrapped(
        self,
        make_argv: Callable[[list[str]], list[str]],
        env: dict[str, str],
        agent: list[str],
        ds: Dataset,
        timeout: float,
        *,
        read_size: int,
        sleep_s: float,
        peer: tuple[bool, int] | None = None,
    ) -> Run:
        """Stream ``ds`` through a sidecar that spawns ``agent`` itself (the proxy, a peer); the
        agent's own CPU is subtracted. ``peer`` = (annotated, passes) for the peers: one pass is
        kept and checked as JSON (against the agent file annotated as the inject relay does, when
        annotated); a run whose output stopped early (lines missing beyond dropped batches) is an
        error, since its throughput would be a prefix's."""
        check = peer is not None and peer[1] == 1
        agent_ru = self.tmp("agent-rusage.json")
        proxy_ru = self.tmp("proxy-rusage.json")
        stderr_path = self.tmp("proxy-stderr.log")
        out_path = self.tmp("output.jsonl")
        t0 = time.perf_counter()
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                self.wrap(make_argv(agent), proxy_ru),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env={**env, "BENCH_AGENT_RUSAGE": str(agent_ru)},
                start_new_session=True,
            )
        assert proc.stdin is not None and proc.stdout is not None
        feeder = threading.Thread(
            target=_feed, args=(proc.stdin, Path(ds.client_path).read_bytes()), daemon=True
        )
        feeder.start()
        with open(out_path, "wb") if check else nullcontext() as keep:
            sink = drain(
                proc.stdout.fileno(), timeout, read_size=read_size, sleep_s=sleep_s, keep=keep
            )
        proc.stdout.close()
        feeder.join(5)
        with suppress(OSError):
            proc.stdin.close()
        if sink.timed_out:
            _kill_group(proc)
        rx = self.measured(wait_rusage(proc, 30), proxy_ru)
        agent_cpu, agent_rss = read_agent_rusage(agent_ru)
        run = self._result(ds, sink, rx, t0, cpu_s=rx.cpu_s - agent_cpu)
        if peer is not None:
            annotated, passes = peer
            _, batches, _ = self.expected_messages(ds, False)
            lines_in = ds.lines + (passes - 1) * (ds.lines - 2)  # the body is replayed
            what = f"lines {sink.lines:,} of {lines_in:,}"
            if check:
                run.json_check = self.check_json(ds, out_path, annotated)
                out_path.unlink()
                what = json_check_text(run.json_check, ds.lines, sink.lines)
            if run.ok and sink.lines + batches * passes < lines_in * 0.99:
                run.ok = False  # stopped early: a throughput figure would be a prefix's
                run.error = f"incomplete output ({what})"
        if agent_rss > run.maxrss_kb * 0.9:
            # wait4's ru_maxrss is the max over the proxy and its reaped children: flag it.
            run.error = (run.error or "") + f" (agent RSS {agent_rss} kB close to the max)"
        if not run.ok:
            run.error = f"{run.error}; stderr: {tail_of(stderr_path)}"
        return run

    def _result(self, ds: Dataset, sink: Sink, rx: Exit, t0: float, *, cpu_s: float) -> Run:
        wall = time.perf_counter() - t0
        error = None
        if sink.timed_out:
            error = "timed out"
        elif rx.code is None:
            error = "did not exit after EOF; killed"
        elif sink.bytes == 0:
            error = f"no output (exit code {rx.code})"
        xfer = (sink.last or math.nan) - (sink.first or math.nan)
        return Run(
            ok=error is None,
            error=error,
            xfer_s=xfer,
            wall_s=wall,
            cpu_s=cpu_s,
            maxrss_kb=rx.maxrss_kb,
            out_bytes=sink.bytes,
            out_lines=sink.lines,
            identical=sink.bytes == ds.bytes and sink.crc == self.crc(ds),
        )


def peer_of(variant: str) -> str:
    """The installed peer a variant runs (``conductor-annotate`` is the conductor)."""
    return "sdk-relay" if variant == "sdk-relay" else "conductor"


def json_key(msg: Any) -> bytes:
    """A message as canonical JSON (sorted keys), an agent request's id left out."""
    if isinstance(msg, dict) and "method" in msg and "id" in msg:
        msg = {k: v for k, v in msg.items() if k != "id"}
    return orjson.dumps(msg, option=orjson.OPT_SORT_KEYS)


def json_check_text(jc: dict[str, int], lines_in: int, lines_out: int) -> str:
    """The "output" cell of a peer: what came out, message by message."""
    text = (
        f"lines {lines_out:,} of {lines_in:,}; {jc['messages_equal']:,} of "
        f"{jc['messages_in']:,} messages equal as JSON"
    )
    if jc["batches_in"]:
        dropped = jc["batches_in"] - jc["batches_out"]
        text += f"; {dropped:,} of {jc['batches_in']:,} batches dropped"
    other = jc["messages_out"] - jc["messages_equal"]
    if other:
        text += f"; {other:,} other message(s) out"
    if jc["unparsable_lines_out"]:
        text += f"; {jc['unparsable_lines_out']:,} lines not JSON"
    return text


def read_agent_rusage(path: Path) -> tuple[float, int]:
    try:
        data = json.loads(path.read_text())
        return float(data["utime"]) + float(data["stime"]), int(data["maxrss_kb"])
    except (OSError, ValueError, KeyError):
        return 0.0, 0


def tail_of(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no stderr)"
    return " | ".join(text[-lines:]) or "(empty stderr)"


# -- rows -----------------------------------------------------------------------------------
@dataclass(slots=True)
class Row:
    scenario: int
    profile: str
    variant: str
    title: str
    status: str = "ok"  # ok | skipped | error
    reason: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, Any] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"s{self.scenario}/{self.profile}/{self.variant}"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["id"] = self.id
        return d


def skipped(scenario: int, profile: str, variant: str, title: str, reason: str) -> Row:
    return Row(scenario, profile, variant, title, status="skipped", reason=reason)


def paired_ratios(
    runs: dict[str, list[Run]], variant: str, base: str, value: Callable[[Run], float]
) -> dict[str, float | int] | None:
    """Repetition-by-repetition ratio ``value(variant) / value(base)`` (interleaved pairs)."""
    out: list[float] = []
    for a, b in zip(runs.get(variant, []), runs.get(base, []), strict=False):
        if a.ok and b.ok:
            va, vb = value(a), value(b)
            if vb > 0 and math.isfinite(va) and math.isfinite(vb):
                out.append(va / vb)
    return stats(out)


STARTUP_SAMPLES = 3


# -- scenarios 1 and 2 ----------------------------------------------------------------------
def scenario_throughput(h: Harness, log: Callable[[str], None]) -> list[Row]:
    s = h.s
    variants = [*BASELINES, *PROXY_VARIANTS, *PEER_VARIANTS]
    empty = ensure(s.data_dir, "empty", 2, 1, s.seed)
    # The CPU of a run on a stream of two messages, subtracted from every run of the variant:
    # the median of three interleaved runs (issue 13: one sample moved by +-40 ms on this
    # machine, +-1.7 us per message on a 16 MiB data set, more than the difference measured).
    samples: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(STARTUP_SAMPLES):
        for v in variants:
            if h.skip_reason(v) is None:
                r = h.stream(v, empty)
                if r.ok:
                    samples[v].append(r.cpu_s)
                else:
                    log(f"  start-up run of {v} failed (not counted): {r.error}")
    startup = {v: statistics.median(xs) for v, xs in samples.items() if xs}
    rows: list[Row] = []
    for profile, version in PROFILES:
        ds = ensure(s.data_dir, profile, version, s.size, s.seed)
        pname = f"{profile}-v{version}"
        runs: dict[str, list[Run]] = {v: [] for v in variants}
        for rep in range(s.reps):
            for v in variants:
                if h.skip_reason(v) is None:
                    r = h.stream(v, ds)
                    runs[v].append(r)
                    log(
                        f"  s1 {pname} rep {rep + 1}/{s.reps} {v}: "
                        + (f"{ds.bytes / r.xfer_s / 1e6:.1f} MB/s" if r.ok else f"ERROR {r.error}")
                    )

        def mb_s(r: Run, ds: Dataset = ds) -> float:
            return ds.bytes / r.xfer_s / 1e6

        def msg_s(r: Run, ds: Dataset = ds) -> float:
            return ds.messages / r.xfer_s

        def cpu_us(r: Run, ds: Dataset = ds, v: str = "") -> float:
            return max(0.0, r.cpu_s - startup.get(v, 0.0)) / ds.messages * 1e6

        for v in variants:
            title = VARIANT_TITLES[v]
            reason = h.skip_reason(v)
            if reason is not None:
                rows.append(skipped(1, pname, v, title, reason))
                rows.append(skipped(2, pname, v, title, reason))
                continue
            ok = [r for r in runs[v] if r.ok]
            errors = [r.error for r in runs[v] if not r.ok]
            check = {
                "messages_in": ds.messages,
                "lines_in": ds.lines,
                "bytes_in": ds.bytes,
                "lines_out": [r.out_lines for r in runs[v]],
                "identical": [r.identical for r in runs[v]],
                "errors": errors,
            }
            if v in PEER_VARIANTS:
                check["json"] = [r.json_check for r in runs[v]]
            if not ok:
                rows.append(
                    Row(1, pname, v, title, "error", errors[0] if errors else "no run", check=check)
                )
                rows.append(Row(2, pname, v, title, "error", errors[0] if errors else "no run"))
                continue

            def cpu_v(r: Run, v: str = v) -> float:
                return cpu_us(r, v=v)

            rows.append(
                Row(
                    1,
                    pname,
                    v,
                    title,
                    metrics={
                        "mb_s": stats([mb_s(r) for r in ok]),
                        "msg_s": stats([msg_s(r) for r in ok]),
                        "peak_rss_mb": stats([r.maxrss_kb / 1024 for r in ok]),
                    },
                    ratios={b: paired_ratios(runs, v, b, mb_s) for b in RATIO_BASES},
                    check=check,
                )
            )
            cpu_ratios: dict[str, Any] = {}
            for b in RATIO_BASES:
                ratio_list: list[float] = []
                for a, c in zip(runs[v], runs.get(b, []), strict=False):
                    if a.ok and c.ok and cpu_us(c, v=b) > 0:
                        ratio_list.append(cpu_v(a) / cpu_us(c, v=b))
                cpu_ratios[b] = stats(ratio_list)
            rows.append(
                Row(
                    2,
                    pname,
                    v,
                    title,
                    metrics={
                        "cpu_us_per_msg": stats([cpu_v(r) for r in ok]),
                        "startup_cpu_ms": startup.get(v, 0.0) * 1000,
                    },
                    ratios=cpu_ratios,
                )
            )
    return rows


# -- scenario 3 -----------------------------------------------------------------------------
class LineClient:
    """A client on a pipe pair: write one request, read one response line."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.wfd = proc.stdin.fileno()
        self.rfd = proc.stdout.fileno()
        self.buf = b""

    def call(self, data: bytes, timeout: float = 30.0) -> bytes:
        view = memoryview(data)
        while view:
            view = view[os.write(self.wfd, view) :]
        while b"\n" not in self.buf:
            ready, _, _ = select.select([self.rfd], [], [], timeout)
            if not ready:
                raise TimeoutError("no response")
            chunk = os.read(self.rfd, 65536)
            if not chunk:
                raise EOFError("EOF before the response")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line


def _request(rid: int, method: str, params: dict[str, Any]) -> bytes:
    return (
        json.dumps(
            {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}, separators=(",", ":")
        ).encode()
        + b"\n"
    )


def scenario_latency(h: Harness, log: Callable[[str], None]) -> list[Row]:
    s = h.s
    title = {
        "direct": "client -> echo agent, direct",
        "proxy-passthrough": "through acp-proxy (pass-through)",
    }
    title.update({v: VARIANT_TITLES[v] for v in PEER_VARIANTS})
    # Issue 13: the floor the round trip approaches, a two-way asyncio relay that only copies.
    title["asyncio-relay"] = "minimal asyncio relay (bench/relay_asyncio.py): the floor"
    variants = ["direct", "asyncio-relay", "proxy-passthrough"]
    reason = h.skip_reason("proxy-passthrough")
    if reason:
        variants = ["direct", "asyncio-relay"]
    agent = [PY, str(BENCH / "echo_agent.py")]
    peer_argv = {v: h.peer_argv(v, agent) for v in PEER_VARIANTS}
    peer_env = {v: h.peer_env(v) for v in PEER_VARIANTS}
    variants += [v for v in PEER_VARIANTS if h.skip_reason(v) is None]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stderr_path = h.tmp("latency-proxy-stderr.log")
    with open(stderr_path, "wb") as err:
        for v in variants:
            argv = (
                agent
                if v == "direct"
                else [PY, str(BENCH / "relay_asyncio.py"), *agent]
                if v == "asyncio-relay"
                else peer_argv[v]
                if v in peer_argv
                else h.proxy_argv(s.passthrough_config, agent)
            )
            procs[v] = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err if v != "direct" else None,
                env=peer_env.get(v) or env_with(),
                start_new_session=True,
            )
    clients = {v: LineClient(p) for v, p in procs.items()}
    samples: dict[str, list[float]] = {v: [] for v in variants}
    errors: dict[str, str] = {}
    init = {
        "protocolVersion": 2,
        "info": {"name": "bench-client", "version": "1.0.0"},
        "capabilities": {},
    }
    prompt = {"sessionId": "sess_echo", "prompt": [{"type": "text", "text": "ping"}]}
    warmup = min(200, s.latency_pairs // 5)
    block = max(1, min(500, s.latency_pairs // 10))
    for v, c in clients.items():
        try:
            c.call(_request(0, "initialize", init), timeout=60)
            c.call(_request(1, "session/new", {"cwd": "/workspace", "mcpServers": []}))
            for i in range(warmup):
                c.call(_request(2 + i, "session/prompt", prompt))
        except (OSError, TimeoutError, EOFError) as exc:
            errors[v] = f"{type(exc).__name__}: {exc}"
    rid = 10_000
    done = 0
    cpu_s = dict.fromkeys(variants, 0.0)  # the relay process's own CPU over its blocks
    while done < s.latency_pairs:
        n = min(block, s.latency_pairs - done)
        for v, c in clients.items():  # alternate blocks: direct, proxy, direct, proxy, ...
            if v in errors:
                continue
            out = samples[v]
            before = _proc_cpu_s(procs[v].pid)
            try:
                for _ in range(n):
                    rid += 1
                    req = _request(rid, "session/prompt", prompt)
                    t = time.perf_counter_ns()
                    c.call(req)
                    out.append((time.perf_counter_ns() - t) / 1000)
            except (OSError, TimeoutError, EOFError) as exc:
                errors[v] = f"{type(exc).__name__}: {exc}"
            cpu_s[v] += _proc_cpu_s(procs[v].pid) - before
        done += n
    for proc in procs.values():
        assert proc.stdin is not None and proc.stdout is not None
        with suppress(OSError):
            proc.stdin.close()
        wait_rusage(proc, 30)
        proc.stdout.close()
    rows: list[Row] = []
    pct: dict[str, dict[str, float]] = {}
    for v in ["direct", "asyncio-relay", "proxy-passthrough", *PEER_VARIANTS]:
        if v not in variants:
            why = h.skip_reason(v) if v in PEER_VARIANTS else reason
            rows.append(skipped(3, "rtt-v2", v, title[v], why or "unavailable"))
            continue
        xs = sorted(samples[v])
        if v in errors or not xs:
            why = errors.get(v, "no samples")
            if v != "direct":
                why += f"; proxy stderr: {tail_of(stderr_path)}"
            rows.append(Row(3, "rtt-v2", v, title[v], "error", why))
            continue
        pct[v] = {
            "p50_us": percentile(xs, 50),
            "p99_us": percentile(xs, 99),
            "max_us": xs[-1],
            "pairs": float(len(xs)),
            # CPU of the process in the path (for "direct": the echo agent) per round trip:
            # what each wake-up and hop costs, steadier than wall time on a shared machine.
            "cpu_us_per_rt": cpu_s[v] / len(xs) * 1e6,
        }
        rows.append(Row(3, "rtt-v2", v, title[v], metrics=dict(pct[v])))
        log(f"  s3 {v}: p50 {pct[v]['p50_us']:.0f} us, p99 {pct[v]['p99_us']:.0f} us")
    added_title = "added by the proxy (proxy - direct)"
    if "direct" in pct and "proxy-passthrough" in pct:
        d, p = pct["direct"], pct["proxy-passthrough"]
        rows.append(
            Row(
                3,
                "rtt-v2",
                "added",
                added_title,
                metrics={
                    "p50_us": p["p50_us"] - d["p50_us"],
                    "p99_us": p["p99_us"] - d["p99_us"],
                    "max_us": p["max_us"] - d["max_us"],
                },
                check={"target_p50_us": 100, "target_p99_us": 500},
            )
        )
    else:
        rows.append(skipped(3, "rtt-v2", "added", added_title, reason or "a side failed"))
    # Issue 13: what each peer adds, and the proxy's added latency as a fraction of it.
    for peer in ("asyncio-relay", *PEER_VARIANTS):
        peer_title = title[peer]
        if "direct" not in pct or peer not in pct:
            why = (h.skip_reason(peer) if peer in PEER_VARIANTS else None) or errors.get(
                peer, "a side failed"
            )
            rows.append(skipped(3, "rtt-v2", f"added-{peer}", f"added by {peer_title}", why))
            continue
        d, p = pct["direct"], pct[peer]
        added = {k: p[k] - d[k] for k in ("p50_us", "p99_us", "max_us")}
        ratios: dict[str, float] = {}
        if "proxy-passthrough" in pct:
            q = pct["proxy-passthrough"]
            for k in ("p50_us", "p99_us"):
                if added[k] > 0:
                    ratios[k] = (q[k] - d[k]) / added[k]
        rows.append(
            Row(
                3,
                "rtt-v2",
                f"added-{peer}",
                f"added by {peer_title} (peer - direct)",
                metrics=added,
                ratios=ratios,
            )
        )
    return rows


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` itself (not its children), from /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(sorted_xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    k = max(0, min(len(sorted_xs) - 1, math.ceil(p / 100 * len(sorted_xs)) - 1))
    return sorted_xs[k]


# -- scenario 4 -----------------------------------------------------------------------------
def scenario_memory(h: Harness, log: Callable[[str], None]) -> list[Row]:
    s = h.s
    rows: list[Row] = []
    big = ensure(s.data_dir, "bigline", 2, s.bigline_size, s.seed)
    target_mb = 3 * s.bigline_size / 2**20 + 40
    variants = ["py-line", "py-inject", "proxy-passthrough", "proxy-annotate", *PEER_VARIANTS]
    runs: dict[str, list[Run]] = {v: [] for v in variants}
    for _ in range(s.reps):
        for v in variants:
            if h.skip_reason(v) is None:
                runs[v].append(h.stream(v, big))
    for v in variants:
        title = f"{VARIANT_TITLES[v]}: one {s.bigline_size / 2**20:.0f} MiB line"
        reason = h.skip_reason(v)
        if reason:
            rows.append(skipped(4, "bigline", v, title, reason))
            continue
        ok = [r for r in runs[v] if r.ok]
        if not ok:
            rows.append(
                Row(4, "bigline", v, title, "error", runs[v][0].error if runs[v] else "no run")
            )
            continue
        rss = stats([r.maxrss_kb / 1024 for r in ok])
        assert rss is not None
        check: dict[str, Any] = {"lines_out": [r.out_lines for r in ok], "lines_in": big.lines}
        if v in PEER_VARIANTS:
            check["json"] = [r.json_check for r in ok]
        rows.append(
            Row(
                4,
                "bigline",
                v,
                title,
                metrics={"peak_rss_mb": rss, "line_mb": s.bigline_size / 2**20},
                ratios={"target": {"median": rss["median"] / target_mb, "target_mb": target_mb}},
                check=check,
            )
        )
        log(f"  s4 bigline {v}: peak RSS {rss['median']:.1f} MiB (target {target_mb:.0f} MiB)")

    rows += long_stream_rows(h, log)

    burst = ensure(s.data_dir, "burst", 2, s.burst_size, s.seed)
    configs = {
        "proxy-coalesce-on": h.coalesce_config(s.passthrough_config, True),
        "proxy-coalesce-off": h.coalesce_config(s.passthrough_config, False),
    }
    slow_titles = {
        "py-line": "Python line relay, slow client",
        "proxy-coalesce-on": "acp-proxy, slow client, coalescing on",
        "proxy-coalesce-off": "acp-proxy, slow client, coalescing off",
        "conductor": "TypeScript conductor (no components), slow client",
        "sdk-relay": "Python SDK relay, slow client",
    }
    for v, title in slow_titles.items():
        reason = h.skip_reason("proxy-passthrough" if v.startswith("proxy") else v)
        if reason:
            rows.append(skipped(4, "slow-client", v, title, reason))
            continue
        r = h.stream(
            "proxy-passthrough" if v.startswith("proxy") else v,
            burst,
            config=configs.get(v),
            slow=True,
        )
        if not r.ok:
            rows.append(Row(4, "slow-client", v, title, "error", r.error))
            continue
        rows.append(
            Row(
                4,
                "slow-client",
                v,
                title,
                metrics={
                    "messages_in": float(burst.messages),
                    "messages_out": float(r.out_lines),
                    "bytes_in": float(burst.bytes),
                    "bytes_out": float(r.out_bytes),
                    "peak_rss_mb": r.maxrss_kb / 1024,
                    "wall_s": r.wall_s,
                },
                check={"identical": r.identical, "json": r.json_check},
            )
        )
        peak = r.maxrss_kb / 1024
        log(f"  s4 slow {v}: {burst.messages} -> {r.out_lines} msgs, RSS {peak:.1f} MiB")
    return rows


def long_stream_rows(h: Harness, log: Callable[[str], None]) -> list[Row]:
    """Peak RSS of the proxy (and of the peers) for one pass of a notification stream and for
    ``long_repeat`` passes (~1 GB in the full run): the target is that it does not grow with
    stream length. Row ids: ``proxy-1x``, ``proxy-long``, ``conductor-1x``, ... The Python-SDK
    relay streams the v1 data set: it stops reading at the first batch, and v2's has some."""
    s = h.s
    who = {
        "proxy": ("proxy-passthrough", "acp-proxy, pass-through rules", 2),
        "conductor": ("conductor", "TypeScript conductor (no components)", 2),
        "sdk-relay": ("sdk-relay", "Python SDK relay, notify-v1 (no batches)", 1),
    }
    rows: list[Row] = []
    for prefix, (variant, name, version) in who.items():
        ds = ensure(s.data_dir, "notify", version, s.size, s.seed)
        body = ds.bytes - header_bytes(ds)
        reason = h.skip_reason(variant)
        first: Run | None = None
        for k in (1, s.long_repeat):
            v = f"{prefix}-1x" if k == 1 else f"{prefix}-long"
            total_mb = (ds.bytes + (k - 1) * body) / 1e6
            title = f"{name}: {total_mb:,.0f} MB stream ({k} pass(es))"
            if reason:
                rows.append(skipped(4, "long-stream", v, title, reason))
                continue
            r = h.stream(variant, ds, repeat=k)
            if k == 1:
                first = r
            if not r.ok:
                rows.append(Row(4, "long-stream", v, title, "error", r.error))
                continue
            metrics = {
                "peak_rss_mb": r.maxrss_kb / 1024,
                "stream_mb": total_mb,
                "mb_s": total_mb / r.xfer_s,
            }
            ratios: dict[str, Any] = {}
            if k != 1 and first is not None and first.ok:
                ratios["vs_1x"] = {"median": r.maxrss_kb / first.maxrss_kb}
            rows.append(Row(4, "long-stream", v, title, metrics=metrics, ratios=ratios))
            log(f"  s4 long {v}: {total_mb:,.0f} MB, peak RSS {r.maxrss_kb / 1024:.1f} MiB")
    return rows


def header_bytes(ds: Dataset) -> int:
    """Bytes of the first two lines (the handshake responses) of ``ds``'s agent file."""
    with open(ds.agent_path, "rb") as f:
        return len(f.readline()) + len(f.readline())


# -- scenario 5 -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sk:
        sk.bind(("127.0.0.1", 0))
        return int(sk.getsockname()[1])


@contextmanager
def listening_proxy(
    h: Harness, url: str, ds: Dataset
) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    agent_ru = h.tmp("sock-agent-rusage.json")
    stderr_path = h.tmp("sock-proxy-stderr.log")
    agent = [PY, str(BENCH / "replay_agent.py"), ds.agent_path]
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            h.proxy_argv(h.s.passthrough_config, agent, ["--listen", url]),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env_with(BENCH_AGENT_RUSAGE=str(agent_ru)),
            start_new_session=True,
        )
    try:
        yield proc, stderr_path, agent_ru
    finally:
        if proc.returncode is None:
            with suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            wait_rusage(proc, 15)


def connect(url: str, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> socket.socket | None:
    """Connect to the proxy's listener; None when the proxy exited (e.g. rejected --listen)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        try:
            if url.startswith("unix://"):
                sk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sk.connect(url.removeprefix("unix://"))
            else:
                host, port = url.removeprefix("tcp://").rsplit(":", 1)
                sk = socket.create_connection((host, int(port)), timeout=5)
            sk.settimeout(None)
            return sk
        except OSError:
            time.sleep(0.02)
    return None


def socket_stream(h: Harness, url: str, ds: Dataset) -> tuple[Run | None, str]:
    """One stream over a socket; (None, why) when the proxy does not listen."""
    with listening_proxy(h, url, ds) as (proc, stderr_path, agent_ru):
        sk = connect(url, proc)
        if sk is None:
            proc.poll()
            return None, tail_of(stderr_path, 1)
        with sk:
            feeder = threading.Thread(
                target=lambda: _sock_feed(sk, Path(ds.client_path).read_bytes()), daemon=True
            )
            feeder.start()
            sink = drain(sk.fileno(), h.timeout_for(ds))
        with suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        rx = wait_rusage(proc, 15)
        agent_cpu, _ = read_agent_rusage(agent_ru)
        run = h._result(
            ds,
            sink,
            Exit(0 if rx.code is not None else None, rx.cpu_s, rx.maxrss_kb),
            time.perf_counter(),
            cpu_s=rx.cpu_s - agent_cpu,
        )
        if not run.ok:
            run.error = f"{run.error}; proxy stderr: {tail_of(stderr_path)}"
        return run, ""


def _sock_feed(sk: socket.socket, data: bytes) -> None:
    with suppress(OSError):
        sk.sendall(data)


def scenario_sockets(h: Harness, log: Callable[[str], None]) -> list[Row]:
    # Issue 13: neither peer can listen; one explicit "n/a" row each (or why it is missing).
    peer_rows = [
        skipped(5, "mixed-v2", p, t, h.peer_errors.get(p) or PEER_NO_LISTEN[p])
        for p, t in PEER_TITLES.items()
    ]
    return proxy_socket_rows(h, log) + peer_rows


def proxy_socket_rows(h: Harness, log: Callable[[str], None]) -> list[Row]:
    s = h.s
    titles = {
        "stdio": "acp-proxy over stdio (reference)",
        "tcp": "acp-proxy --listen tcp://127.0.0.1:PORT",
        "unix": "acp-proxy --listen unix:///PATH",
    }
    reason = h.skip_reason("proxy-passthrough")
    if reason:
        return [skipped(5, "mixed-v2", v, t, reason) for v, t in titles.items()]
    ds = ensure(s.data_dir, "mixed", 2, s.size, s.seed)
    probe, why = socket_stream(h, f"tcp://127.0.0.1:{free_port()}", ds)
    if probe is None:
        log(f"  s5: n/a (sockets not available): {why}")
        return [
            skipped(5, "mixed-v2", v, t, f"n/a (sockets not available): {why}")
            for v, t in titles.items()
        ]
    runs: dict[str, list[Run]] = {v: [] for v in titles}
    for _ in range(s.reps):
        runs["stdio"].append(h.stream("proxy-passthrough", ds))
        r, _ = socket_stream(h, f"tcp://127.0.0.1:{free_port()}", ds)
        runs["tcp"].append(r or Run(False, "listener went away"))
        sock_path = s.work_dir / f"acp-{len(runs['unix'])}.sock"
        r, _ = socket_stream(h, f"unix://{sock_path}", ds)
        runs["unix"].append(r or Run(False, "listener went away"))

    def mb_s(r: Run) -> float:
        return ds.bytes / r.xfer_s / 1e6

    rows: list[Row] = []
    for v, t in titles.items():
        ok = [r for r in runs[v] if r.ok]
        if not ok:
            rows.append(
                Row(5, "mixed-v2", v, t, "error", runs[v][0].error if runs[v] else "no run")
            )
            continue
        rows.append(
            Row(
                5,
                "mixed-v2",
                v,
                t,
                metrics={"mb_s": stats([mb_s(r) for r in ok])},
                ratios={"stdio": paired_ratios(runs, v, "stdio", mb_s)},
                check={"identical": [r.identical for r in runs[v]]},
            )
        )
    return rows


# -- output ---------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_mb = None
    with suppress(OSError, ValueError, IndexError):
        mem_mb = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "mem_mb": mem_mb,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
    }


def fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, dict):
        med = x.get("median")
        if med is None:
            return "-"
        if x.get("n", 1) > 1:
            return f"{fmt(med, digits)} [{fmt(x['min'], digits)}..{fmt(x['max'], digits)}]"
        return fmt(med, digits)
    if isinstance(x, float):
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        return f"{x:.{digits}f}"
    return str(x)


def output_check(check: dict[str, Any]) -> str:
    """The "output" cell: identical bytes, same line count, or how many lines came out."""
    ident, lines_out = check.get("identical") or [], check.get("lines_out") or []
    if check.get("json"):  # a peer: checked as JSON, message by message
        texts = [
            json_check_text(jc, check["lines_in"], n)
            for jc, n in zip(check["json"], lines_out, strict=False)
            if jc is not None
        ]
        return " / ".join(dict.fromkeys(texts)) or "-"
    if ident and all(ident):
        return "identical bytes"
    if lines_out and all(n == check["lines_in"] for n in lines_out):
        return "same line count"
    if lines_out:
        return f"{min(lines_out)}-{max(lines_out)} of {check['lines_in']} lines (merged)"
    return "-"


def markdown(result: dict[str, Any]) -> str:
    rows = [r for r in result["rows"]]
    meta = result["meta"]
    m = meta["machine"]
    load = ", ".join(f"{x:.2f}" for x in m["loadavg_start"])
    out = [
        f"## acp-proxy benchmark ({'quick' if meta['quick'] else 'full'} run, {meta['started']})",
        "",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['mem_mb']} MB RAM, {m['os']}, Python "
        f"{m['python']}; load average at start {load}. "
        f"{meta['reps']} interleaved repetition(s); cells are median [min..max]. "
        f"Data sets: {meta['size_bytes'] / 2**20:.2f} MiB each, seed {meta['seed']}.",
        "",
    ]

    def status(r: dict[str, Any]) -> str | None:
        return None if r["status"] == "ok" else f"{r['status']}: {r['reason']}"

    def table(header: list[str], body: list[list[str]]) -> None:
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "|".join("---" for _ in header) + "|")
        out.extend("| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in body)
        out.append("")

    out.append(
        "### 1. Throughput agent → client (ratios: this row ÷ baseline, paired by repetition)"
    )
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != 1:
            continue
        st = status(r)
        mm, rr = r["metrics"], r["ratios"]
        check = output_check(r["check"])
        body.append(
            [r["profile"], r["title"]]
            + (
                [st, "", "", "", "", "", ""]
                if st
                else [
                    fmt(mm["mb_s"]),
                    fmt(mm["msg_s"], 0),
                    fmt(rr.get("py-line"), 2),
                    fmt(rr.get("py-inject"), 2),
                    fmt(rr.get("c-relay"), 3),
                    fmt(rr.get("proxy-passthrough"), 2),
                    check,
                ]
            )
        )
    table(
        [
            "profile",
            "variant",
            "MB/s",
            "msgs/s",
            "vs py line",
            "vs py inject",
            "vs C relay",
            "vs proxy",
            "output",
        ],
        body,
    )

    out.append(
        "### 2. CPU per message (user+sys of the relay, start-up subtracted; lower is better)"
    )
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != 2:
            continue
        st = status(r)
        mm, rr = r["metrics"], r["ratios"]
        body.append(
            [r["profile"], r["title"]]
            + (
                [st, "", "", "", ""]
                if st
                else [
                    fmt(mm["cpu_us_per_msg"], 2),
                    fmt(mm["startup_cpu_ms"], 0),
                    fmt(rr.get("py-line"), 2),
                    fmt(rr.get("py-inject"), 2),
                    fmt(rr.get("proxy-passthrough"), 2),
                ]
            )
        )
    table(
        [
            "profile",
            "variant",
            "µs CPU / msg",
            "start-up CPU ms",
            "vs py line",
            "vs py inject",
            "vs proxy",
        ],
        body,
    )

    out.append("### 3. Round-trip latency, sequential small request/response pairs (µs)")
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != 3:
            continue
        st = status(r)
        mm, rr = r["metrics"], r.get("ratios") or {}
        vs = f"{fmt(rr.get('p50_us'), 2)} / {fmt(rr.get('p99_us'), 2)}" if rr else ""
        body.append(
            [r["title"]]
            + (
                [st, "", "", "", ""]
                if st
                else [
                    fmt(mm["p50_us"], 0),
                    fmt(mm["p99_us"], 0),
                    fmt(mm["max_us"], 0),
                    fmt(mm.get("cpu_us_per_rt"), 0),
                    vs,
                ]
            )
        )
    table(
        [
            "path",
            "p50",
            "p99",
            "max",
            "CPU µs / round trip (the process in the path)",
            "proxy's added ÷ this one's (p50 / p99)",
        ],
        body,
    )
    out.append(
        "Targets for the added latency: p50 ≤ 100 µs, p99 ≤ 500 µs; issue 13: ≤ 0.6 x the "
        "conductor's added p50 and ≤ 0.5 x its p99. The peers renumber request ids (the echo "
        "agent answers the ids it receives)."
    )
    out.append("")

    out.append("### 4. Peak RSS")
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != 4 or r["profile"] != "bigline":
            continue
        st = status(r)
        mm, rr = r["metrics"], r["ratios"]
        body.append(
            [r["title"]]
            + (
                [st, "", ""]
                if st
                else [
                    fmt(mm["peak_rss_mb"]),
                    fmt(rr["target"]["target_mb"], 0),
                    fmt(rr["target"]["median"], 2),
                ]
            )
        )
    table(["long line", "peak RSS MiB", "target MiB (3 x line + 40)", "vs target"], body)
    body = []
    for r in rows:
        if r["scenario"] != 4 or r["profile"] != "slow-client":
            continue
        st = status(r)
        mm = r["metrics"]
        body.append(
            [r["title"]]
            + (
                [st, "", "", "", ""]
                if st
                else [
                    fmt(mm["messages_in"], 0),
                    fmt(mm["messages_out"], 0),
                    fmt(mm["bytes_out"] / 2**20, 1),
                    fmt(mm["peak_rss_mb"]),
                    fmt(mm["wall_s"], 2),
                ]
            )
        )
    table(["slow client", "messages in", "messages out", "MiB out", "peak RSS MiB", "wall s"], body)
    body = []
    for r in rows:
        if r["scenario"] != 4 or r["profile"] != "long-stream":
            continue
        st = status(r)
        mm = r["metrics"]
        body.append(
            [r["title"]]
            + (
                [st, "", ""]
                if st
                else [fmt(mm["peak_rss_mb"]), fmt(mm["mb_s"]), fmt(r["ratios"].get("vs_1x"), 2)]
            )
        )
    table(["long stream", "peak RSS MiB", "MB/s", "RSS vs 1 pass"], body)

    out.append("### 5. Socket transports (mixed-v2, pass-through rules)")
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != 5:
            continue
        st = status(r)
        body.append(
            [r["title"]]
            + ([st, ""] if st else [fmt(r["metrics"]["mb_s"]), fmt(r["ratios"]["stdio"], 2)])
        )
    table(["transport", "MB/s", "vs stdio"], body)
    if result.get("startup"):
        import startup  # bench/startup.py

        out.append("### 6. Start-up (stdin at EOF; the proxy spawns `true`; see bench/startup.py)")
        out.append("")
        out.append(startup.markdown(result["startup"]))
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    s, out_path, scenarios = parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    h = Harness(s)
    machine = machine_info()  # before the runs: its load average is the one at the start
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    try:
        h.build_c()
        h.check_proxy()
        # Issue 13: the peers (installed here unless --quick, which only uses what is there).
        h.peer_errors = setup_peers.ensure(s.build_dir, install=not s.quick)
        for peer, why in h.peer_errors.items():
            if why:
                log(f"peer {peer} skipped: {why}")
        if h.c_error:
            log(f"C relay skipped: {h.c_error}")
        if h.proxy_error:
            log(f"proxy rows skipped: {h.proxy_error}")
        log(f"generating data sets (cached in {s.data_dir})")
        for profile, version in PROFILES:
            ensure(s.data_dir, profile, version, s.size, s.seed)
        rows: list[Row] = []
        if {1, 2} & scenarios:
            log("scenarios 1+2: throughput and CPU")
            rows += scenario_throughput(h, log)
        if 3 in scenarios:
            log("scenario 3: latency")
            rows += scenario_latency(h, log)
        if 4 in scenarios:
            log("scenario 4: memory")
            rows += scenario_memory(h, log)
        if 5 in scenarios:
            log("scenario 5: sockets")
            rows += scenario_sockets(h, log)
        startup_result: dict[str, Any] | None = None
        if 6 in scenarios and h.proxy_error is None:
            log("scenario 6: start-up")
            import startup  # bench/startup.py

            startup_result = startup.run(5 if s.quick else 20, build_dir=s.build_dir)
    finally:
        shutil.rmtree(s.work_dir, ignore_errors=True)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "meta": {
            "started": started,
            "duration_s": time.perf_counter() - t0,
            "quick": s.quick,
            "reps": s.reps,
            "size_bytes": s.size,
            "bigline_bytes": s.bigline_size,
            "burst_bytes": s.burst_size,
            "latency_pairs": s.latency_pairs,
            "long_stream_passes": s.long_repeat,
            "seed": s.seed,
            "machine": machine,
            "proxy_available": h.proxy_error is None,
            "proxy_error": h.proxy_error,
            "c_relay_error": h.c_error,
            "rss_source": "spawn_rusage launcher" if h.launcher else "wait4 (inflated, no cc)",
            "loadavg_end": os.getloadavg(),
        },
        "rows": [r.to_json() for r in rows],
        "startup": startup_result,
    }
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    print(markdown(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
