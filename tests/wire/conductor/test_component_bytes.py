"""``acp-proxy component``: what the standalone proxy forwards byte for byte (raw invalid
UTF-8 inside a message) passes the conductor connection the same way, in both directions; what
no envelope can carry gets an error for a request, never silence; warnings a peer can repeat at
will are logged once and counted. Real processes and pipes; the test plays the conductor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conductor_harness import Component, handshake, start, wrapped

pytestmark = pytest.mark.anyio

# A prompt whose text holds bytes that are not UTF-8 (a client's bug, or a binary paste).
BAD_PARAMS = b'{"sessionId":"s","prompt":[{"type":"text","text":"caf\xe9 \xff\xfe"}]}'
BAD_UPDATE = (
    b'{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk",'
    b'"content":{"type":"text","text":"\xc3\x28 \x80"}}}'
)


def _warnings(log: Path) -> list[dict[str, object]]:
    events = [json.loads(line) for line in log.read_bytes().splitlines()]
    return [
        {k: v for k, v in e.items() if k in ("event", "repeated")}
        for e in events
        if e.get("level") == "warning"
    ]


async def test_invalid_utf8_passes_both_ways_as_standalone_forwards_it() -> None:
    comp: Component = await start()
    await handshake(comp, "official")
    request = b'{"jsonrpc":"2.0","id":5,"method":"session/prompt","params":' + BAD_PARAMS + b"}"
    await comp.send(request)
    assert await comp.line() == wrapped("official", b"5", b"session/prompt", BAD_PARAMS)
    await comp.send(wrapped("official", None, b"session/update", BAD_UPDATE))
    assert await comp.line() == (
        b'{"jsonrpc":"2.0","method":"session/update","params":' + BAD_UPDATE + b"}"
    )
    await comp.send(wrapped("official", b"9", b"fs/write_text_file", BAD_UPDATE))
    assert await comp.line() == (
        b'{"jsonrpc":"2.0","id":9,"method":"fs/write_text_file","params":' + BAD_UPDATE + b"}"
    )
    answer = b'{"jsonrpc":"2.0","id":9,"result":{"text":"\xff"}}'
    await comp.send(answer)  # the client's answer, invalid UTF-8 too: byte for byte
    assert await comp.line() == answer
    await comp.send(b'{"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}}')
    assert await comp.line() == b'{"jsonrpc":"2.0","id":5,"result":{"stopReason":"end_turn"}}'
    rc, _ = await comp.close()
    assert rc == 0


async def test_a_request_no_envelope_can_carry_gets_an_error() -> None:
    comp: Component = await start()
    await handshake(comp, "official")
    await comp.send(b'{"jsonrpc":"2.0","id":"r8","method":"session/prompt","params":{"x":')
    assert json.loads(await comp.line()) == {
        "jsonrpc": "2.0",
        "id": "r8",
        "error": {
            "code": -32600,
            "message": "acp-proxy component: no envelope carries this message to the "
            "successor (not one JSON-RPC object); not forwarded",
        },
    }
    rc, _ = await comp.close()
    assert rc == 0


async def test_responses_to_ids_not_in_flight_are_logged_once_and_counted(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log.jsonl"
    comp: Component = await start("--log-file", str(log))
    await handshake(comp, "official")
    n = 30_000
    await comp.send(*(b'{"jsonrpc":"2.0","id":%d,"result":{}}' % (1000 + i) for i in range(n)))
    rc, _ = await comp.close()
    assert rc == 0
    event = "a response to no request in flight; dropped"
    assert _warnings(log) == [{"event": event}, {"event": event, "repeated": n - 1}]


async def test_a_request_over_the_frame_limit_gets_the_proxys_error() -> None:
    comp: Component = await start("--max-frame-bytes", "1000")
    await handshake(comp, "official")
    # Longer than one read of the conductor (256 KiB): it arrives in pieces.
    big = b'{"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"x":"' + b"a" * 300_000
    big += b'"}}'
    await comp.send(big)
    text = f"acp-proxy: message of {len(big)} bytes exceeds the 1000-byte limit; not forwarded"
    assert json.loads(await comp.line()) == {
        "jsonrpc": "2.0",
        "id": 4,
        "error": {"code": -32600, "message": text},
    }
    # The next line is read as usual.
    await comp.send(b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}')
    assert await comp.line() == wrapped("official", None, b"session/cancel", b'{"sessionId":"s"}')
    rc, _ = await comp.close()
    assert rc == 0
