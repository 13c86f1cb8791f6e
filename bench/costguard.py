"""The cost guard: bytecodes per message of the proxy's hot paths, against a budget in the repo.

Contract: measures four paths deterministically and compares each with its entry in
``bench/cost-budget.json``; exits 1, with a table (path, measured, budget, ratio), when a path
costs more than ``limit`` (1.5) times its budget, or when a path did not do what it stands for
(a pass-through that merged, a paused client's stream that did not merge: a path made cheaper by
skipping its work passes any ceiling). ``.ci/run`` runs it before the tests, so that a path
made several times dearer fails CI instead of being found by chance. It never times anything.

What is measured: the real machinery of one session, in process (``PumpSession``: the agent
side's ``Reader`` with its consumer path, the session's dispatch, the pure ``Connection``, the
client side's ``Outbox`` with its coalescing ``OutboundQueue`` and its writer task
``write_all``), fed by in-memory streams on an event loop whose clock is virtual: a wait jumps
the clock to the next timer, and the proxy's own clock reads (``time.monotonic``) follow it.
Nothing depends on the machine then: the agent's reads come every millisecond of virtual time,
the client reads at fixed virtual times (or never), the writer's looks at a paused client fall
at the same virtual times, and the count of Python bytecodes (a ``sys.settrace`` opcode counter,
cyclic collection off meanwhile) is the same in every run. Each path runs on N and on 2 N
messages after warm-up sessions; the difference divided by N cancels start-up and one-off costs.
Everything the process's Python runs counts (acp-proxy, anyio, asyncio's loop, the standard
library), except this file's own streams and clock.

The scanner is chosen explicitly: the pure-Python one (``ACP_PROXY_PURE_PYTHON=1``, set before
``acp_proxy`` is imported when this file runs as a script), the one every machine has, compiler
or not. Both are deterministic; the C one runs no bytecodes of its own, and the counts differ
between the two by a few percent (docs/performance.md, "The cost guard"); the budget holds for
the pure-Python one.

The paths (``PATHS``), v2 streams of ``session/update`` notifications:

* ``passthrough``: the pass-through rules (``bench/rules-passthrough.yaml``), a mixed stream
  (message and thought chunks, tool call and terminal updates, plans) from an agent that is
  ahead of the proxy (256 KiB reads), to a client that keeps up (it reads its 1 MiB pipe empty
  as soon as any time passes). Nothing may merge.
* ``annotate``: the same with the annotation rule (``bench/rules-annotate.yaml``); every tool
  call and terminal update must be annotated.
* ``queued-no-merge``: a client that stopped reading with its pipe full, and updates each for
  another tool call, streamed at 64 KiB a millisecond: everything waits in the coalescing queue,
  nothing may merge.
* ``paused-merge``: the same client, and a stream that merges (progress updates of ten tool
  calls round-robin, one streamed reply): at least a quarter of it must merge in the queue.

Usage: ``python bench/costguard.py [--budget FILE] [--paths a,b] [--json OUT]``;
``--measured FILE`` compares the figures of an earlier ``--json`` instead of measuring;
``--update --reason TEXT`` writes the measured figures of ``--paths`` into the budget with that
reason (docs/performance.md, "The cost guard": in the same commit that makes a path dearer).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import selectors
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
BUDGET = BENCH / "cost-budget.json"
SCHEMA = "acp-proxy-cost-budget/1"
PATHS = ("passthrough", "annotate", "queued-no-merge", "paused-merge")
LIMIT = 1.5  # a path fails above this many times its budget
MESSAGES = 500  # N: each path runs on N and on 2 N messages
# A client that keeps up: the first reads go through the queue (it counts a new client as
# behind until it has seen it read everything); N spans enough reads for the N more to measure
# the steady path.
STEADY_MESSAGES = 2000
AGENT_STEP_S = 0.001  # virtual time between two reads of the agent's output
FULL_READ = 256 * 1024  # what a read brings from an agent that is ahead (FdStream's read size)
LIVE_READ = 64 * 1024  # ... from an agent that streams at 64 MB/s
CLIENT_BUFFER = 1024 * 1024  # the client's pipe: the 1 MiB the proxy gives its stdout
CLIENT_STEP_S = 0.00001  # a client that reads empties its pipe this often (a fast reader)
SESSION = "sess_costguard"
# Sessions run before counting: a value class compiles its own ``__init__`` after its first few
# instances (``acp_proxy.base.values``), and a class made once per session must get there.
WARM_RUNS = 10


# -- the workloads ----------------------------------------------------------------------------
_SENTENCE = (
    "the agent reads a file and writes the change to the module while the client shows each "
    "update of the tool call in order; naïve façade — déjà vu ✓ 日本語"
)
_WORDS = _SENTENCE.split(" ")


def _text(i: int, words: int) -> str:
    return " ".join(_WORDS[(i * 7 + k * 3) % len(_WORDS)] for k in range(words))


def _update(update: dict[str, Any]) -> bytes:
    message = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": SESSION, "update": update},
    }
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()


def _chunk(i: int, kind: str = "agent_message_chunk", message: str | None = None) -> bytes:
    """A chunk of a reply (of message ``message``; by default a new message every 40 lines)."""
    text = {"type": "text", "text": _text(i, 4 + i % 9)}
    message = message or f"msg_{i // 40:05d}"
    return _update({"sessionUpdate": kind, "messageId": message, "content": text})


def _tool(i: int, tool: str) -> bytes:
    status = ("pending", "in_progress", "in_progress", "completed")[i % 4]
    update: dict[str, Any] = {"sessionUpdate": "tool_call_update", "toolCallId": tool}
    update["status"] = status
    update["content"] = [{"type": "content", "content": {"type": "text", "text": _text(i, 12)}}]
    if i % 3 == 0:
        update["rawInput"] = {"path": f"/workspace/src/m{i % 17}.py", "query": _text(i, 20)}
    return _update(update)


def mixed(n: int) -> Iterator[bytes]:
    """A mixed v2 stream: per 20 lines, 10 message and 3 thought chunks, 5 tool call updates
    (over four tool calls), a terminal update and a plan."""
    for i in range(n):
        slot = i % 20
        if slot < 10:
            yield _chunk(i)
        elif slot < 13:
            yield _chunk(i, "agent_thought_chunk")
        elif slot < 18:
            yield _tool(i, f"call_{i % 4}")
        elif slot == 18:
            output = {"output": _text(i, 10) + "\n", "exitStatus": None}
            yield _update(
                {"sessionUpdate": "terminal_update", "terminalId": f"term_{i % 2}", **output}
            )
        else:
            steps = [{"content": _text(i + k, 5), "status": "pending"} for k in range(3)]
            yield _update({"sessionUpdate": "plan_update", "entries": steps})


def no_merge(n: int) -> Iterator[bytes]:
    """Every update for another tool call: nothing can merge."""
    for i in range(n):
        yield _tool(i, f"call_{i:06d}")


def merging(n: int) -> Iterator[bytes]:
    """Progress updates of ten tool calls round-robin and one streamed reply, alternating."""
    for i in range(n):
        yield _tool(i, f"call_{i % 10}") if i % 2 else _chunk(i, message="msg_reply")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one session did: the path must have done what it stands for (a path that got
    cheaper because it stopped doing its work would pass any ceiling)."""

    lines: int  # agent lines the session read (the initialize response included)
    rewritten: int  # messages the rules changed
    merged: int  # lines the queue merged away
    delivered: int  # bytes the client took


