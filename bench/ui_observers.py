"""The live view under load: a session's throughput with 50 observers, one of them stuck.

Contract: a short, self-contained measure (not part of ``bench/run.py``'s table). One run plays
the same stdio session several times, interleaved, through ``acp-proxy`` with the bundled rules
and ``bench/echo_agent.py``: N pipelined requests from the client, each answered at once, so the
proxy relays 2N frames (half of them through the rules). Three variants:

- ``off``: no ``--ui`` (the hot path as it is);
- ``ui``: ``--ui``, no observer attached;
- ``ui+50``: ``--ui`` with 50 observers on ``/events``: 49 read everything (one thread with a
  selector, so the readers cost the machine little), one never reads (a 4 KiB receive buffer).
  They accept gzip as a browser does (the bytes they count are compressed); ``--identity``:
  they do not, as ``curl -N`` does not.

It prints the median wall time of each variant and the ratios ``ui+50 / ui`` (what observers
cost a session; the target is "within 10 % of no observer") and ``ui / off`` (what the view itself
costs), plus the proxy's peak RSS per variant. Never a timed assertion: the numbers depend on
the machine (say how loaded it was when you quote them).

With ``--baseline-ref REF`` the proxy of git revision ``REF`` (checked out in a temporary
worktree) runs the same three variants, interleaved with this tree's (``base off``, ``base ui``,
``base ui+50``): a before/after comparison taken in the same conditions.

Usage: ``python bench/ui_observers.py [--requests N] [--repeat R] [--baseline-ref REF]``.
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

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "acp_proxy" / "data" / "default.yaml"
URL = re.compile(rb"live view at (http://\S+)")


def _requests(n: int) -> bytes:
    lines = [
        b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2}}',
    ]
    lines += [
        b'{"jsonrpc":"2.0","id":%d,"method":"_bench/echo","params":{"n":%d,"text":"%s"}}'
        % (i, i, b"payload " * 8)
        for i in range(1, n + 1)
    ]
    return b"\n".join(lines) + b"\n"


class Observers:
    """49 readers on one selector thread, and one socket that never reads."""

    def __init__(self, url: str, count: int) -> None:
        host_port, _, rest = url.removeprefix("http://").partition("/")
        host, _, port = host_port.rpartition(":")
        # As a browser asks (unless --identity): the server then sends the compressed blocks.
        accept = "" if os.environ.get("UI_BENCH_IDENTITY") else "Accept-Encoding: gzip\r\n"
        self.request = (
            f"GET /events?since=now&{rest.split('?', 1)[1]} HTTP/1.1\r\nHost: {host_port}\r\n"
            f"{accept}\r\n"
        ).encode()
        self.bytes = 0
        self.selector = selectors.DefaultSelector()
        self.socks = []
        for _ in range(count - 1):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(self.request)
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)
            self.socks.append(sock)
        self.stuck = socket.socket()
        self.stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.stuck.connect((host, int(port)))
        self.stuck.sendall(self.request)
        self.stop = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stop:
            for key, _ in self.selector.select(0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.selector.unregister(sock)
                    continue
                self.bytes += len(data)

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        for sock in [*self.socks, self.stuck]:
            sock.close()


def observe(url: str) -> int:
    """The observers' process: subscribe 50, say "ready", read until the proxy closes them,
    print the bytes the 49 readers received."""
    observers = Observers(url, 50)
    time.sleep(0.3)  # every subscription answered
    print("ready", flush=True)
    while observers.selector.get_map():
        time.sleep(0.05)
    observers.close()
    print(observers.bytes, flush=True)
    return 0


def _peak_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_once(
    variant: str, requests: bytes, n: int, repo: Path = REPO
) -> tuple[float, tuple[float, float], int, int]:
    """(wall seconds from the first request to the last response, the proxy's CPU seconds
    (user, system), its peak RSS KiB, bytes the reading observers got); ``repo``: whose proxy
    runs."""
    variant = variant.removeprefix("base ")
    argv = [sys.executable, "-m", "acp_proxy", "--config", str(RULES)]
    if variant != "off":
        argv += ["--ui", "tcp://127.0.0.1:0"]
    argv += ["--", sys.executable, str(REPO / "bench" / "echo_agent.py")]
    env = dict(os.environ, PYTHONPATH=str(repo))
    # Run from ``repo``: ``python -m`` puts the working directory first on the path.
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
    observers: subprocess.Popen[bytes] | None = None
    if variant != "off":
        line = stderr.readline()
        while not URL.search(line):
            line = stderr.readline()
            assert line, "the proxy exited before serving the live view"
        found = URL.search(line)
        assert found is not None
        if variant == "ui+50":
            # In a process of its own: the readers must not share the client's interpreter.
            observers = subprocess.Popen(
                [sys.executable, __file__, "--observe", found.group(1).decode()],
                stdout=subprocess.PIPE,
            )
            assert observers.stdout is not None
            assert observers.stdout.readline().strip() == b"ready"
    threading.Thread(target=lambda: [stderr.read()], daemon=True).start()
    start = time.perf_counter()

    def feed() -> None:
        assert proc.stdin is not None
        proc.stdin.write(requests)
        proc.stdin.flush()

    threading.Thread(target=feed, daemon=True).start()
    for _ in range(n + 1):
        assert proc.stdout.readline(), "the proxy closed its output early"
    wall = time.perf_counter() - start
    rss = _peak_rss_kib(proc.pid)
    proc.stdin.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = (usage.ru_utime, usage.ru_stime)
    got = 0
    if observers is not None:
        assert observers.stdout is not None
        got = int(observers.stdout.readline() or 0)  # its reading ends with the proxy
        observers.wait(timeout=30)
    return wall, cpu, rss, got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-ref", metavar="REF", help="compare with git revision REF")
    parser.add_argument(
        "--identity", action="store_true", help="observers that do not accept gzip (curl -N)"
    )
    parser.add_argument("--observe", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.observe:
        return observe(args.observe)
    if args.identity:
        os.environ["UI_BENCH_IDENTITY"] = "1"  # read by the observers' process
    if args.baseline_ref:
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp) / "base"
            git = ["git", "-C", str(REPO)]
            subprocess.run(
                [*git, "worktree", "add", "-q", "--detach", str(base), args.baseline_ref],
                check=True,
            )
            # The C scanner built in the base tree too (where that tree keeps it), so that only the
            # revisions differ.
            build_accelerator(base)
            try:
                return measure(args, base)
            finally:
                subprocess.run([*git, "worktree", "remove", "--force", str(base)], check=True)
    return measure(args, None)


def measure(args: argparse.Namespace, base: Path | None) -> int:
    requests = _requests(args.requests)
    walls: dict[str, list[float]] = {"off": [], "ui": [], "ui+50": []}
    if base is not None:
        walls.update({"base off": [], "base ui": [], "base ui+50": []})
    cpus: dict[str, list[float]] = {v: [] for v in walls}
    users: dict[str, list[float]] = {v: [] for v in walls}
    systems: dict[str, list[float]] = {v: [] for v in walls}
    rss: dict[str, int] = dict.fromkeys(walls, 0)
    observed: dict[str, list[int]] = {v: [] for v in walls if v.endswith("ui+50")}
    for _ in range(args.repeat):
        for variant, times in walls.items():  # interleaved: drift hits every variant alike
            repo = base if base is not None and variant.startswith("base ") else REPO
            wall, cpu, peak, got = run_once(variant, requests, args.requests, repo)
            times.append(wall)
            cpus[variant].append(sum(cpu))
            users[variant].append(cpu[0])
            systems[variant].append(cpu[1])
            rss[variant] = max(rss[variant], peak)
            if variant in observed:
                observed[variant].append(got // 49)
    median = {v: statistics.median(w) for v, w in walls.items()}
    cpu_median = {v: statistics.median(c) for v, c in cpus.items()}
    frames = 2 * (args.requests + 1)
    print(f"{args.requests} requests ({frames} frames relayed), {args.repeat} runs each")
    for variant, value in median.items():
        print(
            f"  {variant:10} median {value:.3f} s  {frames / value:,.0f} frames/s  "
            f"proxy CPU {cpu_median[variant]:.2f} s (user {statistics.median(users[variant]):.2f}"
            f" sys {statistics.median(systems[variant]):.2f})  "
            f"peak RSS {rss[variant] / 1024:.1f} MiB"
        )
    ratios = [("ui+50 / ui ", "ui+50", "ui"), ("ui / off   ", "ui", "off")]
    if base is not None:
        ratios += [(f"base {n}", f"base {a}", f"base {b}") for n, a, b in ratios]
    for name, a, b in ratios:
        print(
            f"  {name} wall {median[a] / median[b]:.3f}  proxy CPU "
            f"{cpu_median[a] / cpu_median[b]:.3f}"
        )
    for variant, per_run in observed.items():
        # Less than the others in a run: its readers were cut off (they fell too far behind).
        runs = ", ".join(f"{g:,}" for g in per_run)
        print(f"  {variant}: bytes each reading observer received (mean per run): {runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
