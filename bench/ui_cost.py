"""What the live view costs a session that nobody watches, and what watching it costs.

Contract: a short, self-contained measure (not part of ``bench/run.py``'s table). An agent
(``cat`` of the bench's ``mixed`` v2 stream, 58 MiB by default: chunks, tool calls, huge
updates, agent requests, batches; ``bench/generate.py``) writes as fast as it can, through
``acp-proxy`` without a config, to a client that reads everything. Variants, interleaved:

- ``off``: no ``--ui``;
- ``ui``: ``--ui``, nobody looks (the view keeps what it is told, describes nothing);
- ``ui+1``: one observer on ``/events`` all along (the view describes every frame);
- ``ui+50``: 50 observers, 49 reading and one that never reads (what 49 more cost).

The observers accept gzip, as a browser does, and run in a process of their own; they
subscribe before the agent starts writing (the client's first line lets it start). Printed per
variant: the medians of the wall time (the client's first byte received to its last), of the
proxy's CPU (user + system, from ``wait4``: it includes ``cat``'s, the same in every variant)
and its peak RSS; then the ratios ``ui / off`` (the view's own cost, the target: at most
1.15), ``ui+50 / ui+1`` (what observers beyond the first cost) and ``ui+1 / ui`` (what
describing costs, paid only while someone looks). Never a timed assertion: the numbers depend
on the machine (say how loaded it was when you quote them).

The proxies run with their bytecode cached (``PYTHONDONTWRITEBYTECODE`` unset, after one
warm-up run each), as an installed package runs. With ``--baseline-ref REF`` the proxy of git
revision ``REF`` (checked out in a temporary worktree, the built C scanner copied in) runs the
same variants interleaved with this tree's (``base off``...): before and after, same conditions.

``--instructions``: ``off`` and ``ui`` under callgrind instead (with ``--baseline-ref``, the
baseline's too), on ``--size`` and twice that: instructions do not move with the machine's
load, which the times on a shared machine do.

Usage: ``python bench/ui_cost.py [--size 58M] [--repeat 5] [--baseline-ref REF]
[--variants off ui] [--instructions]``.
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from startup import build_accelerator

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
URL = re.compile(rb"live view at (http://\S+)")
# The agent: waits for the client's first line, then writes the whole stream.
AGENT = 'read -r line; exec cat "$1"'
GO = b'{"jsonrpc":"2.0","method":"_bench/go"}\n'
VARIANTS = ("off", "ui", "ui+1", "ui+50")


def observe(url: str, count: int) -> int:
    """The observers' process: ``count`` readers (one of them stuck when there are more than
    one), "ready" once subscribed, then read until the proxy closes them."""
    host_port, _, rest = url.removeprefix("http://").partition("/")
    host, _, port = host_port.rpartition(":")
    request = (
        f"GET /events?since=now&{rest.split('?', 1)[1]} HTTP/1.1\r\nHost: {host_port}\r\n"
        "Accept-Encoding: gzip\r\n\r\n"
    ).encode()
    selector = selectors.DefaultSelector()
    socks = []
    for n in range(count):
        sock = socket.socket()
        if count > 1 and n == 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # never read
        sock.connect((host, int(port)))
        sock.sendall(request)
        socks.append(sock)
        if not (count > 1 and n == 0):
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
    time.sleep(0.3)  # every subscription answered
    print("ready", flush=True)
    while selector.get_map():
        for key, _ in selector.select(0.1):
            reader = key.fileobj
            assert isinstance(reader, socket.socket)
            try:
                data = reader.recv(1 << 20)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                selector.unregister(reader)
    for sock in socks:
        sock.close()
    return 0


def run_once(
    variant: str, stream: Path, size: int, repo: Path, prefix: tuple[str, ...] = ()
) -> tuple[float, tuple[float, float], int]:
    """(wall seconds, the proxy's CPU seconds (user, system), its peak RSS in KiB) of one
    session through the proxy of ``repo`` (``prefix``: what runs it, e.g. valgrind)."""
    argv = [*prefix, sys.executable, "-m", "acp_proxy"]
    if variant != "off":
        argv += ["--ui", "tcp://127.0.0.1:0"]
    argv += ["--", "sh", "-c", AGENT, "agent", str(stream)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(repo)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=repo,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stderr: IO[bytes] = proc.stderr
    observers = None
    if variant != "off":
        line = stderr.readline()
        while (found := URL.search(line)) is None:
            line = stderr.readline()
            assert line, "the proxy exited before serving the live view"
        count = {"ui": 0, "ui+1": 1, "ui+50": 50}[variant]
        if count:
            observers = subprocess.Popen(
                [sys.executable, __file__, "--observe", found.group(1).decode(), str(count)],
                stdout=subprocess.PIPE,
            )
            assert observers.stdout is not None
            assert observers.stdout.readline().strip() == b"ready"
    said: list[bytes] = []
    told = threading.Thread(target=lambda: said.append(stderr.read()), daemon=True)
    told.start()
    proc.stdin.write(GO)
    proc.stdin.flush()
    fd = proc.stdout.fileno()
    got = len(os.read(fd, 1 << 20))
    start = time.perf_counter()  # (without ``--ui`` nothing says when the proxy is up)
    while got < size:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            proc.wait()
            told.join()
            tail = b"".join(said)[-2000:].decode(errors="replace")
            raise SystemExit(f"{variant}: the proxy closed its output early\n{tail}")
        got += len(chunk)
    wall = time.perf_counter() - start
    proc.stdin.close()
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if observers is not None:
        observers.wait(timeout=60)
    return wall, (usage.ru_utime, usage.ru_stime), usage.ru_maxrss


def instructions(args: argparse.Namespace, base: Path | None) -> int:
    """``--instructions``: what ``off`` and ``ui`` execute, counted by callgrind (the proxy
    only: ``cat`` runs natively) on the stream of ``--size`` and on one twice as big; the
    difference, divided by the difference in frames, is per frame (start-up cancelled). With
    ``base``, that revision's proxy is counted the same way."""
    sys.path.insert(0, str(BENCH))
    from generate import ensure, parse_size

    size = parse_size(args.size)
    sets = [ensure(args.data, "mixed", 2, n, 20260) for n in (size, 2 * size)]
    names = ["off", "ui", *(("base off", "base ui") if base is not None else ())]
    counts: dict[tuple[str, int], int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            repo = base if name.startswith("base ") and base is not None else REPO
            variant = name.removeprefix("base ")
            run_once(variant, Path(sets[0].agent_path), sets[0].bytes, repo)  # bytecode cached
            for data in sets:
                out = Path(tmp) / f"{name.replace(' ', '-')}.{data.bytes}"
                tool = ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}")
                run_once(variant, Path(data.agent_path), data.bytes, repo, tool)
                found = re.search(rb"^(?:summary|totals): (\d+)", out.read_bytes(), re.M)
                assert found is not None, "callgrind wrote no total"
                counts[name, data.bytes] = int(found.group(1))
    small, big = sets
    frames = big.lines - small.lines
    messages = big.messages - small.messages
    print(
        f"mixed v2 streams of {small.bytes:,} and {big.bytes:,} bytes ({small.lines:,} and "
        f"{big.lines:,} frames, {small.messages:,} and {big.messages:,} messages), under callgrind"
    )
    per: dict[str, float] = {}
    for name in names:
        first, second = counts[name, small.bytes], counts[name, big.bytes]
        per[name] = (second - first) / frames
        print(
            f"  {name:8} {first:,} and {second:,} instructions: {per[name]:,.0f} per frame "
            f"({(second - first) / messages:,.0f} per message), "
            f"{first - per[name] * small.lines:,.0f} for the rest (start-up, exit)"
        )
    for prefix in ("", "base ") if base is not None else ("",):
        on, off = f"{prefix}ui", f"{prefix}off"
        for data in sets:
            ratio = counts[on, data.bytes] / counts[off, data.bytes]
            print(f"  {on} / {off} on {data.bytes:,} bytes: {ratio:.3f}")
        print(f"  {on} / {off} per frame: {per[on] / per[off]:.3f}")
    return 0


def measure(args: argparse.Namespace, base: Path | None) -> int:
    sys.path.insert(0, str(BENCH))
    from generate import ensure, parse_size

    size = parse_size(args.size)
    data = ensure(args.data, "mixed", 2, size, 20260)
    stream = Path(data.agent_path)
    names = [*args.variants, *(f"base {v}" for v in args.variants if base is not None)]
    repos = {n: (base if n.startswith("base ") and base is not None else REPO) for n in names}
    for repo in {*repos.values()}:  # the bytecode cached, as an installed package has it
        run_once("ui", stream, data.bytes, repo)
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    users: dict[str, list[float]] = {n: [] for n in names}
    rss: dict[str, int] = dict.fromkeys(names, 0)
    for _ in range(args.repeat):
        for name in names:  # interleaved: drift hits every variant alike
            wall, cpu, peak = run_once(name.removeprefix("base "), stream, data.bytes, repos[name])
            walls[name].append(wall)
            cpus[name].append(sum(cpu))
            users[name].append(cpu[0])
            rss[name] = max(rss[name], peak)
    print(
        f"mixed v2 stream: {data.bytes:,} bytes, {data.lines:,} frames "
        f"({data.messages:,} messages), {args.repeat} runs each"
    )
    mid_wall = {n: statistics.median(w) for n, w in walls.items()}
    mid_cpu = {n: statistics.median(c) for n, c in cpus.items()}
    for name in names:
        runs = " ".join(f"{c:.2f}" for c in cpus[name])
        user = statistics.median(users[name])
        print(
            f"  {name:11} wall {mid_wall[name]:6.2f} s  proxy CPU {mid_cpu[name]:5.2f} s "
            f"(user {user:.2f}; runs: {runs})  peak RSS {rss[name] / 1024:.0f} MiB"
        )
    ratios = [("ui / off", "ui", "off"), ("ui+50 / ui+1", "ui+50", "ui+1")]
    ratios += [("ui+1 / ui", "ui+1", "ui"), ("ui+50 / ui", "ui+50", "ui")]
    ratios = [r for r in ratios if r[1] in args.variants and r[2] in args.variants]
    if base is not None:
        ratios += [(f"base {t}", f"base {a}", f"base {b}") for t, a, b in ratios]
    for title, a, b in ratios:
        print(
            f"  {title:18} wall {mid_wall[a] / mid_wall[b]:.3f}  "
            f"proxy CPU {mid_cpu[a] / mid_cpu[b]:.3f}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size", default="58M", help="the stream's size (generate.py's)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--data", default=str(BENCH / "data"), help="where the stream is kept")
    parser.add_argument("--baseline-ref", metavar="REF", help="compare with git revision REF")
    parser.add_argument(
        "--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="(all)"
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="off and ui under callgrind on --size and twice that (slow; say --size 4M)",
    )
    parser.add_argument("--observe", nargs=2, metavar=("URL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.observe:
        return observe(args.observe[0], int(args.observe[1]))
    run = instructions if args.instructions else measure
    if not args.baseline_ref:
        return run(args, None)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        git = ["git", "-C", str(REPO)]
        subprocess.run(
            [*git, "worktree", "add", "-q", "--detach", str(base), args.baseline_ref], check=True
        )
        build_accelerator(base)  # its C scanner, where that tree keeps it
        try:
            return run(args, base)
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(base)], check=True)


if __name__ == "__main__":
    sys.exit(main())
