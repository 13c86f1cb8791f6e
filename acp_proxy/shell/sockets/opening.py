"""The opening of a ``--listen`` connection: what its first bytes are, and what it is told.

Contract: owns deciding, from the first bytes a client sends, whether the connection is ACP (a
first line that is not HTTP), an HTTP request (refused before any agent exists) or nothing, while
holding a bounded amount of it; and the bytes a connection is told before any session (the 403
to an HTTP request, a JSON-RPC error line with ``id: null``). Pure: it never reads or writes a
socket, and beyond the first line it never looks inside a frame.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Final

from acp_proxy.wire.errors import SERVER_ERROR, error_bytes

# A browser lets any web page send an HTTP request to a loopback port (a form POST, fetch, a
# WebSocket upgrade); its body could be a JSON-RPC line the agent would act on (cross-protocol
# request, the class of CVE-2025-49596). No ACP client starts with an HTTP request line, so one
# is refused before any agent exists. Request methods of RFC 9110 section 9 plus PATCH (RFC 5789),
# and the HTTP/2 connection preface (RFC 9113 section 3.4).
HTTP_OPENINGS: Final = (
    b"GET ",
    b"POST ",
    b"OPTIONS ",
    b"PUT ",
    b"HEAD ",
    b"CONNECT ",
    b"DELETE ",
    b"PATCH ",
    b"TRACE ",
    b"PRI * HTTP/2",
)
_LONGEST_OPENING: Final = max(len(token) for token in HTTP_OPENINGS)
# At most this much of a first line is held before the session starts (docs/bounds.md).
OPENING_HOLD_BYTES: Final = 64 * 1024
# What framing.LineSplitter counts as whitespace (bytes.isspace): such lines carry no message.
_BLANK: Final = re.compile(rb"[ \t\n\r\x0b\x0c]*")


class Opening(Enum):
    """What the first bytes of a connection are, so far."""

    MORE = "more"  # undecided: need more input
    FRAME = "frame"  # a first line (complete, or longer than the frame limit) that is not HTTP
    HTTP = "http"  # an HTTP request line or the HTTP/2 preface
    EMPTY = "empty"  # the client closed without sending anything but blank lines


class OpeningReader:
    """The first bytes of a ``--listen`` connection, held until they decide what it is.

    ``feed`` each chunk; ``end`` at EOF. ``buffer`` is what to hand to the session once the
    answer is ``FRAME``: the bytes as received, except whitespace-only lines before the first
    message (which framing drops anyway), so memory stays bounded by ``limit`` (the frame limit:
    a first line longer than that is handed over as it is, for the session to reject).
    ``method`` names the HTTP method (``PRI`` for the HTTP/2 preface) once the answer is ``HTTP``.
    """

    __slots__ = ("_limit", "_scanned", "_text_at", "buffer", "method")

    def __init__(self, limit: int) -> None:
        self.buffer = bytearray()
        self.method = ""
        self._limit = limit
        self._text_at = -1  # index of the first non-blank byte in ``buffer``; -1: none yet
        self._scanned = 0  # where the search for a newline (or a non-blank byte) resumes

    def feed(self, data: bytes) -> Opening:
        """The verdict with ``data`` appended (``MORE`` until it is decided)."""
        self.buffer += data
        if self._text_at < 0:
            # Before ``_scanned`` everything is blank and has no newline (complete blank lines
            # were dropped): only the new bytes need looking at.
            blank = _BLANK.match(self.buffer, self._scanned)
            assert blank is not None  # the pattern matches the empty string
            text_at = blank.end()
            cut = self.buffer.rfind(b"\n", self._scanned, text_at) + 1
            del self.buffer[:cut]
            text_at -= cut
            if text_at == len(self.buffer):  # still nothing but blanks
                self._scanned = text_at
                return Opening.FRAME if text_at > self._limit else Opening.MORE
            self._text_at = self._scanned = text_at
        head = bytes(self.buffer[self._text_at : self._text_at + _LONGEST_OPENING])
        for token in HTTP_OPENINGS:
            if head.startswith(token):
                self.method = token.partition(b" ")[0].decode()
                return Opening.HTTP
        if any(token.startswith(head) for token in HTTP_OPENINGS):
            return Opening.MORE  # e.g. "PO": could still become "POST "
        if self.buffer.find(b"\n", self._scanned) >= 0 or len(self.buffer) > self._limit:
            return Opening.FRAME
        if len(self.buffer) - self._text_at > OPENING_HOLD_BYTES:
            # Not HTTP, and a long first line: hand it over now rather than hold it here, where
            # the process-wide buffer budget does not see it (12 clients x 15 MiB first lines
            # held 180 MiB outside the budget).
            return Opening.FRAME
        self._scanned = len(self.buffer)
        return Opening.MORE

    def end(self) -> Opening:
        """The verdict at EOF: an unterminated first line is still a frame (framing delivers
        it at EOF), and a prefix of an HTTP opening that never completed is not HTTP."""
        return Opening.EMPTY if self._text_at < 0 else Opening.FRAME


def http_forbidden() -> bytes:
    """The reply to an HTTP request: a minimal 403 with ``Connection: close``, so a browser
    fails the request at once instead of waiting; no CORS header, so a page cannot read it."""
    body = (
        b"acp-proxy: this socket speaks ACP (newline-delimited JSON-RPC), not HTTP; "
        b"HTTP requests are refused\n"
    )
    return (
        b"HTTP/1.1 403 Forbidden\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\n"
        b"Connection: close\r\n"
        b"\r\n" % len(body)
    ) + body


def error_line(message: str) -> bytes:
    """A JSON-RPC error response with ``id: null`` (JSON-RPC 2.0 section 5: the id of the
    request could not be determined): the only way to tell a client why before any request."""
    return error_bytes(None, SERVER_ERROR, message) + b"\n"
