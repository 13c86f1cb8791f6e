"""Peak memory under hostile input: the proxy against its own stated bounds.

Contract: measures and prints; asserts nothing. Each case runs the real proxy
(``python -m acp_proxy``) under ``bench/spawn_rusage``-style accounting (a small launcher forks the
proxy and reports its ``ru_maxrss``), in this tree and, with ``--baseline-ref``, in a checkout of
that ref (default: main before the bounds work), interleaved, and prints the peaks in MiB:

  * ``frame-of-empty-objects``: the agent answers a request with one legal 60 MiB result made of
    20 million ``{}`` (no config: the tracker needs the response's id);
  * ``pending-at-death``: the client sends N requests (``--pending``, default 300,000) to an agent
    that never answers and then exits; every request must be answered with an error (this tree
    runs with ``max_pending_requests`` raised to N, so the table really holds them);
  * ``unfinished-lines``: 12 clients of ``--listen`` each send 60 MiB without a newline.

Every case runs under an address-space cap (``--cap-gib``, default 4) so a runaway run ends
instead of swapping. Usage: ``python bench/bounds.py [--baseline-ref REF] [--pending N]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
DEFAULT_BASELINE = "5a1562d"

LAUNCHER = """
import os, resource, signal, sys
cap = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[3], sys.argv[3:])
signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{usage.ru_maxrss} {status}")
"""

AMPLIFIER = r"""
import sys
sys.stdin.buffer.readline()
sys.stdout.buffer.write(b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2}}\n')
sys.stdout.flush()
sys.stdin.buffer.readline()
n = 20_000_000
sys.stdout.buffer.write(b'{"jsonrpc":"2.0","id":1,"result":[' + b"{}," * (n - 1) + b'{}]}\n')
sys.stdout.flush()
"""

SILENT = r"""
import sys
first = True
for line in sys.stdin.buffer:
    if first:
        sys.stdout.buffer.write(b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2}}\n')
        sys.stdout.flush()
        first = False
    if b'"_bench/exit"' in line:
        break
