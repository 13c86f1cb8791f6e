"""The benchmark's harness: settings, spawning a variant, streaming a data set through it.

Contract: owns running one variant of the benchmark and measuring it: the settings of a run,
building the C relay and the rusage launcher, the command line of every variant, one stream
through a variant into a fast or slow client (bytes, lines, CRC, CPU, peak RSS, the peers'
message-by-message JSON check), and reaping every process it started (a deadline on each). It
measures; it never asserts a timing and never formats a report.
"""

from __future__ import annotations

import compileall
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
import relay_min
import setup_peers
from generate import Dataset
from variants import PEER_VARIANTS

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable


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
    baseline_ref: str | None = None  # scenario 8: also the proxy at this git ref
    # Scenarios 1 and 2: the profiles (None: all) and the variants (None: all) to run, and
    # whether to measure each variant's start-up CPU (scenario 2 subtracts it).
    profiles: tuple[tuple[str, int], ...] | None = None
    variants: tuple[str, ...] | None = None
    startup_cpu: bool = True


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
        readable = time.perf_counter()
        data = os.read(fd, read_size)
        now = time.perf_counter()
        if not data:
            break
        if sink.first is None:
            sink.first = readable  # (so that an output read at once still takes some time)
        # The last byte's arrival, not EOF's: a proxy whose agent exited keeps its output open
        # a while for requests the client may still send (runtime.answer_after_death), which
        # is no part of the transfer.
        sink.last = now
        sink.bytes += len(data)
        sink.lines += data.count(b"\n")
        sink.crc = zlib.crc32(data, sink.crc)
        if keep is not None:
            keep.write(data)
        if sleep_s:
            time.sleep(sleep_s)
    if sink.last is None:
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
    xfer_s: float = math.nan  # first output byte to the last one
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
        self.peer_errors: dict[str, str | None] = {}  # peer -> why it is skipped
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
        if variant.endswith("-policy"):
            return self.policy_config(self.proxy_config(variant.removesuffix("-policy")))
        return {
            "proxy-passthrough": self.s.passthrough_config,
            "proxy-annotate": self.s.annotate_config,
            "proxy-example": self.s.example_config or self.s.annotate_config,
        }[variant]

    def policy_config(self, base: Path) -> Path:
        """``base`` plus the team policy of ``bench/policy-team.yaml``, its audit file in the
        work directory (one per configuration, appended to run after run)."""
        path = self.s.work_dir / f"{base.stem}-policy.yaml"
        if not path.exists():
            audit = self.s.work_dir / f"{base.stem}-audit.jsonl"
            policy = (BENCH / "policy-team.yaml").read_text()
            policy = policy.replace("  mode: enforce\n", f"  mode: enforce\n  audit: {audit}\n")
            path.write_text(base.read_text() + "\n" + policy)
        return path

    def coalesce_config(self, base: Path, enabled: bool) -> Path:
        """``base`` plus an explicit ``coalesce: {enabled: ...}`` section (coalescing on or off)."""
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

    # -- the peers -------------------------------------------------------------------------------
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
