"""Instructions per message of the whole relay process, counted by callgrind.

Contract: measures and reports, never asserts. Wall and CPU time on a shared machine moved by
2-5 x within one session here, and the annotation target (CPU per message against the orjson
parse+inject relay) sits inside that noise; an instruction count does not move. For each variant
the process in the path runs under ``valgrind --tool=callgrind`` (only that process: the replay
agent the proxy spawns runs natively) on the data set of ``--size`` and on the one twice as big,
and the difference divided by the difference in messages is its instructions per message. The
difference cancels every fixed cost: start-up, and the one-off work a long session pays once
(a value class's ``__init__`` compiled after its first instances, caches filled). Variants:

* ``py-line`` / ``py-inject``: ``bench/relay_min.py line|inject``, the agent file on stdin;
* ``proxy-passthrough`` / ``proxy-annotate``: ``python -m acp_proxy`` with
  ``bench/rules-passthrough.yaml`` / ``bench/rules-annotate.yaml`` in front of
  ``bench/replay_agent.py``, coalescing on (the default) and, with ``-nc``, off.

Instructions are not time (a cache miss or a syscall costs more than its count says), so this
complements ``bench/run.py``'s scenario 2; here a difference of a few percent is real.

``--cpu N``: the same two-size difference with CPU time instead (no valgrind): user + system time
of the process in the path (``wait4``; for the proxy, less what the replay agent reports of its
own), N interleaved repetitions, median [min..max] of the per-repetition ratios to ``py-inject``.
It cancels start-up exactly, which scenario 2's subtraction of a separately measured start-up
cannot (one start-up sample moved by +-40 ms here, +-1.7 us per message on 16 MiB).

``--round-trips N``: the round trip instead: the process in the path (the minimal
asyncio relay ``bench/relay_asyncio.py``, the proxy, and with ``--baseline-ref REF`` the proxy at
git ``REF``) in front of ``bench/echo_agent.py`` under callgrind, driven by N and then 3 N
sequential ``session/prompt`` requests (each waits for its response, as in ``bench/rtt_cpu.py``);
the difference over 2 N is its instructions per round trip, start-up cancelled.

Usage: ``python bench/instructions.py [--size 4M] [--profile mixed] [--cpu N]
[--round-trips N [--baseline-ref REF]]`` (callgrind mode needs valgrind and is slow: the
interpreter runs ~50 x slower under it).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import rtt_cpu
from generate import DEFAULT_SEED, Dataset, ensure, parse_size

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
CONFIGS = {
    "proxy-passthrough": BENCH / "rules-passthrough.yaml",
    "proxy-annotate": BENCH / "rules-annotate.yaml",
}
VARIANTS = (
    "py-line",
    "py-inject",
    "proxy-passthrough",
    "proxy-passthrough-nc",
    "proxy-annotate",
    "proxy-annotate-nc",
)


def _feed_and_drain(proc: subprocess.Popen[bytes], stdin: bytes, hold: bool) -> None:
    """Write ``stdin`` from a thread while reading the output to its end. ``hold``: keep the
    input open until then (a proxy's client: the replay agent waits for the first client line,
    and the proxy must not see its client go before the agent is done); else close it once
    written (a relay copies until its input ends)."""
    assert proc.stdin is not None and proc.stdout is not None

    def feed() -> None:
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.flush()
        if not hold:
            proc.stdin.close()

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    while proc.stdout.read(1 << 20):
        pass
    writer.join(60)
    if hold:
        proc.stdin.close()


def _callgrind(argv: list[str], stdin: bytes, hold: bool, tmp: Path, env: dict[str, str]) -> int:
    """The instructions callgrind counted for the process ``argv`` fed ``stdin`` (kept open
    until its output ends when ``hold``: a proxy's client)."""
    return _under_callgrind(argv, env, ROOT, tmp, lambda proc: _feed_and_drain(proc, stdin, hold))


def _callgrind_round_trips(
    argv: list[str], pairs: int, tmp: Path, env: dict[str, str], cwd: Path
) -> int:
    """The instructions callgrind counted for the process ``argv`` (a relay in front of the echo
    agent) over ``pairs`` sequential round trips after an ``initialize``."""

    return _under_callgrind(argv, env, cwd, tmp, lambda proc: rtt_cpu.round_trips(proc, pairs))


def _under_callgrind(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    tmp: Path,
    drive: Callable[[subprocess.Popen[bytes]], None],
) -> int:
    """Run ``argv`` under callgrind, let ``drive`` talk to it, and return the instructions
    callgrind counted."""
    out = tmp / "callgrind.out"
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    assert proc.stderr is not None
    drive(proc)
    err = proc.stderr.read().decode(errors="replace")
    proc.wait(600)
    found = re.search(r"Collected : (\d+)", err)
    if found is None:
        raise RuntimeError(f"{argv[:4]}: no callgrind total; stderr: {err[-500:]}")
    return int(found.group(1))


def _main_round_trips(args: argparse.Namespace) -> int:
    compileall.compile_dir(str(ROOT / "acp_proxy"), quiet=1)
    found = rtt_cpu.variants(args.baseline_ref)
    names = [n for n in found if n == "asyncio-relay" or n.startswith("proxy")]
    n = args.round_trips
    per_rt: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for variant in names:
            argv, env, cwd = found[variant]
            few = _callgrind_round_trips(argv, n, tmp, env, cwd)
            many = _callgrind_round_trips(argv, 3 * n, tmp, env, cwd)
            per_rt[variant] = (many - few) / (2 * n)
            print(f"  {variant}: {per_rt[variant]:,.0f} instructions/round trip", file=sys.stderr)
    print(f"{n:,} and {3 * n:,} sequential round trips against bench/echo_agent.py")
    print("| process in the path | instructions / round trip | vs asyncio-relay |")
    print("|---|---|---|")
    floor = per_rt.get("asyncio-relay")
    for variant, count in per_rt.items():
        vs = f"{count / floor:.2f}" if floor else "-"
        print(f"| {variant} | {count:,.0f} | {vs} |")
    return 0


def _cpu(argv: list[str], stdin: bytes, hold: bool, tmp: Path, env: dict[str, str]) -> float:
    """User + system seconds of the process ``argv`` itself fed ``stdin`` (its reaped replay
    agent's own report subtracted)."""
    report = tmp / "agent-rusage.json"
    report.unlink(missing_ok=True)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**env, "BENCH_AGENT_RUSAGE": str(report)},
        cwd=ROOT,
    )
    _feed_and_drain(proc, stdin, hold)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    seconds = usage.ru_utime + usage.ru_stime
    if report.exists():
        agent = json.loads(report.read_text())
        seconds -= float(agent["utime"]) + float(agent["stime"])
    return seconds