def _annotated(line: bytes) -> bool:
    return b'"tool_call_update"' in line or b'"terminal_update"' in line


@dataclass(frozen=True, slots=True)
class Workload:
    rules: str  # a config file in bench/
    stream: Callable[[int], Iterator[bytes]]  # the agent's lines (n of them)
    reads_from: float | None  # when the client starts to read (None: it is paused)
    # What the session must have done with the n lines ``stream`` gave: None, or what is wrong.
    wrong: Callable[[list[bytes], Outcome], str | None]
    messages: int = MESSAGES  # N
    buffer: int = CLIENT_BUFFER  # the client's pipe
    read: int = FULL_READ  # what one read of the agent's output brings


def _passed(lines: list[bytes], o: Outcome) -> str | None:
    size = sum(len(line) + 1 for line in lines) + len(_INIT_RESPONSE) + 1
    if o.rewritten or o.delivered != size:
        return f"{o.rewritten} rewritten, {o.delivered} of {size} bytes delivered"
    return None


def _annotated_all(lines: list[bytes], o: Outcome) -> str | None:
    want = sum(map(_annotated, lines))
    return None if o.rewritten == want else f"{o.rewritten} of {want} updates annotated"


def _none_merged(lines: list[bytes], o: Outcome) -> str | None:
    if o.merged or o.delivered:
        return f"{o.merged} lines merged, {o.delivered} bytes delivered to a paused client"
    return None


