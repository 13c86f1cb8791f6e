"""``acp-proxy replay FILE``: the recorded agent, on stdio.

Contract: owns the replay's I/O: reads the client's lines on stdin, writes the recorded agent's
frames on stdout (timed by ``--speed``), reports divergence on stderr and in the exit status (0:
the client did what the record says; 1: it diverged or stopped early; 2: usage). What to write is
``acp_proxy.record.replay``'s job; the record is read as it is needed (twice: once per side,
``acp_proxy.shell.record.recordread``), one session of the file (``--session N``), unusable lines
reported once and skipped. Everything it prints from the record is made visible.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.cli import flags
from acp_proxy.config import DEFAULT_MAX_FRAME_BYTES
from acp_proxy.record.escape import visible
from acp_proxy.record.format import is_header
from acp_proxy.record.replay import AgentStep, ClientPlayer, Replayer
from acp_proxy.shell.record.recordread import Problems, open_record, read_record
from acp_proxy.shell.streams.transports import STREAM_ERRORS
from acp_proxy.wire.framing import Line, LineSplitter, Oversize

PROG = "acp-proxy replay"

EXIT_MATCHED = 0
EXIT_DIVERGED = 1
EXIT_USAGE = 2
_READ = 65536


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
    flags.add(
        parser,
        "--session",
        "the Nth session of the file (from 1; `acp-proxy show --list FILE` lists them); needed "
        "when the file holds more than one",
    )
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
    flags.add(
        parser,
        "--max-frame-bytes",
        "longest line read from the other side, as the proxy's option (default 64MiB): a "
        "longer line is not read; a request in it gets a -32600 error and the replay counts "
        "as diverged",
        default=DEFAULT_MAX_FRAME_BYTES,
    )
    return parser


def read_lines(fd: int, splitter: LineSplitter) -> Iterator[Line | Oversize]:
    """The lines read from ``fd`` until EOF (or a read error), split by ``splitter``: a line
    spread over many reads is joined once, and a line over its limit is never held."""
    while True:
        try:
            chunk = os.read(fd, _READ)
        except OSError:
            chunk = b""
        if not chunk:
            yield from splitter.end()
            return
        yield from splitter.feed(chunk)


def _count_sessions(path: str, name: str) -> int | str:
    """How many sessions the record at ``path`` holds (every unusable line reported here,
    once, as in ``name``), or why it is not a record."""
    stream = open_record(path, follow=False, prog=PROG)
    if isinstance(stream, str):
        return stream
    problems = Problems(name, PROG)
    with stream:
        record = read_record(stream, follow=False, problems=problems)
        if isinstance(record, str):
            return record
        count = 0
        for info, _entry in record:
            count = info.number
    problems.close()
    return count


class _Session:
    """The lines of one session of a record file, read from the file again on each ``iter``
    (the replay reads each side as it needs it); the problems were reported by
    ``_count_sessions``."""

    def __init__(self, path: str, number: int) -> None:
        self.path = path
        self.number = number

    def __iter__(self) -> Iterator[JsonObject]:
        stream = open_record(self.path, follow=False, prog=PROG)
        if isinstance(stream, str):
            print(f"{PROG}: {visible(self.path)}: {stream}", file=sys.stderr)
            return
        with stream:
            record = read_record(
                stream, follow=False, problems=Problems(self.path, PROG, quiet=True)
            )
            if isinstance(record, str):
                return
            for info, entry in record:
                if info.number > self.number:
                    return
                if info.number == self.number and not is_header(entry):
                    yield entry


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
    with contextlib.ExitStack() as stack:
        path = _rereadable(args.file, stack)
        return _replay(args, agent_argv, path)


def _rereadable(path: str, stack: contextlib.ExitStack) -> str:
    """``path``, or a private temporary copy of it when it cannot be read more than once (a
    pipe, ``<(...)``): the replay reads the record once per side."""
    try:
        fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return path  # reported by the first read
    if not fifo:
        return path
    directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="acp-proxy-replay-"))
    copy = os.path.join(directory, "record.jsonl")
    with open(path, "rb") as source, open(copy, "xb") as target:
        shutil.copyfileobj(source, target, 1 << 20)
    return copy


def _replay(args: argparse.Namespace, agent_argv: list[str], path: str) -> int:
    sessions = _count_sessions(path, args.file)
    if isinstance(sessions, str):
        print(f"{PROG}: {visible(args.file)}: {sessions}", file=sys.stderr)
        return EXIT_USAGE
    if args.session is None and sessions > 1:
        print(
            f"{PROG}: {visible(args.file)} holds {sessions} sessions (a record file written "
            "again): choose one with --session N (`acp-proxy show --list FILE` lists them)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.session is not None and not 1 <= args.session <= sessions:
        print(
            f"{PROG}: {visible(args.file)} holds {sessions} session(s); no session {args.session}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    entries = _Session(path, args.session or 1)
    if args.as_client:
        import anyio

        return anyio.run(_as_client, ClientPlayer.from_record(entries), agent_argv, args)
    replayer = Replayer.from_record(entries)
    out, inp = sys.stdout.fileno(), sys.stdin.fileno()
    started = time.monotonic()
    # When each matched client message arrived (by its number), kept from the first one a
    # step still to come may wait for (the steps' ``need`` never decreases).
    arrived: dict[int, float] = {}
    reported = 0

    def emit() -> None:
        while due := replayer.ready():
            play(due)

    def play(due: list[tuple[AgentStep, bytes]]) -> None:
        for step, frame in due:
            if args.speed > 0:
                since = arrived.get(step.need, started) if step.need else started
                while arrived and next(iter(arrived)) < step.need:
                    del arrived[next(iter(arrived))]
                delay = (step.t - replayer.gate_t(step)) / args.speed
                wait = since + delay - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            _write(out, frame + b"\n")

    def report() -> None:
        nonlocal reported
        for problem in replayer.problems[reported:]:
            print(f"{PROG}: {visible(problem)}", file=sys.stderr, flush=True)
        reported = len(replayer.problems)

    emit()
    for event in read_lines(inp, LineSplitter(args.max_frame_bytes)):
        if isinstance(event, Oversize):
            for reply in replayer.oversize(event):
                _write(out, reply + b"\n")
            report()
            continue
        before = replayer.matched
        replies = replayer.receive(event.raw)
        if args.speed > 0:  # kept only to time what waits for it
            now = time.monotonic()
            for number in range(before + 1, replayer.matched + 1):
                arrived[number] = now
        for reply in replies:
            _write(out, reply + b"\n")
        report()
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
        splitter = LineSplitter(args.max_frame_bytes)

        def take(events: list[Line | Oversize]) -> None:
            for event in events:
                if isinstance(event, Oversize):
                    player.differences.append(
                        f"agent wrote a line of {event.size} bytes, over the "
                        f"{event.limit}-byte limit (--max-frame-bytes); not read"
                    )
                else:
                    player.agent_frame(event.raw)

        try:
            async for chunk in stdout:
                take(splitter.feed(chunk))
                progress.set()
                progress = anyio.Event()
        except STREAM_ERRORS:
            pass
        take(splitter.end())
        ended.set()
        progress.set()

    async with proc, anyio.create_task_group() as tg:
        tg.start_soon(read)
        last_t = 0.0
        while True:
            for step_t, frame in player.due_timed():
                if args.speed > 0 and step_t > last_t:
                    await anyio.sleep((step_t - last_t) / args.speed)
                last_t = max(last_t, step_t)
                await proc.stdin.send(frame + b"\n")
            if player.done or ended.is_set():
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
        print(f"{PROG}: {visible(difference)}", file=sys.stderr)
    if not differences:
        print(
            f"acp-proxy replay: the agent wrote the {player.got} messages of the record",
            file=sys.stderr,
        )
    return EXIT_DIVERGED if differences else EXIT_MATCHED
