"""The official TypeScript SDK's WebSocket client as a real peer of ``--listen ws://``.

``@agentclientprotocol/sdk`` 2.4.0 speaks ACP over WebSocket (``experimental/ws-client``: one
JSON-RPC message per text frame, headers through the ``ws`` package's constructor): its client
(``tests/agents/ts_ws_client.mjs``) drives ``tests/tiny_agent.py`` behind the real CLI, with the
bearer token, and is refused without it. Installed by ``python bench/setup_peers.py --only
ts-sdk``; CI (.ci/run) sets ``ACP_PROXY_REQUIRE_TS_SDK=1`` so that a missing one fails.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import anyio
import pytest
from listen_harness import TIMEOUT, TINY, listening
from proxy_harness import REPO, TESTS, proxy_env
from test_websocket import TOKEN, token_config, ws_url

CLIENT = TESTS / "agents" / "ts_ws_client.mjs"
PEERS = REPO / "bench" / "build" / "peers" / "node_modules"
SDK_WS = PEERS / "@agentclientprotocol" / "sdk" / "dist" / "transports" / "ws-stream.js"
WS = PEERS / "ws" / "wrapper.mjs"


@pytest.fixture
def node() -> str:
    found = shutil.which("node")
    if found is None or not SDK_WS.exists() or not WS.exists():
        if os.environ.get("ACP_PROXY_REQUIRE_TS_SDK") == "1":
            pytest.fail(
                "the TypeScript SDK or ws is missing: python bench/setup_peers.py --only ts-sdk"
            )
        pytest.skip(
            "no node, or the TypeScript SDK not installed (bench/setup_peers.py --only ts-sdk)"
        )
    return found


async def sdk_client(
    node: str, url: str, token: str, messages: list[object]
) -> tuple[int, list[object]]:
    ran = await anyio.run_process(
        [node, str(CLIENT)],
        env=proxy_env(
            ACP_URL=url,
            ACP_TOKEN=token,
            ACP_SEND=json.dumps(messages),
            ACP_TS_WS_CLIENT_MODULE=str(SDK_WS),
            ACP_WS_MODULE=str(WS),
        ),
        check=False,
    )
    return ran.returncode, [json.loads(line) for line in ran.stdout.splitlines()]


@pytest.mark.anyio
async def test_the_typescript_sdk_client_drives_an_agent_over_ws(tmp_path: Path, node: str) -> None:
    config = token_config(tmp_path)
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "ws://127.0.0.1:0/acp", agent=TINY
        ) as proxy:
            url = await ws_url(proxy)
            messages: list[object] = [
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {"protocolVersion": 2},
                },
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "_test/stream",
                    "params": {"count": 2, "tag": "t"},
                },
            ]
            code, got = await sdk_client(node, url, TOKEN, messages)
            assert code == 0, got
            note = {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": "s",
                    "update": {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": "t"},
                    },
                },
            }
            assert got == [
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "result": {"protocolVersion": 2, "agentCapabilities": {}, "authMethods": []},
                },
                note,
                note,
                {"jsonrpc": "2.0", "id": 2, "result": {"streamed": 2}},
            ]
            # A wrong token: the SDK's connection fails at the upgrade (401); no agent starts.
            code, got = await sdk_client(node, url, "wrong", messages[:1])
            assert code == 1
            assert got == [{"failed": "Unexpected server response: 401"}]
            await proxy.event("connection closed", conn=2)
            proxy.terminate()
            assert await proxy.wait() == 0
    assert proxy.count("agent started") == 1
    refused = [e for e in proxy.events if e["event"] == "WebSocket upgrade refused"]
    assert [e["status"] for e in refused] == [401]