def _merged(lines: list[bytes], o: Outcome) -> str | None:
    if o.merged < len(lines) // 4 or o.delivered:
        return f"only {o.merged} of {len(lines)} lines merged, {o.delivered} bytes delivered"
    return None


SPECS = {
    "passthrough": Workload("rules-passthrough.yaml", mixed, 0.0, _passed, STEADY_MESSAGES),
    "annotate": Workload("rules-annotate.yaml", mixed, 0.0, _annotated_all, STEADY_MESSAGES),
    "queued-no-merge": Workload(
        "rules-passthrough.yaml", no_merge, None, _none_merged, read=LIVE_READ
    ),
    "paused-merge": Workload("rules-passthrough.yaml", merging, None, _merged, read=LIVE_READ),
}
_INIT_REQUEST = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2,'
    b'"capabilities":{}}}'
)
_INIT_RESPONSE = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2,"capabilities":{}}}'


# -- a virtual clock and in-memory streams ----------------------------------------------------
class _Clock:
    now = 1000.0


_CLOCK = _Clock()


class _JumpSelector(selectors.DefaultSelector):
    """Nothing real is ever waited for: a wait jumps the virtual clock to the next timer."""

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("the simulated session waits for ever (no timer, no data)")
        if timeout > 0:
            _CLOCK.now += timeout
        return []


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__(_JumpSelector())

    def time(self) -> float:
        return _CLOCK.now


class _AgentOutput:
    """The agent's stdout: ``read`` bytes every ``AGENT_STEP_S``, as ``FdStream`` offers them
    (``set_consumer`` / ``receive_or_handled``: a chunk read while the reader is parked goes
    to its consumer)."""

    def __init__(self, data: bytes, read: int) -> None:
        self._data = memoryview(data)
        self._read = read
        self._at = 0
        self._consumer: Callable[[bytes], int] | None = None

    def set_consumer(self, consumer: Callable[[bytes], int] | None) -> None:
        self._consumer = consumer

    async def _next(self, max_bytes: int) -> bytes:
        import anyio

        await anyio.sleep(AGENT_STEP_S)
        if self._at >= len(self._data):
            raise anyio.EndOfStream
        end = min(len(self._data), self._at + self._read)
        chunk = bytes(self._data[self._at : end])
        self._at = end
        return chunk

    async def receive(self, max_bytes: int = FULL_READ) -> bytes:
        return await self._next(max_bytes)

    async def receive_or_handled(self, max_bytes: int = FULL_READ) -> bytes | None:
        from acp_proxy.shell.transports import HANDLED, HANDLED_WAKE

        while True:
            chunk = await self._next(max_bytes)
            consumer = self._consumer
            if consumer is None:
                return chunk
            outcome = consumer(chunk)
            if outcome == HANDLED_WAKE:
                return None
            if outcome != HANDLED:
                return chunk

    async def aclose(self) -> None:
        return None


