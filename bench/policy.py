"""The cost of a policy decision, in process: one permission request through the policy link.

Contract: measures and prints; asserts nothing. Builds a ``policy:`` section of ``--rules``
rules (commands, path globs under ``{cwd}`` and ``**``, kinds, titles, agents; a mix like a
team's rule set, none of which matches the request until the last, so every rule is tried) and
times ``PolicyMiddleware.__call__`` on a v1 ``session/request_permission`` whose tool call state
comes from an earlier ``tool_call`` update (the summary, the paths resolved with the identity,
the decision, the answer), one call at a time with ``time.perf_counter_ns``; prints p50, p99
and max in microseconds. Then a frame no policy concerns through a connection without and
with the policy link: the median cost per frame, and whether its bytes leave unchanged.

Usage: ``python bench/policy.py [--rules 200] [--requests 20000]``.
"""

from __future__ import annotations

import argparse
import functools
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=200)
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    config = parse_config(policy_text(args.rules), "bench.yaml", {"HOME": "/home/bench"})
    assert config.policy is not None
    mw = PolicyMiddleware(config.policy, None, lambda path: path)
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
    samples = []
    clock = time.perf_counter_ns
    for _ in range(args.requests):
        start = clock()
        mw(request, a2c)
        samples.append(clock() - start)
    samples.sort()
    p50 = statistics.median(samples) / 1000
    p99 = samples[int(len(samples) * 0.99)] / 1000
    print("| rules | requests | p50 µs | p99 µs | max µs |")
    print("|---|---|---|---|---|")
    print(f"| {args.rules} | {args.requests} | {p50:.1f} | {p99:.1f} | {samples[-1] / 1000:.1f} |")
    print()
    passthrough(config, args.requests)


def passthrough(config: Config, n: int) -> None:
    """A frame no policy concerns (a 2 KiB message chunk), through a connection without a
    policy and with one: the bytes out are the bytes in, and what the needles cost."""
    chunk = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"'
        + b"x" * 2048
        + b'"}}}}'
    )
    init = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2}}'
    ok = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2,"capabilities":{}}}'
    print("| chain | frames | p50 µs per frame | bytes unchanged |")
    print("|---|---|---|---|")
    assert config.policy is not None
    factory = functools.partial(PolicyMiddleware, config.policy, None, lambda path: path)
    for name, chain in (
        ("no policy", Chain([])),
        ("policy", Chain([Link(cast(Middleware, factory()))])),
    ):
        conn = Connection(chain)
        conn.handle(Direction.CLIENT_TO_AGENT, Line(init))
        conn.handle(Direction.AGENT_TO_CLIENT, Line(ok))
        samples = []
        same = True
        for _ in range(n):
            start = time.perf_counter_ns()
            out = conn.handle_line(Direction.AGENT_TO_CLIENT, chunk)
            samples.append(time.perf_counter_ns() - start)
            if not isinstance(out, dict):
                same = same and [f.raw for f in out.forward] == [chunk]
        print(f"| {name} | {n} | {statistics.median(samples) / 1000:.2f} | {same} |")


if __name__ == "__main__":
    main()
