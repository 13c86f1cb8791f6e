"""The cost of the budgets per message, in process: frames through a connection without and
with the budgets link.

Contract: measures and prints; asserts only that each path did its work. Rows: a 2 KiB
``agent_message_chunk`` (a frame the budgets never parse: their needles), a ``usage_update``
whose cost grows (parsed, metered, written), a ``tool_call_update`` (counted, the loop guard),
each through a v2 connection without budgets, with budgets writing to memory, and with budgets
writing the real state file (flock, write, fsync, rename per change); and a ``session/prompt``
refused by a crossed limit. Prints the median µs per frame, and its ratio to the row without
budgets measured in the same run.

Usage: ``python bench/budgets.py [--frames 5000]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from acp_proxy.budget.ledger import Ledger
from acp_proxy.budget.middleware import BudgetMiddleware
from acp_proxy.budget.model import Action, Limit, Meter
from acp_proxy.shell.budgets import StateFile
from acp_proxy.wire.chain import Chain, Direction, Link, Middleware
from acp_proxy.wire.framing import Line
from acp_proxy.wire.pipeline import Connection

A2C, C2A = Direction.AGENT_TO_CLIENT, Direction.CLIENT_TO_AGENT
LIMITS = (
    Limit("cost", Meter.COST, 1e12, warn_at=(0.8,)),
    Limit("loop", Meter.REPEATED_TOOL_CALL, 1e12, action=Action.CANCEL_TURN),
    Limit("turns", Meter.TURNS, 1e12),
)
INIT = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2}}'
OK = b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2,"capabilities":{}}}'


def chunk(i: int) -> bytes:
    return (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"agent_message_chunk","messageId":"m","content":{"type":"text",'
        b'"text":"' + b"x" * 2048 + b'"}}}}'
    )


def usage(i: int) -> bytes:
    return (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"usage_update","used":1000,"size":200000,"cost":{"amount":%d.5,'
        b'"currency":"USD"}}}}' % i
    )


def tool(i: int) -> bytes:
    return (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"tool_call_update","toolCallId":"c%d","title":"Run ls","kind":'
        b'"execute","status":"pending","rawInput":{"command":"ls %d"}}}}' % (i, i)
    )


def connection(chain: Chain) -> Connection:
    conn = Connection(chain)
    conn.handle(C2A, Line(INIT))
    conn.handle(A2C, Line(OK))
    return conn


def median_us(conn: Connection, direction: Direction, frames: list[bytes]) -> float:
    samples = []
    clock = time.perf_counter_ns
    for frame in frames:
        start = clock()
        conn.handle_line(direction, frame)
        samples.append(clock() - start)
    return statistics.median(samples) / 1000


def link(persist: Callable[[Ledger], Callable[[bool], str | None]]) -> tuple[Chain, Ledger]:
    ledger = Ledger(LIMITS)
    mw = BudgetMiddleware(ledger, time.time, persist(ledger))
    return Chain([Link(cast(Middleware, mw))]), ledger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=5000)
    args = parser.parse_args()
    n = args.frames
    tmp = Path(tempfile.mkdtemp())
    print("| frame | chain | frames | p50 µs per frame | x without budgets |")
    print("|---|---|---|---|---|")
    for name, make in (
        ("2 KiB message chunk", chunk),
        ("usage_update", usage),
        ("tool call", tool),
    ):
        frames = [make(i) for i in range(n)]
        base = median_us(connection(Chain([])), A2C, frames)
        print(f"| {name} | no budgets | {n} | {base:.2f} | 1.00 |")

        def in_memory(ledger: Ledger) -> Callable[[bool], str | None]:
            def persist(durable: bool) -> None:
                ledger.saved()

            return persist

        chain, _ = link(in_memory)
        got = median_us(connection(chain), A2C, frames)
        print(f"| {name} | budgets, state in memory | {n} | {got:.2f} | {got / base:.2f} |")
        path = str(tmp / f"{name.replace(' ', '-')}.json")
        chain, ledger = link(lambda ledger, path=path: StateFile(path, ledger).sync)  # type: ignore[misc]
        got = median_us(connection(chain), A2C, frames[: max(n // 10, 100)])
        print(
            f"| {name} | budgets, state file | {max(n // 10, 100)} | {got:.2f} | {got / base:.2f} |"
        )
        if name != "2 KiB message chunk":
            assert ledger.to_json()["limits"], "nothing was metered"
    chain, ledger = link(lambda ledger: StateFile(str(tmp / "prompt.json"), ledger).sync)
    ledger.overrides["turns"] = 0.0  # crossed: every prompt is refused
    conn = connection(chain)
    prompts = [
        b'{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":{"sessionId":"s",'
        b'"prompt":[{"type":"text","text":"hi"}]}}' % (i + 1)
        for i in range(max(n // 10, 100))
    ]
    got = median_us(conn, C2A, prompts)
    print(f"| session/prompt, refused | budgets, state file | {len(prompts)} | {got:.2f} | - |")


if __name__ == "__main__":
    main()
