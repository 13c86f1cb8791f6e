"""Scenarios that engage the outbound queue: a client that falls behind the agent.

Contract: runs the proxy (coalescing on and off, the current tree and with ``--baseline-ref``
the tree at that ref, coalescing on and off) and the TypeScript conductor when installed
(``bench/setup_peers.py``) between ``replay_agent.py`` and a client in this process that reads
slowly, and reports per variant the proxy's CPU (``wait4`` minus the agent's own), its peak RSS,
when the client had everything, what it received and whether the client state is exact.
CPU is net of each variant's start-up (its CPU for the handshake alone, measured first).
Measures; never asserts a timing.

Scenarios:
  paused: the client reads nothing for ``--pause`` seconds while the agent writes a ``notify``
    stream (``--paused-mb``), then reads as fast as it can (bytes only: it parses nothing);
  paused-editor: the same, but the client parses every line it reads, as an editor must before
    it applies an update (``orjson.loads``; a real editor then renders it too): when it has
    parsed the last line;
  paused-mergeable: the paused client (``--mergeable-pause`` seconds) on a highly mergeable
    stream (generate.py profile ``mergeable``, ``--mergeable-mb`` MB: status and content updates
    of 24 tool calls, chunks of 8 messages, plan and usage snapshots), and the client's final
    state compared with the stream's;
  rate: a burst of mixed v2 updates (``--rate-messages``) to a client reading ``--rate``
    lines a second: the share of messages delivered and the exact client state (at every
    barrier, a request or response, and at the end);
  lagging: every update for a different entity (nothing can merge), 141 B to 10 KB frames, to a
    client that reads 64 KiB and then sleeps 1 ms: CPU per message, coalescing on against off.

Usage: ``python bench/slow_client.py [--baseline-ref 5a1562d] [--out results.json]``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import setup_peers
from generate import DEFAULT_SEED, Dataset, ensure
from harness import _kill_group, read_agent_rusage, wait_rusage
from startup import export_ref

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable

# (everything read, when the first byte came, when the last byte came)
Reader = Callable[[int, float], tuple[bytes, float | None, float | None]]


@dataclass
class Result:
    variant: str
    ok: bool = True
    error: str = ""
    cpu_s: float = 0.0
    maxrss_mb: float = 0.0
    wall_s: float = 0.0  # from the start until the client has everything
    # From the client's first read until it has the last byte (not until the end of the stream,
    # which comes some 50 ms later, once the agent and the proxy have exited).
    after_resume_s: float = 0.0
    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    state: str = ""  # "exact", "DIFFERS", "" (not checked)
    extra: dict[str, Any] = field(default_factory=dict)


# -- the client --------------------------------------------------------------------------------


def paused_reader(pause_s: float) -> Reader:
    def read(fd: int, timeout: float) -> tuple[bytes, float | None, float | None]:
        time.sleep(pause_s)
        # No per-read callback: counting the newlines alone cost this client about 1 ms a MiB.
        return _read_all(fd, timeout, None)

    return read


def editor_reader(pause_s: float) -> Reader:
    """Paused, then reads as fast as it can and parses each complete line as it comes (the
    last byte's time is when the last line was parsed)."""

    def read(fd: int, timeout: float) -> tuple[bytes, float | None, float | None]:
        time.sleep(pause_s)
        carry = b""

        def parse(data: bytes) -> None:
            nonlocal carry
            lines = (carry + data).split(b"\n")
            carry = lines.pop()
            for line in lines:
                orjson.loads(line)

        return _read_all(fd, timeout, None, parse=parse)

    return read


def rate_reader(lines_per_s: float) -> Reader:
    def read(fd: int, timeout: float) -> tuple[bytes, float | None, float | None]:
        start: float | None = None  # the first byte's arrival: no credit for waiting before
        seen = 0

        def pace(lines: int) -> None:
            nonlocal seen, start
            if start is None:
                start = time.perf_counter()
            seen += lines
            ahead = seen / lines_per_s - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)

        return _read_all(fd, timeout, pace, size=4096)

    return read


