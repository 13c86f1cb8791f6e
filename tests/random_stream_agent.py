"""A fake ACP v2 agent that streams a random mix of session updates, for the paused-client tests.

    random_stream_agent.py --seed S --updates N

Answers ``initialize`` (protocolVersion 2), then writes the ``stream(S, N)`` notifications to
stdout as fast as the pipe takes them and exits (its stdin is not read again). The stream has
many entities (tool calls, messages, thoughts, terminals, plans), ``_meta`` patches with key
removals and whole clears, text chunks and snapshots, so that a paused client's queue has much to
merge and much that must not be lost. Only the standard library, so it starts quickly; the test
imports ``stream`` to compute the state the client must end in.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

SESSION = "sess_r"


def _meta_patches(rng: random.Random, count: int) -> list[str]:
    """``count`` encoded top-level ``_meta`` patches: clears, key removals, values, mixes."""
    out = []
    for n in range(count):
        if n % 12 == 0:
            out.append("null")  # clear the whole metadata
            continue
        patch = {}
        for _ in range(rng.randrange(1, 4)):
            key = f"x.dev/k{rng.randrange(5)}"
            patch[key] = None if rng.random() < 0.35 else {"v": rng.randrange(1000)}
        out.append(json.dumps(patch, separators=(",", ":")))
    rng.shuffle(out)
    return out


def stream(seed: int, updates: int) -> list[bytes]:
    """The notifications the agent writes (each a line without its newline): a mix drawn from
    ``seed`` (how many entities, what share of tool call updates), cheap enough to draw 40,000
    in a fraction of a second."""
    rng = random.Random(seed)
    entities = rng.choice([20, 200, 2000])
    calls = rng.choice([0.4, 0.9])  # a mixed stream, or one of mostly tool call updates
    metas = _meta_patches(rng, 97)
    statuses = ("pending", "in_progress", "completed", "failed")
    head = '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"' + SESSION
    head += '","update":{'
    out = []
    draws = [rng.random() for _ in range(updates)]
    picks = [rng.randrange(1 << 30) for _ in range(updates)]
    for i in range(updates):
        roll, pick = draws[i], picks[i]
        entity = pick % entities
        bits = pick >> 11
        meta = metas[(pick >> 3) % len(metas)]
        if roll < calls:
            body = f'"sessionUpdate":"tool_call_update","toolCallId":"call_{entity}"'
            if bits & 1:
                body += f',"status":"{statuses[(bits >> 1) & 3]}"'
            if bits & 8:
                body += f',"title":"tool {entity} step {i}"'
            if bits & 16:
                pad = "p" * ((bits >> 9) % 200)
                body += ',"rawOutput":{"progress":' + str(i) + ',"pad":"' + pad + '"}'
            if bits & 32:
                body += ',"content":[{"type":"content","content":{"type":"text","text":"out '
                body += str(i) + '"}}]'
            if bits & 192:
                body += ',"_meta":' + meta
        else:
            roll = (roll - calls) / (1 - calls)
            if roll < 0.4:
                kind = "agent_message_chunk" if bits & 1 else "agent_thought_chunk"
                text = f"w{i} " * (1 + (bits >> 2) % 11)
                body = (
                    f'"sessionUpdate":"{kind}","messageId":"m_{entity % 7}",'
                    f'"content":{{"type":"text","text":"{text}"}}'
                )
            elif roll < 0.6:
                body = f'"sessionUpdate":"terminal_update","terminalId":"term_{entity % 5}"'
                if bits & 1:
                    body += f',"command":"make {i}"'
                if bits & 6:
                    body += ',"_meta":' + meta
            elif roll < 0.75:
                entries = ",".join(
                    '{"content":"step ' + str(j) + '","priority":"medium","status":"pending"}'
                    for j in range(1 + bits % 3)
                )
                body = (
                    '"sessionUpdate":"plan_update","plan":{"type":"items",'
                    f'"planId":"plan_{entity % 3}","entries":[{entries}]}}'
                )
            elif roll < 0.9:
                body = f'"sessionUpdate":"usage_update","used":{i},"size":200000'
            else:
                body = f'"sessionUpdate":"agent_message","messageId":"m_{entity % 7}"'
                if bits & 1:
                    body += f',"content":[{{"type":"text","text":"whole {i}"}}]'
                body += ',"_meta":' + meta
        out.append((head + body + "}}}").encode())
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--updates", type=int, default=40_000)
    args = parser.parse_args()
    lines = stream(args.seed, args.updates)
    init = json.loads(sys.stdin.buffer.readline())
    out = sys.stdout.buffer
    result = {"protocolVersion": 2, "info": {"name": "random-stream", "version": "1"}}
    reply = {"jsonrpc": "2.0", "id": init["id"], "result": {**result, "capabilities": {}}}
    out.write(json.dumps(reply).encode() + b"\n")
    out.flush()
    data = b"\n".join(lines) + b"\n"
    view = memoryview(data)
    step = 1 << 16
    for start in range(0, len(view), step):
        out.write(view[start : start + step])
    out.flush()


if __name__ == "__main__":
    main()
