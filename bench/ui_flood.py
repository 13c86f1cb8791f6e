"""The live view's cost to a session that relays many small notifications.

Contract: a short, self-contained measure (not part of ``bench/run.py``'s table). An agent
writes N small ``session/update`` notifications (about 150 bytes each) as fast as it can; the
client reads them all through ``acp-proxy`` (passthrough, no config). Variants: ``off`` (no
``--ui``) and ``ui`` (``--ui``, no observer); ``--observe`` adds ``ui+1``: one observer reading
``/events`` all along. Prints each variant's wall time (proxy start to the client's last
frame), the peak RSS of the proxy's process tree (``wait4``), and for the ``ui`` variants how
many frames the view counted lost (from ``/history`` after the flood). Never a timed
assertion: the numbers depend on the machine.

``--baseline-tree DIR`` runs the proxy of another source tree too (``git archive REV acp_proxy |
tar -x -C DIR``), interleaved: a before/after comparison in the same conditions.

Usage: ``python bench/ui_flood.py [--frames N] [--repeat R] [--observe] [--baseline-tree DIR]``.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import orjson

URL = re.compile(rb"live view at (http://\S+)")
AGENT = r"""
import sys
n = int(sys.argv[1])
line = (b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s",'
        b'"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text",'
        b'"text":"%d"}}}}\n')
out = sys.stdout.buffer
batch = 1000
for start in range(0, n, batch):
    out.write(b"".join(line % i for i in range(start, min(n, start + batch))))
out.flush()
sys.stdin.buffer.read()
"""


def _get(url: str, target: str) -> bytes:
    parts = urlsplit(url)
    token = url.split("token=")[1]
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(
            f"GET {target}{'&' if '?' in target else '?'}token={token} HTTP/1.1\r\n"
            f"Host: {parts.netloc}\r\n\r\n".encode()
        )
        data = b""
        while chunk := sock.recv(1 << 20):
            data += chunk
    return data.split(b"\r\n\r\n", 1)[1]


def _observe(url: str, stop: threading.Event, got: list[int]) -> None:
    parts = urlsplit(url)
    token = url.split("token=")[1]
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(f"GET /events?token={token} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                chunk = sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                break
            got[0] += len(chunk)


def run(frames: int, variant: str, tree: str | None = None) -> tuple[float, int, int | None]:
    """One session through the proxy of ``tree`` (a source tree; ``None``: this one)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    argv = [sys.executable, "-m", "acp_proxy"]
    if variant != "off":
        argv += ["--ui", "tcp://127.0.0.1:0"]
    argv += ["--", sys.executable, "-c", AGENT, str(frames)]
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
    url = None
    stop = threading.Event()
    got = [0]
    if variant != "off":
        text = b""
        while (found := URL.search(text)) is None:
            text += proc.stderr.readline()
        url = found.group(1).decode()
        if variant == "ui+1":
            threading.Thread(target=_observe, args=(url, stop, got), daemon=True).start()
    seen = 0
    fd = proc.stdout.fileno()
    while seen < frames:
        chunk = os.read(fd, 1 << 20)
        assert chunk, "the proxy closed its output early"
        seen += chunk.count(b"\n")
    wall = time.monotonic() - start
    lost = None
    if url is not None:
        time.sleep(0.5)  # the view publishes in batches
        lost = 0
        for line in _get(url, "/history").splitlines():
            event = orjson.loads(line)
            if event.get("event") == "lost":
                lost += event["frames"]
            elif event.get("event") == "truncated":
                lost += event["lost"]
    stop.set()
    proc.stdin.close()
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return wall, usage.ru_maxrss // 1024, lost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--observe", action="store_true")
    parser.add_argument(
        "--baseline-tree", metavar="DIR", help="also run the proxy of this source tree"
    )
    args = parser.parse_args(argv)
    variants = ["off", "ui", *(["ui+1"] if args.observe else [])]
    if args.baseline_tree:
        variants += [f"base {v}" for v in variants]
    walls: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.repeat):
        for variant in variants:
            base, _, kind = variant.rpartition(" ")
            tree = args.baseline_tree if base else None
            wall, peak_mb, lost = run(args.frames, kind, tree)
            walls[variant].append(wall)
            print(f"{variant:10} {wall:7.2f} s  peak RSS {peak_mb} MB  lost in the view: {lost}")
    for variant in variants:
        print(f"median {variant:10} {statistics.median(walls[variant]):7.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