class _Client:
    """The client's stdin, a pipe of ``buffer`` bytes. From ``reads_from`` (virtual time) on, the
    client reads everything in it every ``CLIENT_STEP_S``; before, nothing. ``None``: it never
    reads, and stopped with its buffer full (paused: every message waits in the proxy's queue).
    """

    def __init__(self, reads_from: float | None, buffer: int = CLIENT_BUFFER) -> None:
        self.reads_from = reads_from
        self.buffer = buffer
        self.held = buffer if reads_from is None else 0
        self.written = 0  # bytes it took
        self._looked = -1  # the last read it made (its number since ``reads_from``)

    def _read(self) -> None:
        if self.reads_from is None or _CLOCK.now < self.reads_from:
            return
        step = int((_CLOCK.now - self.reads_from) / CLIENT_STEP_S)
        if step != self._looked:
            self._looked = step
            self.held = 0

    def _take(self, size: int) -> int:
        self._read()
        size = min(size, self.buffer - self.held)
        self.held += size
        self.written += size
        return size

    def try_send(self, data: bytes | memoryview) -> int:
        return self._take(len(data))

    def try_sendv(self, parts: list[bytes | memoryview]) -> int:
        return self._take(sum(len(p) for p in parts))

    def unread(self) -> int | None:
        self._read()
        return self.held

    async def send(self, item: bytes) -> None:
        import anyio

        view = memoryview(item)
        while True:
            view = view[self._take(len(view)) :]
            if not view:
                return
            reads_from = self.reads_from
            if reads_from is None:
                await anyio.Event().wait()  # never read: the writer waits until the run ends
                return
            await anyio.sleep(max(CLIENT_STEP_S, reads_from - _CLOCK.now))

    async def aclose(self) -> None:
        return None


