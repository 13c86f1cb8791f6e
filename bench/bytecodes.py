"""Bytecodes per round trip of the proxy, function by function.

Contract: measures and reports, never asserts. ``bench/instructions.py --round-trips`` says how
many instructions a round trip costs the process in the path; this says where they go in the
Python code. The proxy runs in front of ``bench/echo_agent.py`` with a ``sys.settrace`` opcode
counter installed before it starts (``--run-traced``: this file re-run as the proxy), is driven
by N and then 3 N sequential ``session/prompt`` requests (each waits for its response, as in
``bench/rtt_cpu.py``), and the difference over 2 N is each function's bytecodes per round trip,
start-up cancelled. A bytecode count does not move with the machine's load, though the tracer
makes the proxy ~30 x slower: the proxy's own code counts the same in every run (the lane's
steps do not depend on timing, bar a read that finds two lines at once, which sequential round
trips never send); asyncio's loop moves by a few bytecodes per round trip (a pending timer,
such as the reaper's 5 s one, makes some loop passes longer).

Usage: ``python bench/bytecodes.py [--round-trips N] [--top K] [--config FILE]...`` prints two
Markdown tables: the proxy's K busiest functions with their module and bytecodes per round trip,
and the totals of the proxy and of the minimal asyncio relay (``bench/relay_asyncio.py``,
traced the same way), each split into asyncio's own loop (what any asyncio program pays per
wake-up) and the rest. Each ``--config`` adds a column: the proxy with that config file (a
policy beside the rules, say), traced the same way.
"""

from __future__ import annotations

import argparse
import collections
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import rtt_cpu

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
STDLIB_LOOP = ("asyncio", "selectors")  # the event loop's own modules


def _run_traced(out: str, target: str, argv: list[str]) -> None:
    """Run ``target`` (``acp_proxy``: ``python -m acp_proxy``; else a script's path) with
    ``argv`` in this process with an opcode counter; at exit write
    ``count<TAB>file<TAB>function`` lines to ``out``."""
    import atexit

    counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def opcode(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            counts[(code.co_filename, code.co_qualname)] += 1
        return opcode

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return opcode

    def dump() -> None:
        with open(out, "w") as f:
            for (filename, name), n in counts.items():
                f.write(f"{n}\t{filename}\t{name}\n")

    atexit.register(dump)
    sys.argv = [target, *argv]
    sys.settrace(tracer)
    if target == "acp_proxy":
        runpy.run_module("acp_proxy", run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")


def _counts(
    target: str, pairs: int, tmp: Path, config: str | None = None
) -> dict[tuple[str, str], int]:
    out = tmp / f"counts-{pairs}.tsv"
    agent = [PY, str(BENCH / "echo_agent.py")]
    argv = [PY, __file__, "--run-traced", str(out), target]
    options = ["--log-level", "warning", *(["--config", config] if config else [])]
    argv += [*options, "--", *agent] if target == "acp_proxy" else agent
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, env=env)
    rtt_cpu.round_trips(proc, pairs)
    if proc.wait(600) != 0:
        raise RuntimeError(f"the traced proxy exited with {proc.returncode}")
    found: dict[tuple[str, str], int] = {}
    for line in out.read_text().splitlines():
        n, filename, name = line.split("\t")
        found[(filename, name)] = int(n)
    return found


def _module(filename: str) -> str:
    path = Path(filename)
    if path.is_relative_to(ROOT):
        return ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return path.stem if path.parent.name != "asyncio" else f"asyncio.{path.stem}"


def main() -> int:
    if len(sys.argv) > 3 and sys.argv[1] == "--run-traced":
        _run_traced(sys.argv[2], sys.argv[3], sys.argv[4:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--round-trips", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--config", action="append", default=[], help="also the proxy with this")
    args = ap.parse_args()
    n = args.round_trips
    rows = _per_round_trip("acp_proxy", n)
    relay = _per_round_trip(str(BENCH / "relay_asyncio.py"), n)
    configured = {c: _per_round_trip("acp_proxy", n, c) for c in args.config}
    print(f"{n:,} and {3 * n:,} sequential round trips against bench/echo_agent.py")
    print("| module | function | bytecodes / round trip |")
    print("|---|---|---|")
    for v, (filename, func) in rows[: args.top]:
        print(f"| {_module(filename)} | {func} | {v:,.1f} |")
    print()
    columns = [("acp-proxy", rows)]
    columns += [(f"acp-proxy --config {Path(c).name}", r) for c, r in configured.items()]
    columns.append(("minimal asyncio relay (relay_asyncio.py)", relay))
    totals = [_totals(r) for _, r in columns]
    print("| totals per round trip | " + " | ".join(name for name, _ in columns) + " |")
    print("|---|" + "---|" * len(columns))
    print("| all | " + " | ".join(f"**{t:,.0f}**" for t, _ in totals) + " |")
    print(
        f"| asyncio's loop ({', '.join(STDLIB_LOOP)}) | "
        + " | ".join(f"{lp:,.0f}" for _, lp in totals)
        + " |"
    )
    print(
        "| the rest (the program's own) | "
        + " | ".join(f"{t - lp:,.0f}" for t, lp in totals)
        + " |"
    )
    return 0


def _per_round_trip(
    target: str, n: int, config: str | None = None
) -> list[tuple[float, tuple[str, str]]]:
    """Each function's bytecodes per round trip (those above zero), largest first."""
    with tempfile.TemporaryDirectory() as name:
        few = _counts(target, n, Path(name), config)
        many = _counts(target, 3 * n, Path(name), config)
    per_rt = {k: (many.get(k, 0) - few.get(k, 0)) / (2 * n) for k in set(few) | set(many)}
    return sorted(((v, k) for k, v in per_rt.items() if v > 0), reverse=True)


def _totals(rows: list[tuple[float, tuple[str, str]]]) -> tuple[float, float]:
    """All bytecodes per round trip, and those of asyncio's loop."""
    loop = sum(v for v, (f, _) in rows if _module(f).startswith(STDLIB_LOOP))
    return sum(v for v, _ in rows), loop


if __name__ == "__main__":
    sys.exit(main())
