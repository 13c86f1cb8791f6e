"""Fault injection: what a direct connection delivers, the proxy delivers.

Each case runs the real proxy (``python -m acp_proxy``) with a scripted agent
(``fake_agent.py --replay``) over real pipes, and checks the client's bytes. Every case failed on
the main branch before the exact-rewrite work: numbers changed by a rewrite, frames orjson
refuses dropped, log lines forwarded, and a float ``protocolVersion`` silently disabling every
rule.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from proxy_harness import proxy_cmd, run, write_config

pytestmark = pytest.mark.anyio

RULES = """
rules:
  - name: edge-route
    match: {direction: agent_to_client, update: [tool_call_update]}
    set_meta: {example.dev/route: edge}
"""

INIT = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize",'
    b'"params":{"protocolVersion":2,"clientCapabilities":{}}}'
)
INIT_OK = (
    b'{"jsonrpc":"2.0","id":0,"result":'
    b'{"protocolVersion":2,"agentCapabilities":{},"authMethods":[]}}'
)
PROMPT = (
    b'{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}'
)
# A tool_call_update the rule rewrites, holding what orjson cannot carry: integers outside
# [-2**63, 2**64), a number beyond a double, a lone surrogate, odd spellings and whitespace.
EXOTIC_UPDATE = (
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
    b'{"sessionUpdate":"tool_call_update","toolCallId":"t1","rawOutput":'
    b'{"big":18446744073709551617,"neg":-9223372036854775809,"huge":1e400,"spelled":1.50E+2,'
    b'"s":"\\ud800 \\u00e9\\/"}, "status" : "in_progress"}}}'
)
META = b',"_meta":{"example.dev/route":"edge"}'
# The scripted agent exits without answering the prompt: the proxy owes the client this.
ABORTED = (
    b'{"jsonrpc":"2.0","id":1,"error":{"code":-32603,'
    b'"message":"agent exited with status 0 during session/prompt"}}'
)


def exact(line: bytes) -> Any:
    return json.loads(line, parse_float=Decimal)


def script(tmp_path: Path, lines: list[bytes]) -> str:
    path = tmp_path / "script.txt"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


async def proxy(tmp_path: Path, lines: list[bytes], client: list[bytes], *args: str) -> Any:
    config = write_config(tmp_path / "rules.yaml", RULES)
    cmd = proxy_cmd(
        "--config",
        config,
        "--log-format",
        "json",
        *args,
        agent=["--replay", script(tmp_path, lines)],
    )
    return await run(cmd, b"".join(c + b"\n" for c in client))


async def test_rewritten_update_keeps_every_number_and_escape(tmp_path: Path) -> None:
    ran = await proxy(
        tmp_path,
        [b"C " + INIT, b"A " + INIT_OK, b"C " + PROMPT, b"A " + EXOTIC_UPDATE],
        [INIT, PROMPT],
    )
    lines = ran.stdout.splitlines()
    assert lines[0] == INIT_OK
    # Only the new member is new: every other byte is the agent's.
    assert lines[1] == EXOTIC_UPDATE.replace(b' "in_progress"}', b' "in_progress"' + META + b"}")
    assert exact(lines[1])["params"]["update"]["rawOutput"]["big"] == 2**64 + 1


async def test_rewritten_batch_keeps_every_number(tmp_path: Path) -> None:
    other = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"plan","entries":[],"n":18446744073709551617}}}'
    )
    batch = b"[" + EXOTIC_UPDATE + b" , " + other + b"]"
    ran = await proxy(
        tmp_path,
        [b"C " + INIT, b"A " + INIT_OK, b"C " + PROMPT, b"A " + batch],
        [INIT, PROMPT],
    )
    lines = ran.stdout.splitlines()
    assert lines[1] == batch.replace(b' "in_progress"}', b' "in_progress"' + META + b"}")


@pytest.mark.parametrize(
    "result",
    [
        b'{"text":"\\ud800"}',  # a lone surrogate escape: orjson refuses it
        b'{"n":1e400}',  # beyond a double: orjson refuses it
        b'{"deep":' + b"[" * 1100 + b"]" * 1100 + b"}",  # deeper than any parser here goes
        b'{"text":"\xff\xfe"}',  # not UTF-8
    ],
    ids=["lone-surrogate", "1e400", "deep", "not-utf8"],
)
async def test_response_a_parser_refuses_is_delivered(tmp_path: Path, result: bytes) -> None:
    response = b'{"jsonrpc":"2.0","id":1,"result":' + result + b"}"
    ran = await proxy(
        tmp_path,
        [b"C " + INIT, b"A " + INIT_OK, b"C " + PROMPT, b"A " + response],
        [INIT, PROMPT],
    )
    assert ran.stdout.splitlines() == [INIT_OK, response]
    assert ran.rc == 0


async def test_rule_matched_update_a_parser_refuses_is_delivered(tmp_path: Path) -> None:
    # Delivered untouched when no parse is possible (never dropped), with a warning.
    update = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"tool_call_update","toolCallId":"t1","rawOutput":'
        + b"[" * 1100
        + b"]" * 1100
        + b"}}}"
    )
    ran = await proxy(
        tmp_path,
        [b"C " + INIT, b"A " + INIT_OK, b"C " + PROMPT, b"A " + update],
        [INIT, PROMPT],
    )
    assert ran.stdout.splitlines() == [INIT_OK, update, ABORTED]
    warned = ran.events(
        "frame could not be parsed; forwarded untouched, no rule applied"
        " (further ones are only counted)"
    )
    assert [e["direction"] for e in warned] == ["agent_to_client"]


async def test_log_lines_that_start_like_json_are_diverted(tmp_path: Path) -> None:
    logs = [b"[INFO] Starting server", b"[2026-12-03 10:00:00] debug", b"{not json} x"]
    ran = await proxy(
        tmp_path,
        [b"C " + INIT, b"A " + INIT_OK, *(b"A " + line for line in logs)],
        [INIT],
    )
    assert ran.stdout.splitlines() == [INIT_OK]
    assert b"[INFO] Starting server" in ran.stderr


async def test_float_protocol_version_keeps_the_rules_and_says_so(tmp_path: Path) -> None:
    init_ok = INIT_OK.replace(b'"protocolVersion":2', b'"protocolVersion":2.0')
    update = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed"}}}'
    )
    ran = await proxy(
        tmp_path,
        [b"C " + INIT, b"A " + init_ok, b"C " + PROMPT, b"A " + update],
        [INIT, PROMPT],
    )
    assert ran.stdout.splitlines() == [init_ok, update[:-3] + META + b"}}}", ABORTED]
    [event] = ran.events("initialize response has an unusual protocolVersion")
    assert (event["protocol_version"], event["action"]) == ("2.0", "treated as 2")


async def test_error_reply_echoes_a_big_request_id(tmp_path: Path) -> None:
    # An oversize request gets an error for its id, spelled as the client spelled it.
    big = (
        b'{"jsonrpc":"2.0","id":18446744073709551616,"method":"session/prompt","params":{"x":"'
        + b"a" * 5000
        + b'"}}'
    )
    ran = await proxy(
        tmp_path, [b"C " + INIT, b"A " + INIT_OK], [INIT, big], "--max-frame-bytes", "4096"
    )
    [reply] = [line for line in ran.stdout.splitlines() if line != INIT_OK]
    assert reply.startswith(b'{"jsonrpc":"2.0","id":18446744073709551616,"error":{"code":-32600,')


@pytest.mark.parametrize(
    "rid", [b"18446744073709551616", b"-9223372036854775809", b'"\\u00e9"', b"1E2"]
)
async def test_error_at_agent_exit_echoes_the_request_id_bytes(tmp_path: Path, rid: bytes) -> None:
    prompt = PROMPT.replace(b'"id":1', b'"id":' + rid)
    ran = await proxy(tmp_path, [b"C " + INIT, b"A " + INIT_OK, b"C " + prompt], [INIT, prompt])
    assert ran.stdout.splitlines() == [INIT_OK, ABORTED.replace(b'"id":1', b'"id":' + rid)]