# -- counting ---------------------------------------------------------------------------------
def _counted(
    config: Any, spec: Workload, data: bytes
) -> tuple[Outcome, collections.Counter[CodeType]]:
    """``_session_run(config, spec, data)``, and the bytecodes it executed per code object
    (this file's own left out)."""
    counts: collections.Counter[CodeType] = collections.Counter()
    mine = __file__

    def opcode(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            counts[frame.f_code] += 1
        return opcode

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == mine:
            return None
        frame.f_trace_lines = False  # opcode events only: fewer calls of the tracer
        frame.f_trace_opcodes = True
        return opcode

    # No cyclic collection meanwhile: the finalizers it runs (a coroutine's, a generator's) would
    # count where the allocations before happened to put a collection.
    gc.collect()
    gc.disable()
    sys.settrace(tracer)
    try:
        outcome = _session_run(config, spec, data)
    finally:
        sys.settrace(None)
        gc.enable()
    return outcome, counts


def _session_run(config: Any, spec: Workload, data: bytes) -> Outcome:
    """One session with ``config``: the agent writes ``data`` to a client that keeps up (or is
    ``paused``), until the session read all of it."""
    import anyio

    from acp_proxy.shell.outbox import write_all
    from acp_proxy.shell.session import PumpSession
    from acp_proxy.wire.chain import Direction

    agent_out = _AgentOutput(data, spec.read)
    started = _CLOCK.now
    reads_from = spec.reads_from
    client = _Client(None if reads_from is None else started + reads_from, spec.buffer)
    agent_in = _Client(started)
    outcome: list[Outcome] = []

    async def main() -> None:
        session = PumpSession(config, client, client, agent_out, agent_in)  # type: ignore[arg-type]
        session.connection.handle_line(Direction.CLIENT_TO_AGENT, _INIT_REQUEST)
        box = session.to_client
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(write_all, box, session._account, session._client_gone)
                await session.from_agent.run(
                    agent_out,  # type: ignore[arg-type]
                    connection=session.connection,
                    forward=box,
                    back=session.to_agent,
                    budget=session.budget,
                    dispatch=session._dispatch,
                    account=session._account,
                )
                if reads_from is None:
                    tg.cancel_scope.cancel()  # a paused client: its writer waits for ever
                else:
                    box.close()  # the writer ends once the client has everything
        finally:
            session.budget.close()
        stats = session.connection.stats
        outcome.append(
            Outcome(
                stats.agent_to_client_in, stats.rewritten, box.queue.stats.merged, client.written
            )
        )

    monotonic = time.monotonic
    time.monotonic = lambda: _CLOCK.now  # the proxy's own clock reads follow the loop's
    try:
        anyio.run(main, backend="asyncio", backend_options={"loop_factory": _VirtualLoop})
    finally:
        time.monotonic = monotonic
    return outcome[0]


@dataclass(frozen=True, slots=True)
class Measure:
    path: str
    per_message: float  # bytecodes per message, all counted code
    own: float  # of which acp_proxy's own code
    wrong: str | None  # what the path did not do that it stands for (None: it did it all)


def _split(counts: collections.Counter[CodeType]) -> tuple[int, int]:
    package = str(ROOT / "acp_proxy")
    total = sum(counts.values())
    own = sum(v for code, v in counts.items() if code.co_filename.startswith(package))
    return total, own


def check_scanner() -> None:
    """The budget holds for the pure-Python scanner: refuse to measure with another."""
    from acp_proxy.wire.scan import ACCELERATOR, SCANNER

    if ACCELERATOR is not None:
        raise SystemExit(
            f"costguard: the scanner is {SCANNER}; the budget is in bytecodes of the pure-Python "
            "scanner: run with ACP_PROXY_PURE_PYTHON=1 (this script sets it when run directly)"
        )


def measure(path: str) -> Measure:
    """Bytecodes per message of ``path``: (2 N messages - N messages) / N, after a warm-up."""
    from acp_proxy.config import load_config

    check_scanner()
    spec = SPECS[path]
    n = spec.messages
    config = load_config(str(BENCH / spec.rules), {})
    counts = []
    wrongs: list[str] = []
    for k in (n, 2 * n):
        lines = list(spec.stream(k))
        data = b"\n".join([_INIT_RESPONSE, *lines, b""])
        if k == n:  # imports, caches, first compilations: the session once, then shorter ones
            _session_run(config, spec, data)
            short = b"\n".join([_INIT_RESPONSE, *lines[: n // 4], b""])
            for _ in range(WARM_RUNS):
                _session_run(config, spec, short)
        done, counted = _counted(config, spec, data)
        counts.append(_split(counted))
        wrong = spec.wrong(lines, done)
        if done.lines != k + 1:
            wrong = f"{done.lines} of {k + 1} lines read"
        if wrong is not None:
            wrongs.append(f"{wrong} ({k:,} messages)")
    (few, few_own), (many, many_own) = counts
    return Measure(path, (many - few) / n, (many_own - few_own) / n, "; ".join(wrongs) or None)


def measure_all(names: list[str]) -> list[Measure]:
    """``measure`` each path, the proxy's log at its default level (info) into a scratch file,
    as a proxy whose log goes to a file."""
    import tempfile

    from acp_proxy.shell.logsetup import configure_logging

    with tempfile.TemporaryDirectory() as tmp:
        configure_logging("info", log_file=str(Path(tmp) / "proxy.log"))
        return [measure(name) for name in names]


# -- the budget -------------------------------------------------------------------------------
def read_budget(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise SystemExit(f"costguard: {path}: not a {SCHEMA} file")
    for name, entry in data["paths"].items():
        if not str(entry.get("reason", "")).strip():
            raise SystemExit(f"costguard: {path}: the entry {name!r} has no reason")
    return data


def compare(
    measured: dict[str, float],
    budget: dict[str, Any],
    limit: float,
    wrong: dict[str, str | None] | None = None,
) -> tuple[list[str], bool]:
    """The table's lines and whether every path did its work (``wrong``: what one did not do)
    within ``limit`` times its budget."""
    lines = [
        "| path | measured (bytecodes / message) | budget | ratio | |",
        "|---|---|---|---|---|",
    ]
    ok = True
    for name, value in measured.items():
        entry = budget["paths"].get(name)
        if entry is None:
            lines.append(f"| {name} | {value:,.2f} | (none) | - | FAIL: not in the budget |")
            ok = False
            continue
        ratio = value / entry["budget"]
        missed = (wrong or {}).get(name)
        if missed is not None:
            verdict = f"FAIL: did not do its work: {missed}"
            ok = False
        elif ratio > limit:
            verdict = f"FAIL: more than {limit} x the budget"
            ok = False
        elif ratio < 1 / limit:
            # Not a failure; but a budget far above the cost would let a loss through unseen.
            verdict = "ok, well under: lower the budget (with the reason)"
        else:
            verdict = "ok"
        cells = [name, f"{value:,.2f}", f"{entry['budget']:,.2f}", f"{ratio:.2f}", verdict]
        lines.append("| " + " | ".join(cells) + " |")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--budget", type=Path, default=BUDGET)
    ap.add_argument("--paths", help="comma-separated subset (default: all, or all --measured has)")
    ap.add_argument("--json", type=Path, help="write the measured figures here")
    ap.add_argument("--measured", type=Path, help="compare the figures of an earlier --json")
    ap.add_argument("--update", action="store_true", help="write the figures into the budget")
    ap.add_argument("--reason", help="with --update: why the paths cost what they cost now")
    args = ap.parse_args(argv)
    saved: dict[str, float] = {}
    wrong: dict[str, str | None] = {}
    if args.measured is not None:
        figures = json.loads(args.measured.read_text())
        saved, wrong = figures["per_message"], figures.get("wrong", {})
    names = [p for p in (args.paths or ",".join(saved or PATHS)).split(",") if p]
    unknown = sorted(set(names) - set(PATHS))
    if unknown:
        ap.error(f"unknown paths {unknown}; known: {', '.join(PATHS)}")
    if args.update and not (args.reason or "").strip():
        ap.error("--update needs --reason: why the paths cost what they cost now")
    if args.measured is not None:
        measured = {name: float(saved[name]) for name in names}
        own: dict[str, float] = {}
    else:
        started = time.perf_counter()
        results = measure_all(names)
        measured = {m.path: m.per_message for m in results}
        own = {m.path: m.own for m in results}
        wrong = {m.path: m.wrong for m in results}
        print(
            f"costguard: bytecodes per message, pure-Python scanner, Python "
            f"{sys.version.split()[0]}, N and 2 N messages a path ("
            + ", ".join(f"{name} N = {SPECS[name].messages:,}" for name in names)
            + f"; {time.perf_counter() - started:.1f} s)"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps({"per_message": measured, "acp_proxy_own": own, "wrong": wrong}, indent=2)
            + "\n"
        )
    if args.update and any(wrong.get(name) for name in names):
        print(f"costguard: not written: a path did not do its work: {wrong}")
        return 1
    if args.update:
        data = read_budget(args.budget) if args.budget.exists() else _empty_budget()
        for name in names:
            data["paths"][name] = {"budget": round(measured[name], 2), "reason": args.reason}
        data["python"] = ".".join(map(str, sys.version_info[:2]))
        args.budget.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        print(f"costguard: wrote {', '.join(names)} into {args.budget}")
        return 0
    budget = read_budget(args.budget)
    limit = float(budget.get("limit", LIMIT))
    lines, ok = compare(measured, budget, limit, wrong)
    print("\n".join(lines))
    python = ".".join(map(str, sys.version_info[:2]))
    if budget.get("python") not in (None, python):
        print(f"note: the budget was measured on Python {budget['python']}, this is {python}")
    if own:
        print("acp_proxy's own share: " + ", ".join(f"{k} {v:,.2f}" for k, v in own.items()))
    if not ok:
        print(
            f"costguard: a path failed (above). One that costs more than {limit} x its budget "
            "and is meant to: update bench/cost-budget.json in the same commit, with the reason "
            "(docs/performance.md, 'The cost guard')."
        )
        return 1
    return 0


def _empty_budget() -> dict[str, Any]:
    return {"schema": SCHEMA, "measure": "", "limit": LIMIT, "paths": {}}


if __name__ == "__main__":
    os.environ["ACP_PROXY_PURE_PYTHON"] = "1"  # before acp_proxy is imported: see the docstring
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
