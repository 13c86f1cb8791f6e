"""``--listen``: an agent that dies at start leaves its connection answering, as on stdio.

Every request the client writes on that connection is answered with the error the pending one
got (``agent exited with status 1 during METHOD: LAST STDERR LINE``), until the client closes
its side or stays silent for the linger time; no request is read and left unanswered. A real
proxy on ``tcp://127.0.0.1:0`` and a real agent that crashes."""

from __future__ import annotations

import anyio
import pytest
from listen_harness import TIMEOUT, listening
from proxy_harness import Lines, request

pytestmark = pytest.mark.anyio

CRASH = ["sh", "-c", "cat >/dev/null & echo 'Error: no key' >&2; sleep 0.2; exit 1"]


def _died(rid: int, method: str) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":%d,"error":{"code":-32603,"message":"agent exited with status 1 '
        b'during %s: Error: no key","data":{"stderr":"Error: no key"}}}\n' % (rid, method.encode())
    )


async def test_every_request_after_the_crash_is_answered_until_the_client_closes() -> None:
    async with listening("--listen", "tcp://127.0.0.1:0", agent=CRASH) as proxy:
        with anyio.fail_after(TIMEOUT):
            stream = await proxy.connect()
            lines = Lines(stream)
            await stream.send(request(1, "initialize", {}))
            first = await lines.line()
            await proxy.event("agent exited with status 1")
            answers = []
            for rid, method in ((2, "session/new"), (3, "session/prompt")):
                await stream.send(request(rid, method, {}))
                answers.append(await lines.line())
            await stream.send_eof()  # the client is done: the connection ends at once
            rest = await lines.rest()
            await stream.aclose()
            closed = await proxy.event("connection closed")
            proxy.terminate()
    assert first == _died(1, "initialize")
    assert answers == [_died(2, "session/new"), _died(3, "session/prompt")]
    assert rest == b""
    assert closed["status"] == "agent exited with status 1"


async def test_a_silent_client_is_let_go_after_the_linger() -> None:
    async with listening("--listen", "tcp://127.0.0.1:0", agent=CRASH) as proxy:
        with anyio.fail_after(TIMEOUT):
            stream = await proxy.connect()
            lines = Lines(stream)
            await stream.send(request(1, "initialize", {}))
            first = await lines.line()
            rest = await lines.rest()  # the proxy closes the connection on its own
            await stream.aclose()
            await proxy.event("connection closed")
            proxy.terminate()
    assert (first, rest) == (_died(1, "initialize"), b"")