def _argv(variant: str, ds: Dataset, tmp: Path) -> tuple[list[str], bytes, bool]:
    if variant.startswith("py-"):
        relay = [PY, str(BENCH / "relay_min.py"), variant[3:]]
        return relay, Path(ds.agent_path).read_bytes(), False
    base = variant.removesuffix("-nc")
    config = CONFIGS[base]
    if variant.endswith("-nc"):
        nc = tmp / f"{variant}.yaml"
        nc.write_text(config.read_text() + "\ncoalesce:\n  enabled: false\n")
        config = nc
    agent = [PY, str(BENCH / "replay_agent.py"), ds.agent_path]
    argv = [PY, "-m", "acp_proxy", "--log-level", "warning", "--config", str(config), "--", *agent]
    return argv, Path(ds.client_path).read_bytes(), True


def _prepare(args: argparse.Namespace) -> tuple[Dataset, Dataset, dict[str, str]]:
    """The data set of ``--size`` and the one twice as big, and the environment to run in."""
    small = ensure(args.data_dir, args.profile, args.version, args.size, DEFAULT_SEED)
    ds = ensure(args.data_dir, args.profile, args.version, 2 * args.size, DEFAULT_SEED)
    # Byte-compiled first, as an installed package is (with PYTHONDONTWRITEBYTECODE set, each
    # run would otherwise compile the sources it imports).
    compileall.compile_dir(str(ROOT / "acp_proxy"), quiet=1)
    return small, ds, {**os.environ, "PYTHONPATH": str(ROOT)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=parse_size("4M"))
    ap.add_argument("--profile", default="mixed")
    ap.add_argument("--version", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--data-dir", default=str(BENCH / "data"))
    ap.add_argument("--cpu", type=int, default=0, metavar="N", help="CPU time, N repetitions")
    ap.add_argument("--round-trips", type=int, default=0, metavar="N", help="N and 3 N pairs")
    ap.add_argument("--baseline-ref", help="with --round-trips: the proxy at this git ref too")
    args = ap.parse_args()
    if args.cpu:
        return _main_cpu(args)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing measured", file=sys.stderr)
        return 1
    if args.round_trips:
        return _main_round_trips(args)
    small, ds, env = _prepare(args)
    per_msg: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for variant in args.variants.split(","):
            full = _callgrind(*_argv(variant, ds, tmp), tmp, env)
            half = _callgrind(*_argv(variant, small, tmp), tmp, env)
            per_msg[variant] = (full - half) / (ds.messages - small.messages)
            print(f"  {variant}: {per_msg[variant]:,.0f} instructions/message", file=sys.stderr)
    print(
        f"{args.profile}-v{args.version}: {small.messages:,} and {ds.messages:,} messages"
        f" ({small.bytes:,} and {ds.bytes:,} bytes)"
    )
    print("| variant | instructions / message | vs py-inject | vs py-line |")
    print("|---|---|---|---|")
    for variant, n in per_msg.items():
        inject = per_msg.get("py-inject")
        line = per_msg.get("py-line")
        vs_inject = f"{n / inject:.2f}" if inject else "-"
        vs_line = f"{n / line:.2f}" if line else "-"
        print(f"| {variant} | {n:,.0f} | {vs_inject} | {vs_line} |")
    return 0


def _main_cpu(args: argparse.Namespace) -> int:
    small, ds, env = _prepare(args)
    variants = args.variants.split(",")
    per_msg: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for rep in range(args.cpu):
            for variant in variants:  # interleaved: a slow spell hits every variant alike
                full = _cpu(*_argv(variant, ds, tmp), tmp, env)
                half = _cpu(*_argv(variant, small, tmp), tmp, env)
                us = (full - half) / (ds.messages - small.messages) * 1e6
                per_msg[variant].append(us)
                print(f"  rep {rep + 1} {variant}: {us:.2f} us/message", file=sys.stderr)
    print(
        f"{args.profile}-v{args.version}: {small.messages:,} and {ds.messages:,} messages,"
        f" {args.cpu} repetitions; CPU per message, median [min..max]"
    )
    print("| variant | µs CPU / message | vs py-inject (paired) |")
    print("|---|---|---|")
    base = per_msg.get("py-inject")
    for variant, xs in per_msg.items():
        ratio = "-"
        if base:
            rs = sorted(a / b for a, b in zip(xs, base, strict=True) if b > 0)
            if rs:
                ratio = f"{statistics.median(rs):.2f} [{rs[0]:.2f}..{rs[-1]:.2f}]"
        ys = sorted(xs)
        print(f"| {variant} | {statistics.median(ys):.2f} [{ys[0]:.2f}..{ys[-1]:.2f}] | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
