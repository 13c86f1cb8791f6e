"""The cost of a rewrite, in process: this tree against a baseline git ref.

Contract: measures and prints; asserts nothing. For each case it times
``Connection.handle_many`` on a batch of agent frames that the annotation rule
(``bench/rules-annotate.yaml``) rewrites, in this tree and in a checkout of ``--baseline-ref``
(default: the last commit before lossless rewriting), and a hand-written orjson parse+inject of
the same frames (``bench/relay_min.py``'s work) in the same process as the floor. Each measurement
runs in a fresh child process, and the children run interleaved (tree, baseline, tree, ...) so
machine noise hits both alike; the table shows the median [min..max] over the repetitions.

Cases:
  * ``small``: a 400-byte ``tool_call_update`` in compact JSON (what most agents write);
  * ``pretty``: the same frame with spaces after ``:`` and ``,`` (not orjson's own form, so this
    tree splices instead of encoding the whole message);
  * ``1mib``: a ``tool_call_update`` whose ``content`` holds 1 MiB of text, with the one
    ``_meta`` key added: the cost must not follow the size of what was not changed.

Usage: ``python bench/rewrite.py [--reps 5] [--baseline-ref REF]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DEFAULT_BASELINE = (
    "5a1562d"  # main before exact rewrites (it re-encoded every rewritten message whole)
)

CHILD = r"""
import json, sys, time
import orjson
sys.path.insert(0, sys.argv[1])
from acp_proxy.config import load_config
try:  # the package laid out by room
    from acp_proxy.wire.chain import Direction
    from acp_proxy.wire.framing import Line
    from acp_proxy.wire.connection.pipeline import Connection
except ImportError:  # an older tree (the baseline)
    from acp_proxy.chain import Direction
    from acp_proxy.framing import Line
    from acp_proxy.pipeline import Connection
case, n = sys.argv[2], int(sys.argv[3])

def frame(i, text, pretty):
    msg = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "sess_1",
        "update": {"sessionUpdate": "tool_call_update", "toolCallId": f"call_{i:05d}",
        "status": "in_progress", "title": "Run the tests", "kind": "execute",
        "content": [{"type": "content", "content": {"type": "text", "text": text}}],
        "locations": [{"path": "/home/user/project/src/main.py", "line": 42}]}}}
    if pretty:
        return json.dumps(msg, ensure_ascii=False).encode()
    return orjson.dumps(msg)

text = "x" * (1 << 20) if case == "1mib" else "collected 12 items; 12 passed in 0.41s " * 4
frames = [frame(i, text, case == "pretty") for i in range(n)]
init_req = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2}}'
init_ok = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2}}'
KINDS = ("tool_call_update", "terminal_update")

def inject(raw):
    msg = orjson.loads(raw)
    u = msg["params"]["update"]
    if msg.get("method") == "session/update" and u.get("sessionUpdate") in KINDS:
        meta = u.get("_meta")
        u["_meta"] = {**(meta or {}), "example.dev/route": "edge"}
        return orjson.dumps(msg)
    return raw

def timed(fn):
    best = None
    for _ in range(3):
        t0 = time.process_time()
        fn()
        dt = time.process_time() - t0
        best = dt if best is None or dt < best else best
    return best / n * 1e6

import os
config = load_config(sys.argv[4], os.environ)
def proxy():
    conn = Connection(config.build_chain())
    conn.handle(Direction.CLIENT_TO_AGENT, Line(init_req))
    conn.handle(Direction.AGENT_TO_CLIENT, Line(init_ok))
    lines = [Line(f) for f in frames]
    out = conn.handle_many(Direction.AGENT_TO_CLIENT, lines)
    assert len(out.forward) == n and out.forward[0].raw != frames[0], "not annotated"
    return out

res = {"proxy": timed(proxy), "inject": timed(lambda: [inject(f) for f in frames])}
print(json.dumps(res))
"""


def run_child(tree: Path, case: str, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), case, str(n), str(BENCH / "rules-annotate.yaml")],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--baseline-ref", default=DEFAULT_BASELINE)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "worktree",
                "add",
                "-q",
                "--detach",
                str(base),
                args.baseline_ref,
            ],
            check=True,
        )
        try:
            print(
                f"| case | this tree µs/msg | {args.baseline_ref} µs/msg | orjson parse+inject "
                "µs/msg | this / baseline | this / inject |"
            )
            print("|---|---|---|---|---|---|")
            for case, n in (("small", 20000), ("pretty", 20000), ("1mib", 20)):
                ours: list[float] = []
                theirs: list[float] = []
                inject: list[float] = []
                ratio_b: list[float] = []
                ratio_i: list[float] = []
                for _ in range(args.reps):
                    a = run_child(ROOT, case, n)
                    b = run_child(base, case, n)
                    ours.append(a["proxy"])
                    theirs.append(b["proxy"])
                    inject.append(a["inject"])
                    ratio_b.append(a["proxy"] / b["proxy"])
                    ratio_i.append(a["proxy"] / a["inject"])
                print(
                    f"| {case} | {fmt(ours)} | {fmt(theirs)} | {fmt(inject)} | "
                    f"{fmt(ratio_b)} | {fmt(ratio_i)} |",
                    flush=True,
                )
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
