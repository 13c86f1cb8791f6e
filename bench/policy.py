"""The cost of a policy decision, in process: one permission request through the policy link.

Contract: measures and prints; asserts nothing. Builds a ``policy:`` section of ``--rules``
rules (commands, path globs under ``{cwd}`` and ``**``, kinds, titles, agents; a mix like a
team's rule set, none of which matches the request until the last, so every rule is tried) and
times ``PolicyMiddleware.__call__`` on a v1 ``session/request_permission`` whose tool call state
comes from an earlier ``tool_call`` update (the summary, the paths resolved with the identity,
the decision, the answer), one call at a time with ``time.perf_counter_ns``, then again with
the thread's CPU time (``time.thread_time_ns``, which other processes on a busy machine do not
move; its clock costs more than a microsecond a read here, which that column includes); prints
p50, p99 and max in microseconds. Then a frame no policy concerns through a connection without
and with the policy link: the median cost per frame, and whether its bytes leave unchanged.

Usage: ``python bench/policy.py [--rules 200] [--requests 20000] [--json]`` (``bench/run.py``
reads the ``--json`` form: its scenario 9).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from typing import cast

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.config import Config, parse_config
from acp_proxy.policy.middleware import PolicyMiddleware
from acp_proxy.wire.chain import Chain, Direction, Link, MessageContext, Middleware
from acp_proxy.wire.framing import Line
from acp_proxy.wire.pipeline import Connection


def policy_text(n: int) -> str:
    lines = ["policy:", "  rules:"]
    shapes = [
        "{{kind: execute, command: ['tool{i}', '--force']}}",
        "{{kind: read, paths: ['{{cwd}}/secret{i}/**', '**/*.key{i}']}}",
        "{{method: fs/write_text_file, paths_outside: ['{{cwd}}/**', '/tmp/w{i}/**']}}",
        "{{title: '^Deploy {i} ', kind: execute}}",
        "{{agent: 'agent{i}*', kind: edit}}",
    ]
    for i in range(n - 1):
        match = shapes[i % len(shapes)].format(i=i)
        lines.append(f"    - {{name: r{i}, match: {match}, decision: deny}}")
    lines.append("    - {name: last, match: {kind: read, paths: ['{cwd}/**']}, decision: allow}")
    return "\n".join(lines) + "\n"


def _middleware(rules: int, audited: bool = False) -> tuple[Config, PolicyMiddleware]:
    """The policy link of ``rules`` rules; ``audited``: with an audit sink that writes nothing
    (each decision builds its entry, as with an audit file, without the file's I/O)."""
    config = parse_config(policy_text(rules), "bench.yaml", {"HOME": "/home/bench"})
    assert config.policy is not None
    sink = (lambda entry: None) if audited else None
    return config, PolicyMiddleware(config.policy, sink, lambda path: path)


def _percentiles(samples: list[int]) -> dict[str, float]:
    samples = sorted(samples)
    return {
        "p50_us": statistics.median(samples) / 1000,
        "p99_us": samples[int(len(samples) * 0.99)] / 1000,
        "max_us": samples[-1] / 1000,
    }


def decision_cost(rules: int, requests: int, audited: bool = False) -> dict[str, float]:
    """One permission request at a time through the policy link: per request, the wall time
    (``perf_counter_ns``) and the thread's CPU time (``thread_time_ns``: what a busy machine's
    other processes do not add); their p50, p99 and max in microseconds."""
    _, mw = _middleware(rules, audited)
    c2a = MessageContext(Direction.CLIENT_TO_AGENT, 1)
    a2c = MessageContext(Direction.AGENT_TO_CLIENT, 1)
    mw(
        {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/w/p"}},
        c2a,
    )
    mw.on_answer("session/new", {"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "s"}})
    update: JsonObject = {
        "sessionUpdate": "tool_call",
        "toolCallId": "t",
        "title": "Read src/main.py",
        "kind": "read",
        "locations": [{"path": "/w/p/src/main.py"}],
    }
    mw(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": "s", "update": update},
        },
        a2c,
    )
    request: JsonObject = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "session/request_permission",
        "params": {
            "sessionId": "s",
            "toolCall": {"toolCallId": "t"},
            "options": [
                {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
            ],
        },
    }
    verdict = mw(request, a2c)
    assert "allow" in repr(verdict), verdict
    wall: list[int] = []
    cpu: list[int] = []
    # Two passes, so neither clock's own cost is inside the other's measure.
    for clock, samples in ((time.perf_counter_ns, wall), (time.thread_time_ns, cpu)):
        for _ in range(requests):
            mw.marks.clear()  # (the chain drains them)
            start = clock()
            mw(request, a2c)
            samples.append(clock() - start)
    out = _percentiles(wall)
    out.update({f"cpu_{k}": v for k, v in _percentiles(cpu).items()})
    return out


def frame_cost(rules: int, frames: int) -> dict[str, dict[str, float]]:
    """A frame no policy concerns (a 2 KiB message chunk), through a connection without a
    policy and with one: the median cost per frame, and whether its bytes leave unchanged."""
    config, _ = _middleware(rules)
    chunk = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"'
        + b"x" * 2048
        + b'"}}}}'
    )
    init = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2}}'
    ok = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2,"capabilities":{}}}'
    assert config.policy is not None
    factory = functools.partial(PolicyMiddleware, config.policy, None, lambda path: path)
    out: dict[str, dict[str, float]] = {}
    for name, chain in (
        ("no policy", Chain([])),
        ("policy", Chain([Link(cast(Middleware, factory()))])),
    ):
        conn = Connection(chain)
        conn.handle(Direction.CLIENT_TO_AGENT, Line(init))
        conn.handle(Direction.AGENT_TO_CLIENT, Line(ok))
        samples = []
        same = True
        for _ in range(frames):
            start = time.perf_counter_ns()
            result = conn.handle_line(Direction.AGENT_TO_CLIENT, chunk)
            samples.append(time.perf_counter_ns() - start)
            if not isinstance(result, dict):
                same = same and [f.raw for f in result.forward] == [chunk]
        out[name] = {"p50_us": statistics.median(samples) / 1000, "unchanged": float(same)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=200)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--json", action="store_true", help="one JSON object (bench/run.py)")
    args = parser.parse_args()
    decision = decision_cost(args.rules, args.requests)
    audited = decision_cost(args.rules, args.requests, audited=True)
    frames = frame_cost(args.rules, args.requests)
    if args.json:
        print(
            json.dumps(
                {
                    "rules": args.rules,
                    "requests": args.requests,
                    "decision": decision,
                    "audited": audited,
                    "frames": frames,
                }
            )
        )
        return
    print("| decision | rules | requests | p50 µs | p99 µs | max µs | CPU p50 µs | CPU p99 µs |")
    print("|---|---|---|---|---|---|---|---|")
    for name, d in (("alone", decision), ("with its audit entry", audited)):
        print(
            f"| {name} | {args.rules} | {args.requests} | {d['p50_us']:.1f} | {d['p99_us']:.1f} | "
            f"{d['max_us']:.1f} | {d['cpu_p50_us']:.1f} | {d['cpu_p99_us']:.1f} |"
        )
    print()
    print("| chain | frames | p50 µs per frame | bytes unchanged |")
    print("|---|---|---|---|")
    for name, f in frames.items():
        print(f"| {name} | {args.requests} | {f['p50_us']:.2f} | {bool(f['unchanged'])} |")


if __name__ == "__main__":
    main()