def lagging_reader(fd: int, timeout: float) -> tuple[bytes, float | None, float | None]:
    return _read_all(fd, timeout, lambda _n: time.sleep(0.001), size=1 << 16)


def _read_all(
    fd: int,
    timeout: float,
    after: Callable[[int], None] | None,
    size: int = 1 << 20,
    parse: Callable[[bytes], None] | None = None,
) -> tuple[bytes, float | None, float | None]:
    """Everything the proxy writes, and when the first and the last byte were read (None:
    nothing came); ``after`` is told how many lines each read brought, ``parse`` is given each
    read's bytes (the last byte counts as read once it has been parsed)."""
    parts: list[bytes] = []
    first: float | None = None
    last: float | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        data = os.read(fd, size)
        now = time.perf_counter()
        if first is None:
            first = now
        if not data:
            return b"".join(parts), first, last
        parts.append(data)
        if parse is not None:
            parse(data)
            now = time.perf_counter()
        last = now
        if after is not None:
            after(data.count(b"\n"))
    raise TimeoutError("the client did not get everything in time")


def launcher(work: Path) -> Path:
    """``bench/spawn_rusage.c`` built once (the command's own peak RSS and CPU)."""
    out = BENCH / "build" / "spawn_rusage"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = work / "spawn_rusage"
        subprocess.run(["cc", "-O2", "-o", str(tmp), str(BENCH / "spawn_rusage.c")], check=True)
        os.replace(tmp, out)
    return out


# -- the variants ------------------------------------------------------------------------------


def variants(
    baseline_ref: str | None, work: Path, conductor: bool
) -> dict[str, tuple[Callable[[list[str]], list[str]], dict[str, str], Path]]:
    """name -> (argv around the agent's argv, environment, cwd)."""
    out: dict[str, tuple[Callable[[list[str]], list[str]], dict[str, str], Path]] = {}
    # Byte-compiled, as an installed wheel and the baseline tree (``export_ref``) are: without
    # the cache (PYTHONDONTWRITEBYTECODE) each start compiles the package, about 0.9 s of CPU
    # whose run-to-run spread swamped the stream's CPU after the start-up's was subtracted.
    compileall.compile_dir(str(ROOT / "acp_proxy"), quiet=1)
    trees = [("", ROOT)]
    if baseline_ref is not None:
        trees.append((f"@{baseline_ref}", export_ref(baseline_ref)))
    for suffix, tree in trees:
        for on in (True, False):
            config = work / f"coalesce-{'on' if on else 'off'}.yaml"
            config.write_text(f"coalesce:\n  enabled: {'true' if on else 'false'}\n")
            env = {**os.environ, "PYTHONPATH": str(tree)}

            def argv(agent: list[str], config: Path = config) -> list[str]:
                return [PY, "-m", "acp_proxy", "--config", str(config), "--", *agent]

            out[f"proxy{suffix} coalescing {'on' if on else 'off'}"] = (argv, env, tree)
    build = BENCH / "build"
    if conductor and setup_peers.ensure(build, install=False).get("conductor") is None:
        module = str(setup_peers.conductor_module(build))
        env = {**os.environ, "CONDUCTOR_MODULE": module}

        def peer(agent: list[str]) -> list[str]:
            return ["node", str(BENCH / "peer_conductor.mjs"), *agent]

        out["TypeScript conductor"] = (peer, env, ROOT)
    return out


