"""The cost of a policy decision, in process: one permission request through the policy link.

Contract: measures and prints; asserts nothing. Builds a ``policy:`` section of ``--rules``
rules (commands, path globs under ``{cwd}`` and ``**``, kinds, titles, agents; a mix like a
team's rule set, none of which matches the request until the last, so every rule is tried) and
times ``PolicyMiddleware.__call__`` on a v1 ``session/request_permission`` whose tool call state
comes from an earlier ``tool_call`` update (the summary, the paths resolved with the identity,
the decision, the answer), one call at a time with ``time.perf_counter_ns``; prints p50, p99
and max in microseconds.

Usage: ``python bench/policy.py [--rules 200] [--requests 20000]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.config import parse_config
from acp_proxy.policy.middleware import PolicyMiddleware
from acp_proxy.wire.chain import Direction, MessageContext


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
    mw({"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "s"}}, a2c)
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


if __name__ == "__main__":
    main()
