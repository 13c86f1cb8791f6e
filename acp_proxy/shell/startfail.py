"""A session that cannot run still answers the editor: each request gets an error.

Contract: owns what the client hears when there is no agent to answer it: the agent command
cannot be started (not found, not executable), the agent died (after the errors for the
requests it left in flight), or the proxy refused to start (a config error). Every request the
client sends is answered with a JSON-RPC ``-32603`` error naming the failure and the request's
method ("agent could not be started (x: command not found) during initialize"), echoing the
request's id bytes, until the client closes its side, sends nothing for ``LINGER_S`` after an
answer, or sends no request within ``FIRST_WAIT_S``. Editors show that message; a proxy that
exited instead left the editor reading EOF. It never starts anything and reads at most
``MAX_LINE`` bytes of a line (longer ones skipped).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc
import orjson

from acp_proxy.shell.transports import STREAM_ERRORS
from acp_proxy.wire import rawscan
from acp_proxy.wire.errors import INTERNAL_ERROR, error_bytes
from acp_proxy.wire.framing import Line, LineSplitter
from acp_proxy.wire.rawjson import Unparseable
from acp_proxy.wire.tracking import is_id

# The longest wait for the client's first request (an editor sends ``initialize`` at once).
FIRST_WAIT_S = 5.0
# After an answer, how long more requests are answered while the client stays silent.
LINGER_S = 0.5
# The longest line read; a longer one is skipped up to its newline.
MAX_LINE = 1024 * 1024
# The messages of a refusal carried in ``error.data.errors`` (a config file can hold many).
MAX_DATA_ERRORS = 20


async def answer_start_failure(client: anyio.abc.ByteStream, reason: str, log: Any) -> int:
    """Answer each request read from ``client`` with ``agent could not be started (REASON)
    during METHOD``; returns how many were answered."""
    answered = await answer_requests(client, f"agent could not be started ({reason})")
    if answered:
        log.info("requests answered: the agent could not be started", count=answered)
    return answered


async def answer_refusal(
    messages: Sequence[str], client: anyio.abc.ByteStream | None = None
) -> int:
    """The proxy refused to start: answer the requests read from ``client`` (default: its
    stdin/stdout) with ``acp-proxy could not start (FIRST MESSAGE[; and N more]) during
    METHOD``, the messages in ``error.data.errors``; returns how many were answered. Not on a
    terminal: a person there read the error on stderr, and would wait for the proxy instead."""
    from acp_proxy.shell.transports import stdio_stream

    if client is None and os.isatty(0):
        return 0
    reason = messages[0]
    if len(messages) > 1:
        reason += f"; and {len(messages) - 1} more"
    data = orjson.dumps({"errors": list(messages[:MAX_DATA_ERRORS])})
    stream = client if client is not None else stdio_stream()
    try:
        return await answer_requests(stream, f"acp-proxy could not start ({reason})", data=data)
    finally:
        if client is None:
            await stream.aclose()


async def answer_requests(
    client: anyio.abc.ByteStream,
    message: str,
    *,
    detail: str | None = None,
    data: bytes | None = None,
    first_wait_s: float = FIRST_WAIT_S,
) -> int:
    """Answer each request read from ``client`` with ``MESSAGE during METHOD`` (then
    ``: DETAIL``; ``data`` as ``error.data``), waiting at most ``first_wait_s`` for the first;
    returns how many were answered."""
    answered = 0
    splitter = LineSplitter(MAX_LINE)  # a longer line is dropped up to its newline
    deadline = time.monotonic() + first_wait_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        chunk = b""
        with anyio.move_on_after(left):
            try:
                chunk = await client.receive()
            except STREAM_ERRORS:
                break
        if not chunk:
            continue  # timed out: the deadline check ends the loop
        for event in splitter.feed(chunk):
            if not isinstance(event, Line):
                continue
            frame = _error_for(event.raw, message, detail, data)
            if frame is not None:
                try:
                    await client.send(frame + b"\n")
                except STREAM_ERRORS:
                    return answered
                answered += 1
                deadline = time.monotonic() + LINGER_S
    return answered


def _error_for(raw: bytes, failure: str, detail: str | None, data: bytes | None) -> bytes | None:
    """The error owed for the request ``raw``, or None when it is not a request."""
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(message, dict):
        return None
    method = message.get("method")
    if not isinstance(method, str) or "id" not in message or not is_id(message["id"]):
        return None
    try:
        id_bytes = rawscan.id_bytes(raw.strip()) or b"null"
    except Unparseable:
        return None
    text = f"{failure} during {method}: {detail}" if detail else f"{failure} during {method}"
    return error_bytes(id_bytes, INTERNAL_ERROR, text, data)
