"""Agents reached over WebSocket: ``--listen ws://`` / ``wss://`` and ``--connect ws[s]://``,
with a real client library (``websockets``' own asyncio client) against the real CLI as a
subprocess, ``tests/tiny_agent.py`` as the agent. One JSON-RPC message per text frame, bytes
unchanged; the bearer token checked before the upgrade (401 before any ACP message: no agent is
ever started for a refused request); never in a log line or a record. Only 127.0.0.1 is ever
connected to; 0.0.0.0 is only asked for (and refused)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import anyio
import orjson
import pytest
from proxy_harness import REPO, init_response, proxy_env, request, write_config
from test_sockets import PROXY, TINY, TIMEOUT, Proxy, listening, stream_note

websockets = pytest.importorskip("websockets")
from websockets.asyncio.client import connect as ws_connect  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

TOKEN = "s3cret-token-Zq9"  # noqa: S105 - the test's own token


def token_config(tmp_path: Path, extra: str = "") -> str:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return write_config(tmp_path / "remote.yaml", f"auth:\n  token_file: {token}\n{extra}")


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def ws_url(proxy: Proxy) -> str:
    url = str((await proxy.event("listening"))["address"])
    assert url.startswith(("ws://127.0.0.1:", "wss://127.0.0.1:")), url
    return url


def no_token_in(proxy: Proxy, *paths: Path) -> None:
    assert TOKEN.encode() not in proxy.stderr
    for path in paths:
        assert TOKEN.encode() not in path.read_bytes(), path


# -- an authenticated session -------------------------------------------------------------------


RULES = """\
rules:
  - name: tag
    match: {direction: client_to_agent, method: session/new}
    target: message
    set_meta: {example.dev/via: ws}
record:
  path: RECORDS
"""


@pytest.mark.anyio
async def test_authenticated_session_end_to_end_with_rules_and_records(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    config = token_config(tmp_path, RULES.replace("RECORDS", str(records)))
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "ws://127.0.0.1:0/acp", agent=TINY
        ) as proxy:
            url = await ws_url(proxy)
            assert url.endswith("/acp")
            async with ws_connect(url, additional_headers=bearer(), compression=None) as ws:
                # One message per text frame, each byte as the agent wrote it (no "\n").
                await ws.send(
                    request(1, "initialize", {"protocolVersion": 2}).rstrip(b"\n"), text=True
                )
                assert await ws.recv(decode=False) == init_response(1).rstrip(b"\n")
                # The rule changed the request on its way: the agent's echo shows it.
                await ws.send(
                    b'{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/w"}}',
                    text=True,
                )
                assert orjson.loads(await ws.recv(decode=False)) == {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "result": {"echo": {"cwd": "/w", "_meta": {"example.dev/via": "ws"}}},
                }
                # Notifications then the response: each its own frame, bytes unchanged.
                await ws.send(
                    request(3, "_test/stream", {"count": 3, "tag": "é"}).rstrip(b"\n"), text=True
                )
                got = [await ws.recv(decode=False) for _ in range(4)]
                assert got == [stream_note("é").rstrip(b"\n")] * 3 + [
                    b'{"jsonrpc":"2.0","id":3,"result":{"streamed":3}}'
                ]
                # A big integer passes byte-exact (never re-serialized).
                big = b'{"jsonrpc":"2.0","id":4,"method":"x","params":{"n":%d}}' % 2**70
                await ws.send(big, text=True)
                expected = b'{"jsonrpc":"2.0","id":4,"result":{"echo":{"n":%d}}}' % 2**70
                assert await ws.recv(decode=False) == expected
            await proxy.event("connection closed", conn=1)
            proxy.terminate()
            assert await proxy.wait() == 0
    [record] = list(records.glob("*.jsonl"))
    entries = [orjson.loads(line) for line in record.read_bytes().splitlines()]
    sent = [e for e in entries if e.get("dir") == "client_to_agent"]
    assert [orjson.loads(e["raw"])["id"] for e in sent] == [1, 2, 3, 4]
    assert sent[1]["changed_by"] == ["rules:tag"]
    assert entries[-1]["event"] == "end"
    no_token_in(proxy, record)