"""

# Holds its stdin open and never answers: the proxy's listener spawns one per connection.
IDLE = "import sys\nsys.stdin.buffer.read()\n"


def measured(tree: Path, tmp: Path, args: list[str], cap: int) -> list[str]:
    rss = tmp / "rss"
    return [PY, "-c", LAUNCHER, str(rss), str(cap), PY, "-m", "acp_proxy", *args]


def read_rss(tmp: Path) -> tuple[float, int]:
    kb, status = (tmp / "rss").read_text().split()
    return int(kb) / 1024, int(status)


def env_for(tree: Path) -> dict[str, str]:
    # ``python -m`` puts the working directory first on sys.path: every run also gets
    # ``cwd=tree``, or both columns would measure the tree the bench was started from.
    return {**os.environ, "PYTHONPATH": str(tree)}


def case_amplifier(tree: Path, tmp: Path, cap: int) -> str:
    agent = tmp / "amplifier.py"
    agent.write_text(AMPLIFIER)
    cmd = measured(tree, tmp, ["--", PY, str(agent)], cap)
    client = (
        b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2}}\n'
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":{}}\n'
    )
    out = subprocess.run(
        cmd,
        check=False,
        input=client,
        capture_output=True,
        env=env_for(tree),
        cwd=tree,
        timeout=600,
    )
    mib, status = read_rss(tmp)
    answered = out.stdout.count(b'"id":1') == 1
    return f"{mib:.0f} MiB ({'answered' if answered else 'NOT answered'}, status {status})"


def case_pending(tree: Path, tmp: Path, cap: int, n: int, raise_limit: bool) -> str:
    agent = tmp / "silent.py"
    agent.write_text(SILENT)
    args = ["--", PY, str(agent)]
    if raise_limit:
        config = tmp / "pending.yaml"
        config.write_text(f"max_pending_requests: {n}\n")
        args = ["--config", str(config), *args]
    lines = [b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2}}\n']
    lines += [
        b'{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":{"sessionId":"s"}}\n' % i
        for i in range(1, n + 1)
    ]
    lines.append(b'{"jsonrpc":"2.0","method":"_bench/exit"}\n')
    cmd = measured(tree, tmp, args, cap)
    out = subprocess.run(
        cmd,
        check=False,
        input=b"".join(lines),
        capture_output=True,
        env=env_for(tree),
        cwd=tree,
        timeout=900,
    )
    mib, status = read_rss(tmp)
    answered = out.stdout.count(b'"error"')
    return f"{mib:.0f} MiB ({answered}/{n} answered with an error, status {status})"


def case_unfinished(tree: Path, tmp: Path, cap: int) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = tmp / "idle.py"
    agent.write_text(IDLE)
    cmd = measured(tree, tmp, ["--listen", f"tcp://127.0.0.1:{port}", "--", PY, str(agent)], cap)
    proc = subprocess.Popen(cmd, env=env_for(tree), cwd=tree, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        chunk = b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"' + b"a" * (1 << 20)
        socks = []

        sent = [0] * 12

        def send(n: int, sock: socket.socket) -> None:
            try:
                while sent[n] < 60 * (1 << 20):
                    sock.sendall(chunk if sent[n] == 0 else b"a" * (1 << 20))
                    sent[n] += 1 << 20
            except OSError:
                pass

        threads = []
        for n in range(12):
            sock = socket.create_connection(("127.0.0.1", port))
            socks.append(sock)
            t = threading.Thread(target=send, args=(n, sock), daemon=True)
            t.start()
            threads.append(t)
        # The budget pauses the proxy's readers, so the senders block (backpressure): give them
        # a minute in all, then close.
        deadline = time.monotonic() + 60
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        time.sleep(1.0)
        for sock in socks:
            sock.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    mib, status = read_rss(tmp)
    accepted = sum(sent) / (1 << 20)
    return f"{mib:.0f} MiB ({accepted:.0f} MiB accepted of 720 in 60 s, status {status})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline-ref", default=DEFAULT_BASELINE, help="'' to skip the baseline")
    ap.add_argument("--pending", type=int, default=300_000)
    ap.add_argument("--cap-gib", type=float, default=4.0)
    ap.add_argument("--cases", default="1,2,3", help="which cases to run (1,2,3)")
    args = ap.parse_args()
    cap = int(args.cap_gib * 1024**3)
    trees: list[tuple[str, Path]] = [("this tree", ROOT)]
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        if args.baseline_ref:
            base = tmp / "baseline"
            add = ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach"]
            subprocess.run([*add, str(base), args.baseline_ref], check=True)
            trees.append((args.baseline_ref, base))
        try:
            print("| case | " + " | ".join(name for name, _ in trees) + " |")
            print("|---|" + "---|" * len(trees))

            def amplifier(tree: Path, baseline: bool) -> str:
                return case_amplifier(tree, tmp, cap)

            def pending(tree: Path, baseline: bool) -> str:
                return case_pending(tree, tmp, cap, args.pending, raise_limit=not baseline)

            def unfinished(tree: Path, baseline: bool) -> str:
                return case_unfinished(tree, tmp, cap)

            cases: list[tuple[str, Callable[[Path, bool], str]]] = [
                ("one 60 MiB frame of `{}`", amplifier),
                (f"{args.pending:,} pending requests answered at agent death", pending),
                ("12 connections x 60 MiB without a newline", unfinished),
            ]
            wanted = {int(c) for c in args.cases.split(",")}
            for number, (title, run) in enumerate(cases, 1):
                if number not in wanted:
                    continue
                cells = []
                for name, tree in trees:
                    try:
                        cells.append(run(tree, name != "this tree"))
                    except Exception as exc:  # a bench reports, it does not stop
                        cells.append(f"error: {type(exc).__name__}: {exc}"[:120])
                print(f"| {title} | " + " | ".join(cells) + " |", flush=True)
        finally:
            if args.baseline_ref:
                subprocess.run(
                    [
                        "git",
                        "-C",
                        str(ROOT),
                        "worktree",
                        "remove",
                        "--force",
                        str(tmp / "baseline"),
                    ],
                    check=False,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
