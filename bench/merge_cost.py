"""What the coalescing queue's merge pass costs per line, counted: bytecodes and instructions.

Contract: measures and reports, never asserts. Times on the shared 2-core machine move by 2-5 x
within a session; a count does not. For each stream and each tree (the current one and, with
``--baseline-ref REF``, the tree at ``REF``: ``startup.export_ref``), a child process (this file
with ``--child``, the tree on ``PYTHONPATH``) pushes the stream's lines into an
``OutboundQueue`` as the shell does (runs of lines of about 64 KiB, one frame each) and runs one
merge pass over them (``has_room`` at the bound would run the same pass, in pieces), then takes
everything (each merged group encoded):

* bytecodes: the Python bytecodes executed by the pass and the take (``sys.settrace`` opcode
  events), per line;
* instructions (``--callgrind``): the whole child under ``valgrind --tool=callgrind`` twice, a
  pass over the first N lines and over all 2 N (both push the same 2 N lines and take
  everything), the difference divided by N: instructions per line of the pass, C included (the
  parse or the scan, the joins), start-up and pushes cancelled.

Streams (``generate.py``, seeded): ``mergeable`` (the paused client's highly mergeable stream:
status and content updates of 24 tool calls, chunks of 8 messages, plan and usage snapshots) and
its lines of one family each (``text chunks``, ``tool calls``, ``snapshots``); ``notify`` (the
bench's paused stream: mixed updates, mostly of distinct entities).

Usage: ``python bench/merge_cost.py [--lines 20000] [--baseline-ref main] [--callgrind]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
FAMILIES = {
    "text chunks": (b'"agent_message_chunk"', b'"agent_thought_chunk"'),
    "tool calls": (b'"tool_call_update"',),
    "snapshots": (b'"plan_update"', b'"usage_update"'),
}


def _frames(lines: list[bytes]) -> list[tuple[bytes, int]]:
    """The lines as the shell pushes them: runs of about 64 KiB, one frame each."""
    frames, i = [], 0
    while i < len(lines):
        j, size = i, 0
        while j < len(lines) and size < 1 << 16:
            size += len(lines[j]) + 1
            j += 1
        frames.append((b"\n".join(lines[i:j]), j - i))
        i = j
    return frames


def _child(stream: Path, lines: int, passed: int, trace: bool) -> dict[str, Any]:
    """In the child: push ``lines`` lines of ``stream``, pass over the first ``passed``, take
    everything; the counts."""
    from acp_proxy.config import CoalesceConfig
    from acp_proxy.wire.coalesce.queue import OutboundQueue, OutFrame

    body = stream.read_bytes().split(b"\n")[:lines]
    config = CoalesceConfig(max_queue_messages=1 << 30, max_queue_bytes=1 << 40)
    queue = OutboundQueue(config, coalesce=True)
    for raw, count in _frames(body):
        queue.push(OutFrame(raw, None, 2, count), 0.0)
    counts: collections.Counter[str] = collections.Counter()

    def opcode(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            counts[frame.f_code.co_qualname] += 1
        return opcode

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return opcode

    if trace:
        sys.settrace(tracer)
    queue._pass(passed)  # the merge pass, as a look or the bound runs it
    out, _ = queue.take(0.0, look=False)  # (what the pass left goes as it came)
    sys.settrace(None)
    written = sum(run.count(b"\n") for run in out)
    return {
        "lines": len(body),
        "merged": queue.stats.merged,
        "written": written,
        "bytecodes": sum(counts.values()),
        "top": counts.most_common(6),
    }


def _streams(data: Path, lines: int) -> dict[str, Path]:
    """name -> a file of the stream's ``session/update`` lines (the handshake left out)."""
    sys.path.insert(0, str(BENCH))
    from generate import DEFAULT_SEED, ensure

    out: dict[str, Path] = {}
    work = Path(tempfile.mkdtemp(prefix="acp-merge-cost-"))
    mergeable = ensure(data, "mergeable", 2, 80_000_000, DEFAULT_SEED)
    notify = ensure(data, "notify", 2, 8 << 20, DEFAULT_SEED)
    body = Path(mergeable.agent_path).read_bytes().split(b"\n")[2:-1]
    others = Path(notify.agent_path).read_bytes().split(b"\n")[2:-1]
    for name, raw in (("mergeable", body), ("notify", others)):
        path = work / f"{name}.jsonl"
        path.write_bytes(b"\n".join(raw[: 2 * lines]))
        out[name] = path
    for name, needles in FAMILIES.items():
        mine = [line for line in body if any(needle in line[:200] for needle in needles)]
        path = work / f"{name.replace(' ', '-')}.jsonl"
        path.write_bytes(b"\n".join(mine[: 2 * lines]))
        out[name] = path
    return out


def _run(tree: Path, argv: list[str], callgrind: Path | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [PY, str(Path(__file__).resolve()), "--child", *argv]
    if callgrind is not None:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind}", *cmd]
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    if callgrind is not None:
        summary = re.search(r"summary:\s+(\d+)", callgrind.read_text())
        result["instructions"] = int(summary.group(1)) if summary else 0
    return result


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    trees = [("current", ROOT)]
    if args.baseline_ref:
        from startup import export_ref

        trees.insert(0, (args.baseline_ref, export_ref(args.baseline_ref)))
    rows = []
    for name, path in _streams(args.data_dir, args.lines).items():
        for label, tree in trees:
            n = args.lines
            got = _run(tree, [str(path), str(n), str(n), "trace"])
            row = {"stream": name, "tree": label, **got}
            row["bytecodes_per_line"] = got["bytecodes"] / max(1, got["lines"])
            if args.callgrind:
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / "callgrind.out"
                    few = _run(tree, [str(path), str(2 * n), str(n), "-"], out)["instructions"]
                    many = _run(tree, [str(path), str(2 * n), str(2 * n), "-"], out)
                    row["instructions_per_line"] = (many["instructions"] - few) / n
            rows.append(row)
            print(_line(row), file=sys.stderr)
    return rows


def _line(row: dict[str, Any]) -> str:
    ins = row.get("instructions_per_line")
    extra = f", {ins:,.0f} instructions a line" if ins is not None else ""
    return (
        f"{row['stream']:12} {row['tree']:10} {row['lines']:,} lines, {row['merged']:,} merged, "
        f"{row['written']:,} written: {row['bytecodes_per_line']:,.1f} bytecodes a line{extra}"
    )


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| stream | tree | lines | merged | written | bytecodes / line | instructions / line |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ins = r.get("instructions_per_line")
        out.append(
            f"| {r['stream']} | {r['tree']} | {r['lines']:,} | {r['merged']:,} | "
            f"{r['written']:,} | {r['bytecodes_per_line']:,.1f} | "
            f"{f'{ins:,.0f}' if ins is not None else '-'} |"
        )
    return "\n".join(out)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        stream, lines, passed, trace = sys.argv[2:6]
        result = _child(Path(stream), int(lines), int(passed), trace == "trace")
        print(json.dumps(result))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--baseline-ref", help="also count the tree at this git ref")
    ap.add_argument("--callgrind", action="store_true", help="instructions too (valgrind)")
    ap.add_argument("--data-dir", type=Path, default=BENCH / "data")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.callgrind and shutil.which("valgrind") is None:
        ap.error("--callgrind needs valgrind")
    rows = measure(args)
    print(markdown(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