def run_one(  # noqa: PLR0917 - one run's settings, named at every call
    name: str,
    spec: tuple[Callable[[list[str]], list[str]], dict[str, str], Path],
    agent_file: Path,
    client_file: Path,
    reader: Reader,
    work: Path,
    repeat: int = 1,
    timeout: float = 600.0,
    startup_cpu: float = 0.0,
) -> tuple[Result, bytes]:
    argv_of, env, cwd = spec
    rusage = work / "agent-rusage.json"
    rusage.unlink(missing_ok=True)
    agent = [PY, str(BENCH / "replay_agent.py")]
    if name.startswith("TypeScript"):
        agent += ["--renumber", str(client_file)]
    agent += [str(agent_file), str(repeat)]
    result = Result(name)
    own = work / "sidecar-rusage.json"
    own.unlink(missing_ok=True)
    t0 = time.perf_counter()
    # Under the rusage launcher: a child forked from this process would start with its RSS.
    proc = subprocess.Popen(
        [str(launcher(work)), str(own), *argv_of(agent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**env, "BENCH_AGENT_RUSAGE": str(rusage)},
        cwd=cwd,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    # The client's requests, and its stdin kept open until it has everything (as an editor).
    proc.stdin.write(client_file.read_bytes())
    proc.stdin.flush()
    try:
        out, first, last = reader(proc.stdout.fileno(), timeout)
    except TimeoutError as exc:
        _kill_group(proc)
        result.ok, result.error = False, str(exc)
        out, first, last = b"", None, None
    end = time.perf_counter()
    proc.stdin.close()
    proc.stdout.close()
    wait_rusage(proc, 30)
    agent_cpu = 0.0
    if rusage.exists():
        agent = json.loads(rusage.read_text())
        agent_cpu = float(agent["utime"]) + float(agent["stime"])
    cpu, rss_kb = read_agent_rusage(own)
    result.cpu_s = cpu - agent_cpu - startup_cpu
    result.maxrss_mb = rss_kb / 1024
    result.wall_s = end - t0
    result.after_resume_s = last - first if first is not None and last is not None else 0.0
    result.extra["eof_after_first_s"] = end - first if first is not None else 0.0
    result.messages_out = out.count(b"\n")
    result.bytes_out = len(out)
    return result, out


def _median(runs: list[Result]) -> Result:
    """One row for several runs of a variant: the median of each time and count, the largest
    peak RSS, "exact" only when every run was exact, the first error if any run failed."""
    failed = [r for r in runs if not r.ok]
    if failed:
        return failed[0]
    row = Result(runs[0].variant, extra=dict(runs[0].extra))
    for name in ("cpu_s", "wall_s", "after_resume_s", "messages_out", "bytes_out"):
        setattr(row, name, statistics.median(getattr(r, name) for r in runs))
    row.messages_out, row.bytes_out = int(row.messages_out), int(row.bytes_out)
    row.messages_in, row.bytes_in = runs[0].messages_in, runs[0].bytes_in
    row.maxrss_mb = max(r.maxrss_mb for r in runs)
    states_seen = {r.state for r in runs}
    row.state = states_seen.pop() if len(states_seen) == 1 else "DIFFERS"
    if "share" in row.extra:
        row.extra["share"] = row.messages_out / max(1, row.messages_in)
    if "cpu_us_per_message" in row.extra:
        row.extra["cpu_us_per_message"] = row.cpu_s / max(1, row.messages_in) * 1e6
    if "eof_after_first_s" in row.extra:
        row.extra["eof_after_first_s"] = statistics.median(
            r.extra["eof_after_first_s"] for r in runs
        )
    row.extra["runs"] = len(runs)
    return row


def paired(on: list[Result], off: list[Result], draws: int = 5000) -> dict[str, Any]:
    """Coalescing on against off, round by round (each round ran both, in alternating order):
    the median of the differences of the time after the first read and of the CPU, with a 95 %
    bootstrap interval for the time (seeded: the same runs give the same figures), and in how
    many rounds on was later. Single runs of this scenario vary by more than the difference
    being looked for; the pairs cancel what drifted between rounds."""
    import random

    diffs = [(a.after_resume_s - b.after_resume_s) * 1e3 for a, b in zip(on, off, strict=True)]
    cpu = [a.cpu_s - b.cpu_s for a, b in zip(on, off, strict=True)]
    pick = random.Random(20261205)
    boots = sorted(statistics.median(pick.choices(diffs, k=len(diffs))) for _ in range(draws))
    return {
        "after_first_ms_median": statistics.median(diffs),
        "after_first_ms_ci95": [boots[int(0.025 * draws)], boots[int(0.975 * draws) - 1]],
        "on_later_in": sum(d > 0 for d in diffs),
        "rounds": len(diffs),
        "cpu_s_median": statistics.median(cpu),
    }


# -- exact client state ------------------------------------------------------------------------


def states(raw: bytes, version: int) -> tuple[list[Any], Any]:
    """The client state before each barrier (a request or response) and at the end."""
    from acp_proxy.meta.state import ClientModel

    model = ClientModel(version)
    at_barriers: list[Any] = []
    for line in raw.split(b"\n"):
        if not line:
            continue
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        for m in message if isinstance(message, list) else [message]:
            if not isinstance(m, dict):
                continue
            if "id" in m:
                at_barriers.append(_normalized(model.snapshot()))
            else:
                model.apply(m)
    return at_barriers, _normalized(model.snapshot())


def _normalized(state: dict[str, Any]) -> Any:
    """The client's view: adjacent plain text blocks read as one text, terminal bytes as one
    stream (what a client shows; the coalescer joins exactly these)."""
    import base64

    for entity in state["entities"].values():
        for name in ("content", "summary"):
            blocks = entity["fields"].get(name)
            if isinstance(blocks, list):
                joined: list[Any] = []
                for block in blocks:
                    plain = isinstance(block, dict) and block.keys() == {"type", "text"}
                    last = joined[-1] if joined else None
                    if plain and isinstance(last, dict) and last.keys() == {"type", "text"}:
                        joined[-1] = {"type": "text", "text": last["text"] + block["text"]}
                    else:
                        joined.append(block)
                entity["fields"][name] = joined
        output = entity["appended"].get("output")
        if output is not None:
            entity["appended"]["output"] = b"".join(
                base64.b64decode(d) if isinstance(d, str) else b"" for d in output
            )
    return state


# -- data --------------------------------------------------------------------------------------


def no_merge_data(work: Path, base: Dataset, messages: int) -> tuple[Path, Path]:
    """The handshake of ``base``, then ``messages`` tool_call_updates each for a new tool call
    (141 B to 10 KB): nothing can merge."""
    head = Path(base.agent_path).read_bytes().split(b"\n", 2)[:2]
    path = work / f"nomerge-{messages}.agent.jsonl"
    sizes = (0, 0, 0, 600, 2000, 9800)
    with open(path, "wb") as f:
        f.write(b"\n".join(head) + b"\n")
        for i in range(messages):
            update: dict[str, Any] = {
                "sessionUpdate": "tool_call_update",
                "toolCallId": f"call_{i:07d}",
                "status": "in_progress",
            }
            pad = sizes[i % len(sizes)]
            if pad:
                update["rawOutput"] = {"log": "x" * pad}
            params = {"sessionId": "sess_7c41e2a9", "update": update}
            message = {"jsonrpc": "2.0", "method": "session/update", "params": params}
            f.write(orjson.dumps(message) + b"\n")
    return path, Path(base.client_path)


# -- main --------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, list[Any]]:
    """Every selected scenario for every variant: ``{scenario: [Result as a dict, ...]}``."""
    work = Path(tempfile.mkdtemp(prefix="acp-slow-client-"))
    found = variants(args.baseline_ref, work, not args.no_conductor)
    results: dict[str, list[dict[str, Any]]] = {}
    wanted = args.scenarios.split(",")
    # Each variant's start-up CPU (the handshake alone), subtracted from its stream's.
    notify = ensure(args.data_dir, "notify", 2, 8 << 20, DEFAULT_SEED)
    empty, _ = no_merge_data(work, notify, 0)
    startup: dict[str, float] = {}
    for name, spec in found.items():
        # The median of three: one start-up's CPU varied by tens of ms, which moved the stream's
        # CPU (and its ratio to coalescing off) as much.
        cpu = [
            run_one(name, spec, empty, Path(notify.client_path), lagging_reader, work)[0].cpu_s
            for _ in range(3)
        ]
        startup[name] = statistics.median(cpu)
    results["startup"] = [{"variant": k, "cpu_s": v} for k, v in startup.items()]

    def interleaved(one: Callable[[str, Any], Result], scenario: str) -> list[dict[str, Any]]:
        """``one`` run per variant, ``--repeat`` rounds interleaved (drift hits every variant
        alike), every other round in reverse order; per variant the median of each time and
        count, the largest RSS."""
        runs: dict[str, list[Result]] = {name: [] for name in found}
        for round_ in range(args.repeat):
            # Every other round in reverse: a variant's place in the round (what ran just before
            # it) moved the time after the first read by 5-10 ms on a shared 2-core machine.
            order = list(found.items())
            for name, spec in order if round_ % 2 == 0 else reversed(order):
                runs[name].append(one(name, spec))
        rows = []
        for name, group in runs.items():
            r = _median(group)
            off = runs.get(name.replace("coalescing on", "coalescing off"))
            if name.endswith("coalescing on") and off is not None and len(group) > 1:
                r.extra["vs_off"] = paired(group, off)
            rows.append(asdict(r))
            log(_line(scenario, r))
        return rows

    paused_ds = ensure(args.data_dir, "notify", 2, 8 << 20, DEFAULT_SEED)
    paused_repeat = max(1, round(args.paused_mb / 8))
    for scenario, make_reader in (("paused", paused_reader), ("paused-editor", editor_reader)):
        if scenario not in wanted:
            continue

        def paused(
            name: str, spec: Any, make_reader: Callable[[float], Reader] = make_reader
        ) -> Result:
            r, _ = run_one(
                name,
                spec,
                Path(paused_ds.agent_path),
                Path(paused_ds.client_path),
                make_reader(args.pause),
                work,
                repeat=paused_repeat,
                startup_cpu=startup[name],
            )
            lines, size = paused_ds.lines - 2, paused_ds.bytes
            r.messages_in, r.bytes_in = lines * paused_repeat + 2, size * paused_repeat
            r.extra["pause_s"] = args.pause
            return r

        results[scenario] = interleaved(paused, scenario)

    if "paused-mergeable" in wanted:
        mergeable_ds = ensure(
            args.data_dir, "mergeable", 2, int(args.mergeable_mb * 1e6), DEFAULT_SEED
        )
        final = states(Path(mergeable_ds.agent_path).read_bytes(), 2)[1]

        def mergeable(name: str, spec: Any) -> Result:
            r, out = run_one(
                name,
                spec,
                Path(mergeable_ds.agent_path),
                Path(mergeable_ds.client_path),
                paused_reader(args.mergeable_pause),
                work,
                startup_cpu=startup[name],
            )
            r.messages_in, r.bytes_in = mergeable_ds.lines, mergeable_ds.bytes
            r.state = "exact" if states(out, 2)[1] == final else "DIFFERS"
            r.extra["pause_s"] = args.mergeable_pause
            return r

        results["paused-mergeable"] = interleaved(mergeable, "paused-mergeable")

    if "rate" in wanted:
        size = int(args.rate_messages * 8_388_914 / 12_624)  # mixed v2: ~665 B a message
        rate_ds = ensure(args.data_dir, "mixed", 2, size, DEFAULT_SEED)
        expected = states(Path(rate_ds.agent_path).read_bytes(), 2)

        def rate(name: str, spec: Any) -> Result:
            r, out = run_one(
                name,
                spec,
                Path(rate_ds.agent_path),
                Path(rate_ds.client_path),
                rate_reader(args.rate),
                work,
                startup_cpu=startup[name],
            )
            r.messages_in, r.bytes_in = rate_ds.lines, rate_ds.bytes
            got = states(out, 2)
            same_end = got[1] == expected[1]
            same_barriers = got[0] == expected[0]
            r.state = "exact" if same_end and same_barriers else "DIFFERS"
            r.extra["share"] = r.messages_out / max(1, rate_ds.lines)
            return r

        results["rate"] = interleaved(rate, "rate")

    if "lagging" in wanted:
        base = ensure(args.data_dir, "notify", 2, 8 << 20, DEFAULT_SEED)
        agent_file, client_file = no_merge_data(work, base, args.lagging_messages)

        def lagging(name: str, spec: Any) -> Result:
            r, _ = run_one(
                name, spec, agent_file, client_file, lagging_reader, work, startup_cpu=startup[name]
            )
            r.messages_in = args.lagging_messages + 2
            r.bytes_in = agent_file.stat().st_size
            r.extra["cpu_us_per_message"] = r.cpu_s / r.messages_in * 1e6
            return r

        results["lagging"] = interleaved(lagging, "lagging")

    return results


def options(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline-ref", help="also run the proxy at this git ref")
    ap.add_argument("--scenarios", default="paused,paused-editor,paused-mergeable,rate,lagging")
    ap.add_argument("--pause", type=float, default=3.0, help="paused: seconds the client waits")
    ap.add_argument("--paused-mb", type=int, default=64, help="paused: MiB the agent writes")
    ap.add_argument("--mergeable-pause", type=float, default=5.0, help="paused-mergeable: s")
    ap.add_argument("--mergeable-mb", type=float, default=80, help="paused-mergeable: MB")
    ap.add_argument("--rate", type=float, default=10_000, help="rate: lines the client reads/s")
    ap.add_argument("--rate-messages", type=int, default=20_000)
    ap.add_argument("--lagging-messages", type=int, default=30_000)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs (medians shown)")
    ap.add_argument("--no-conductor", action="store_true")
    ap.add_argument("--data-dir", type=Path, default=BENCH / "data")
    ap.add_argument("--out", type=Path)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    results = measure(args, print)
    print(markdown(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _line(scenario: str, r: Result) -> str:
    return (
        f"{scenario:8} {r.variant:38} cpu {r.cpu_s:6.3f}s rss {r.maxrss_mb:6.1f}MiB "
        f"wall {r.wall_s:6.2f}s after-resume {r.after_resume_s:6.3f}s "
        f"msgs {r.messages_out}/{r.messages_in} bytes {r.bytes_out}/{r.bytes_in} "
        f"{r.state} {r.error}"
    )


def markdown(results: dict[str, list[dict[str, Any]]]) -> str:
    out: list[str] = []
    for scenario, rows in results.items():
        if scenario == "startup":
            continue
        out.append(f"\n### {scenario}\n")
        out.append(
            "| variant | CPU s | CPU µs/msg | peak RSS MiB | stream ends at s (last byte after "
            "first read) | messages out / in | share | bytes out | state |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            if not r["ok"]:
                out.append(f"| {r['variant']} | error: {r['error']} |||||||")
                continue
            per = r["cpu_s"] / max(1, r["messages_in"]) * 1e6
            share = r["messages_out"] / max(1, r["messages_in"])
            out.append(
                f"| {r['variant']} | {r['cpu_s']:.3f} | {per:.1f} | {r['maxrss_mb']:.1f} | "
                f"{r['wall_s']:.2f} ({r['after_resume_s']:.3f}) | "
                f"{r['messages_out']:,} / {r['messages_in']:,} | {share:.2f} | "
                f"{r['bytes_out'] / 2**20:.1f} MiB | {r['state'] or '-'} |"
            )
        for r in rows:
            vs = r.get("extra", {}).get("vs_off")
            if vs:
                lo, hi = vs["after_first_ms_ci95"]
                out.append(
                    f"\n{r['variant']} against off, paired by round: last byte "
                    f"{vs['after_first_ms_median']:+.1f} ms (95 % CI {lo:+.1f} to {hi:+.1f}), "
                    f"later in {vs['on_later_in']} of {vs['rounds']} rounds; CPU "
                    f"{vs['cpu_s_median']:+.3f} s"
                )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
