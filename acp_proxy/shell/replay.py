"""``acp-proxy replay FILE``: the recorded agent, on stdio (issue 11).

Contract: owns the replay's I/O: reads the client's lines on stdin, writes the recorded agent's
frames on stdout (timed by ``--speed``), reports divergence on stderr and in the exit status
(0: the client did what the record says; 1: it diverged or stopped early; 2: usage). What to
write is ``acp_proxy.record.replay``'s job.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from acp_proxy.record.format import RecordError, parse_header, parse_line
from acp_proxy.record.replay import Replayer

EXIT_MATCHED = 0
EXIT_DIVERGED = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acp-proxy replay",
        description="Act as the agent of a record (--record), on stdin/stdout: each client "
        "request gets the response recorded for the request at the same position (with "
        "the client's id); the agent's notifications and requests come in their recorded "
        "order. A client that diverges gets JSON-RPC errors and a line on stderr. Exit "
        "status: 0 matched, 1 diverged or stopped early, 2 usage.",
    )
    parser.add_argument("file", metavar="FILE")
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="X",
        help="recorded timing divided by X (default 1; 0: as fast as possible)",
    )
    return parser


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.speed < 0:
        print("acp-proxy replay: --speed must be >= 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        with open(args.file, "rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        print(f"acp-proxy replay: {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        parse_header(lines[0] if lines else b"")
    except RecordError as exc:
        print(f"acp-proxy replay: {args.file}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    entries = [e for e in (parse_line(line) for line in lines[1:]) if e is not None]
    replayer = Replayer.from_record(entries)
    out, inp = sys.stdout.fileno(), sys.stdin.fileno()
    started = time.monotonic()
    arrived: list[float] = []  # when each matched client message arrived
    reported = 0

    def emit() -> None:
        for step, frame in replayer.ready():
            if args.speed > 0:
                since = arrived[step.need - 1] if step.need else started
                delay = (step.t - replayer.gate_t(step)) / args.speed
                wait = since + delay - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            _write(out, frame + b"\n")

    def report() -> None:
        nonlocal reported
        for problem in replayer.problems[reported:]:
            print(f"acp-proxy replay: {problem}", file=sys.stderr, flush=True)
        reported = len(replayer.problems)

    emit()
    buffer = b""
    while True:
        try:
            chunk = os.read(inp, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            if not line.strip():
                continue
            before = replayer.matched
            replies = replayer.receive(line)
            arrived.extend([time.monotonic()] * (replayer.matched - before))
            for reply in replies:
                _write(out, reply + b"\n")
            report()
            emit()
    if buffer.strip():
        for reply in replayer.receive(buffer):
            _write(out, reply + b"\n")
        emit()
    problems = replayer.finish()
    report()
    return EXIT_DIVERGED if problems else EXIT_MATCHED
