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
from acp_proxy.record.replay import ClientPlayer, Replayer

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
        "--as-client",
        action="store_true",
        help="the other way round: play the recorded client to AGENT_CMD (after --) and "
        "report where the agent's output differs from the record (request ids and "
        "timestamps normalised); exit 0 when it does not",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="with --as-client: how long the agent may stay silent while the record "
        "expects more from it (default 10)",
    )
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
    argv = list(argv)
    agent_argv: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, agent_argv = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.as_client and not agent_argv:
        parser.error("--as-client needs the agent's command after --")
    if agent_argv and not args.as_client:
        parser.error("an agent command is only used with --as-client")
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
    if args.as_client:
        import anyio

        return anyio.run(_as_client, ClientPlayer.from_record(entries), agent_argv, args)
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


async def _as_client(player: ClientPlayer, agent_argv: list[str], args: argparse.Namespace) -> int:
    """Play the recorded client to a real agent; report the differences (exit 1) or none (0)."""
    import subprocess

    import anyio

    try:
        proc = await anyio.open_process(
            agent_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None
        )
    except OSError as exc:
        print(f"acp-proxy replay: cannot start the agent: {exc}", file=sys.stderr)
        return 127
    assert proc.stdin is not None and proc.stdout is not None
    stdout = proc.stdout
    progress = anyio.Event()
    ended = anyio.Event()
    silent = False

    async def read() -> None:
        nonlocal progress
        buffer = b""
        try:
            async for chunk in stdout:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for line in complete:
                    if line.strip():
                        player.agent_frame(line)
                progress.set()
                progress = anyio.Event()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        if buffer.strip():
            player.agent_frame(buffer)
        ended.set()
        progress.set()

    async with proc, anyio.create_task_group() as tg:
        tg.start_soon(read)
        last_t = 0.0
        while True:
            for step_t, frame in _timed(player):
                if args.speed > 0 and step_t > last_t:
                    await anyio.sleep((step_t - last_t) / args.speed)
                last_t = max(last_t, step_t)
                await proc.stdin.send(frame + b"\n")
            if not player.steps or ended.is_set():
                break
            waiting = progress
            with anyio.move_on_after(args.timeout):
                await waiting.wait()
            if not waiting.is_set():
                silent = True
                break
        await proc.stdin.aclose()
        # The rest of what the agent writes, until it closes its output.
        if not silent:
            with anyio.move_on_after(args.timeout):
                await ended.wait()
        if not ended.is_set():
            player.differences.append(
                f"the agent wrote nothing for {args.timeout:g} s while the record expects more"
                if silent
                else f"the agent did not close its output within {args.timeout:g} s"
            )
            proc.kill()
        tg.cancel_scope.cancel()
    differences = player.finish()
    for difference in differences:
        print(f"acp-proxy replay: {difference}", file=sys.stderr)
    if not differences:
        print(
            f"acp-proxy replay: the agent wrote the {player.got} messages of the record",
            file=sys.stderr,
        )
    return EXIT_DIVERGED if differences else EXIT_MATCHED


def _timed(player: ClientPlayer) -> list[tuple[float, bytes]]:
    """The frames due now, each with the recorded time of its step."""
    times = [step.t for step in player.steps]
    frames = player.due()
    return list(zip(times[: len(frames)], frames, strict=True))
