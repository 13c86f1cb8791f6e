"""Instructions per message of the whole relay process, counted by callgrind (issue 13).

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
complements ``bench/run.py``'s scenario 2, which stays the measure of record; here a difference of
a few percent is real. Usage: ``python bench/instructions.py [--size 4M] [--profile mixed]``
(needs valgrind; slow: the interpreter runs ~50 x slower under callgrind).
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

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


def _callgrind(argv: list[str], stdin: bytes, hold: bool, tmp: Path, env: dict[str, str]) -> int:
    """The instructions callgrind counted for the process ``argv`` fed ``stdin`` (kept open
    until its output ends when ``hold``: a proxy's client)."""
    out = tmp / "callgrind.out"
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    def feed() -> None:
        # Keep the client side open until the output ends (the replay agent waits for the first
        # client line, and the proxy must not see its client go before the agent is done).
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.flush()
        if not hold:
            proc.stdin.close()  # a relay copies until its input ends

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    while proc.stdout.read(1 << 20):
        pass
    writer.join(60)
    if hold:
        proc.stdin.close()
    err = proc.stderr.read().decode(errors="replace")
    proc.wait(600)
    found = re.search(r"Collected : (\d+)", err)
    if found is None:
        raise RuntimeError(f"{argv[:4]}: no callgrind total; stderr: {err[-500:]}")
    return int(found.group(1))


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=parse_size("4M"))
    ap.add_argument("--profile", default="mixed")
    ap.add_argument("--version", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--data-dir", default=str(BENCH / "data"))
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing measured", file=sys.stderr)
        return 1
    small = ensure(args.data_dir, args.profile, args.version, args.size, DEFAULT_SEED)
    ds = ensure(args.data_dir, args.profile, args.version, 2 * args.size, DEFAULT_SEED)
    # Byte-compiled first, as an installed package is (with PYTHONDONTWRITEBYTECODE set, each
    # run would otherwise compile the sources it imports).
    compileall.compile_dir(str(ROOT / "acp_proxy"), quiet=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
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


if __name__ == "__main__":
    sys.exit(main())
