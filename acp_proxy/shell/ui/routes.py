"""The live view's answers to the requests that are not a subscription.

Contract: owns what ``/``, ``/api/sessions``, ``/api/entities``, ``/history`` and ``/export``
answer (``respond``), and the HTTP heads they go out with; never writes to a socket (the server,
``acp_proxy.shell.ui.live_server``, sends what it returns, once the hub described what it was
told before the request: ``UiHub.catch_up``) and never writes to a session. A body that
grows with the session (``/history``, ``/export``) is not built whole: it is an async iterator
of bounded pieces read from the hub's history as they are sent (``PIECE_BYTES`` of events at a
time, nothing pinned beyond the piece in hand), and the export's parsing and encoding run in a
worker thread (``anyio.to_thread``), never on the session's event loop. Such a body ends early
when the events it would hold next were dropped meanwhile (``/events?since=`` says how many).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Final

import anyio
import anyio.lowlevel
import anyio.to_thread
import orjson

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.shell.ui.hub import UiHub
from acp_proxy.telemetry.endpoint import Request
from acp_proxy.ui import deepjson, display, events, export
from acp_proxy.ui.history import datas

PIECE_BYTES: Final = 256 * 1024  # events read from the history per piece of a body
_STATUS: Final = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    421: "Misdirected Request",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
# The page talks only to its own origin; no frame may embed it; the token never leaves in a
# Referer.
SECURITY_HEADERS: Final = (
    "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'\r\n"
    "X-Frame-Options: DENY\r\nX-Content-Type-Options: nosniff\r\n"
    "Referrer-Policy: no-referrer\r\nCache-Control: no-store\r\n"
)
NO_SESSION: Final = "no such session (conn=N: see /api/sessions)"

Body = bytes | tuple[bytes, AsyncGenerator[bytes]]  # a whole response, or a head and its pieces


def head(status: int, ctype: str, length: int | None, extra: str = "") -> bytes:
    """A response head (``length=None``: the body ends when the connection closes)."""
    size = f"Content-Length: {length}\r\n" if length is not None else ""
    return (
        f"HTTP/1.1 {status} {_STATUS.get(status, 'Error')}\r\nContent-Type: {ctype}\r\n"
        f"{size}{SECURITY_HEADERS}{extra}Connection: close\r\n\r\n"
    ).encode("latin-1")


def response(status: int, ctype: str, body: bytes, extra: str = "") -> bytes:
    return head(status, ctype, len(body), extra) + body


def text(status: int, message: str) -> bytes:
    return response(status, "text/plain; charset=utf-8", (message + "\n").encode())


def parse_int(value: str | None) -> int | None:
    if value is None or not value.isdigit():
        return None
    return int(value)


async def respond(hub: UiHub, page: bytes, request: Request) -> Body:
    """The answer to a request that is not a subscription (its checks passed)."""
    path = request.path
    if path in ("/", "/index.html"):
        return response(200, "text/html; charset=utf-8", page)
    if path == "/api/sessions":
        sessions = [
            {"conn": s.conn, "header": s.header, "ended": s.ended} for s in hub.sessions.values()
        ]
        body = display.shown_json(deepjson.compact({"sessions": sessions}))
        return response(200, "application/json", body)
    if path == "/history":
        # The replay as JSON Lines (a page loads it in one request, then subscribes to
        # /events?since=<the last seq>): much faster than one message each.
        since = parse_int(request.query.get("since")) or 0
        return head(200, "application/x-ndjson", None), _history(hub, since)
    conn = parse_int(request.query.get("conn"))
    session = hub.sessions.get(conn) if conn is not None else None
    if path == "/api/entities":
        if session is None:
            return text(404, NO_SESSION)
        # Encoded at once (no await): the view does not change under it.
        snapshot = deepjson.compact(session.view.snapshot())
        return response(200, "application/json", display.shown_json(snapshot))
    if path == "/export":
        if session is None:
            return text(404, NO_SESSION)
        if request.query.get("format") == "zed":
            writer: export.ZedWriter | export.RecordWriter = export.ZedWriter()
            return head(200, "application/json", None), _export(hub, session.conn, writer)
        disposition = f'Content-Disposition: attachment; filename="session-{conn}.jsonl"\r\n'
        writer = export.RecordWriter(session.header)
        return (
            head(200, "application/x-ndjson", None, disposition),
            _export(hub, session.conn, writer),
        )
    return text(404, "/, /events, /history, /api/sessions, /api/entities?conn=N, /export?conn=N")


async def _history(hub: UiHub, since: int) -> AsyncGenerator[bytes]:
    """``/history``'s body: the opening lines, then the events after ``since``, a piece at a
    time."""
    history = hub.history
    missing = max(0, history.first_seq - since - 1)
    lines = [orjson.dumps(events.hello(hub.mode, hub.builder.head))]
    if missing:
        lines.append(orjson.dumps({"event": "truncated", "lost": missing}))
    yield b"\n".join(lines) + b"\n"
    offset = history.offset_of(since + 1)
    while (found := history.read(offset, PIECE_BYTES)) is not None and found[0]:
        parts, offset = found
        lines = [data for part in parts for data in datas(part)]
        yield b"\n".join(lines) + b"\n"
        await anyio.lowlevel.checkpoint()


async def _export(
    hub: UiHub, conn: int, writer: export.ZedWriter | export.RecordWriter
) -> AsyncGenerator[bytes]:
    """``/export``'s body: session ``conn``'s events held, parsed and encoded a piece at a time
    in a worker thread."""
    history = hub.history
    offset = history.start
    while (found := history.read(offset, PIECE_BYTES)) is not None and found[0]:
        parts, offset = found
        piece = await anyio.to_thread.run_sync(_export_piece, writer, parts, conn)
        if piece:
            yield piece
    if isinstance(writer, export.ZedWriter):
        yield writer.close()
    else:
        yield writer.feed(())  # the header, if no event came


def _export_piece(
    writer: export.ZedWriter | export.RecordWriter, parts: list[bytes | memoryview], conn: int
) -> bytes:
    held: list[JsonObject] = []
    for part in parts:
        for data in datas(part):
            event = orjson.loads(data)
            if event.get("conn") == conn:
                held.append(event)
    return writer.feed(held)
