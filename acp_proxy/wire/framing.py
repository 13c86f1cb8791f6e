"""Newline-delimited framing: bytes in, frames out, with a hard bound on the size of one frame.

Contract: this module owns how a byte stream becomes frames (ACP digest §1.1: "Messages are
delimited by newlines (`\\n`), and MUST NOT contain embedded newlines") and nothing else. It never
parses JSON on the hot path, never does I/O and never logs (style.md habit 1; h11's "bytes in,
events out"). "Need more input" is an empty list. ``LineSplitter`` is the proxy's one line
splitter: every reader of lines uses it (the session's readers, the conductor connection,
``replay`` and the record files it and ``show`` and ``ui`` read, the start-failure answerer, the
agent's stderr), each with its own bound.

Rules:

* A frame is everything between two ``\\n`` bytes, byte for byte: a trailing ``\\r`` (CRLF
  writers), invalid UTF-8 and whitespace inside the line are kept, because a frame no middleware
  touches must leave the proxy as the exact bytes that came in (byte-exact pass-through).
* Lines that are empty or whitespace only carry no message and are dropped (with
  ``blank_lines``, for text that is not a protocol stream, a record file or a stderr, they are
  lines like any other: a reader that numbers its lines counts them).
* Bounded (style.md habit 6): a line longer than ``max_frame_bytes`` is never held whole. Once
  it crosses the limit its bytes are discarded up to the next ``\\n`` and one ``Oversize`` event
  reports its total size and its first ``head_bytes`` bytes (by default ``HEAD_BYTES``, enough to
  read a request ``id``; a reader that shows a line cut short keeps more).
  At most ``max_frame_bytes`` of a pending line, plus the chunk being fed, are in memory.
"""

from __future__ import annotations

import json
import re

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.base.values import value
from acp_proxy.config import DEFAULT_MAX_FRAME_BYTES

# How much of an oversize line is kept for ``read_request_id``.
HEAD_BYTES = 4096


@value
class Line:
    """One complete frame, without its trailing ``\\n`` (every other byte kept, even ``\\r``)."""

    raw: bytes


@value
class Oversize:
    """A line longer than the frame limit; its bytes were discarded.

    ``size`` is the line's total length without the ``\\n`` (at EOF: up to the end of the stream),
    ``head`` its first ``head_bytes`` bytes at most, ``limit`` the limit it exceeded (0: unknown).
    """

    size: int
    head: bytes
    limit: int = 0


@value
class Block:
    """Several complete frames as they arrived: ``raw`` is the lines joined by ``\\n``, without
    the final ``\\n``; ``count`` is the number of newline-terminated lines in it.

    Produced only by ``LineSplitter.feed_blocks``. Lines inside may be empty or whitespace only:
    the consumer checks (and falls back to ``Block.lines``) before forwarding a block whole.
    """

    raw: bytes

    @property
    def count(self) -> int:
        # Computed on demand: the pipeline's block scan counts the lines in its own pass, and a
        # ``bytes.count`` per read was a measurable part of pass-through (docs/performance.md,
        # "Figures behind the code").
        return self.raw.count(b"\n") + 1

    def lines(self) -> list[Line]:
        """The block's frames, as ``feed`` would have produced them (blank lines dropped)."""
        return [Line(p) for p in self.raw.split(b"\n") if p and not p.isspace()]


class LineSplitter:
    """Split a byte stream into ``Line`` / ``Oversize`` events; feed chunks, call ``end`` at EOF.

    Any chunking of the same stream yields the same events. Internally the pending (unterminated)
    line is a list of parts joined once when its ``\\n`` arrives, so a line spread over many reads
    costs linear, not quadratic, time.
    """

    __slots__ = (
        "_blank",
        "_cut",
        "_discard_size",
        "_discarding",
        "_head",
        "_head_max",
        "_max",
        "_parts",
        "_size",
    )

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        blank_lines: bool = False,
        head_bytes: int = HEAD_BYTES,
    ) -> None:
        """``blank_lines``: give empty and whitespace-only lines too (then ``feed_blocks``
        gives what ``feed`` does); ``head_bytes``: how much of an oversize line its ``Oversize``
        keeps. Raises ``ValueError`` if ``max_frame_bytes`` is not positive."""
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be positive, got {max_frame_bytes}")
        self._max = max_frame_bytes
        self._blank = blank_lines
        self._head_max = head_bytes
        self._parts: list[bytes] = []  # the pending line, in pieces
        self._size = 0  # total length of ``_parts``
        self._discarding = False  # inside an oversize line, waiting for its newline
        self._discard_size = 0  # length of that line so far
        self._head = b""  # its first ``head_bytes`` bytes
        self._cut = 0  # the limit a refused line was cut at (``refuse``; 0: ``_max``)

    @property
    def max_frame_bytes(self) -> int:
        return self._max

    @property
    def buffered(self) -> int:
        """Bytes of the pending line held in memory (never more than ``max_frame_bytes``)."""
        return self._size + len(self._head)

    def feed(self, data: bytes) -> list[Line | Oversize]:
        """The events completed by ``data`` (possibly none), in stream order."""
        if not data:
            return []
        pieces = data.split(b"\n")
        last = pieces.pop()  # the unterminated tail (b"" when data ends with a newline)
        out: list[Line | Oversize] = []
        if pieces and (self._parts or self._discarding):
            self._complete(pieces[0], out)
            del pieces[0]
        if pieces:
            if len(data) <= self._max:
                # No piece can exceed the limit: the hot path, one comprehension per chunk
                # (``isspace`` stops at the first non-space byte, so it is O(1) for JSON).
                if self._blank:
                    out.extend([Line(p) for p in pieces])
                else:
                    out.extend([Line(p) for p in pieces if p and not p.isspace()])
            else:
                for p in pieces:
                    self._emit(p, out)
        if last:
            self._add_partial(last)
        return out

    def single_line(self, data: bytes) -> bytes | None:
        """``data``'s one line when ``data`` is exactly one complete, non-blank line within the
        limit and nothing is pending (interactive traffic: a request, its response); the
        splitter is then unchanged, as ``feed`` would leave it. ``None`` otherwise (nothing
        consumed: feed ``data`` as usual). The round trip's reads are almost all of this
        shape, and the event list, the ``Block`` and its scan cost more than the line."""
        n = len(data)
        # The first newline is the last byte: one line, complete (one ``memchr``).
        if n < 2 or n > self._max or self._parts or self._discarding or data.find(b"\n") != n - 1:
            return None
        line = data[:-1]
        return None if line.isspace() else line

    def feed_blocks(self, data: bytes) -> list[Line | Oversize | Block]:
        """Like ``feed``, but the complete lines inside ``data`` come as one ``Block``.

        The line completing a pending partial line comes first as a ``Line`` (or ``Oversize``);
        then every further complete line of ``data`` as one ``Block`` (when ``data`` is not
        longer than the limit, so no line in it can be oversize; otherwise as ``feed`` does).
        Writing ``Block.raw + b"\\n"`` reproduces those input bytes exactly, so a consumer that
        has nothing to do with any line of it forwards it without splitting (one write per batch of
        ready frames).
        """
        if not data:
            return []
        last_nl = data.rfind(b"\n")
        if last_nl < 0 or len(data) > self._max or self._blank:
            return list(self.feed(data))
        out: list[Line | Oversize | Block] = []
        start = 0
        if self._parts or self._discarding:
            first_nl = data.find(b"\n")
            done: list[Line | Oversize] = []
            self._complete(data[:first_nl], done)
            out.extend(done)
            start = first_nl + 1
        if start <= last_nl:
            raw = data[start:last_nl]
            if raw and not raw.isspace():
                out.append(Block(raw))
        if last_nl + 1 < len(data):
            self._add_partial(data[last_nl + 1 :])
        return out

    def end(self) -> list[Line | Oversize]:
        """At EOF: the final unterminated line, if any (an oversize one as ``Oversize``)."""
        out: list[Line | Oversize] = []
        if self._discarding:
            out.append(Oversize(self._discard_size, self._head, self._cut or self._max))
        elif self._parts:
            self._emit(b"".join(self._parts), out)
        self._reset()
        return out

    def _reset(self) -> None:
        self._parts = []
        self._size = 0
        self._discarding = False
        self._discard_size = 0
        self._head = b""
        self._cut = 0

    def refuse(self, limit: int) -> bool:
        """Refuse the pending line now, as if it had exceeded ``limit``: its bytes are dropped
        (its head kept) and the rest is discarded up to its newline, where it is reported as
        ``Oversize`` with ``limit``. False when there is no pending line to refuse."""
        if self._discarding or not self._parts:
            return False
        self._start_discarding(b"")
        self._cut = limit
        return True

    def _emit(self, line: bytes, out: list[Line | Oversize]) -> None:
        if len(line) > self._max:
            out.append(Oversize(len(line), line[: self._head_max], self._max))
        elif self._blank or (line and not line.isspace()):
            out.append(Line(line))

    def _complete(self, piece: bytes, out: list[Line | Oversize]) -> None:
        """``piece`` ends the pending line (its newline was found)."""
        if self._discarding:
            self._grow_head(piece)
            size = self._discard_size + len(piece)
            out.append(Oversize(size, self._head, self._cut or self._max))
            self._reset()
            return
        if self._size + len(piece) > self._max:
            self._start_discarding(piece)
            out.append(Oversize(self._discard_size, self._head, self._max))
            self._reset()
            return
        self._parts.append(piece)
        line = b"".join(self._parts)
        self._parts = []
        self._size = 0
        if self._blank or not line.isspace():
            out.append(Line(line))

    def _add_partial(self, piece: bytes) -> None:
        """``piece`` continues the pending line (no newline yet)."""
        if self._discarding:
            self._grow_head(piece)
            self._discard_size += len(piece)
        elif self._size + len(piece) > self._max:
            self._start_discarding(piece)
        else:
            self._parts.append(piece)
            self._size += len(piece)

    def _grow_head(self, piece: bytes) -> None:
        # Only matters when the limit is below ``head_bytes``: the head is otherwise full already.
        room = self._head_max - len(self._head)
        if room > 0:
            self._head += piece[:room]

    def _start_discarding(self, piece: bytes) -> None:
        """Keep only the head of the pending line plus ``piece``, and count the rest."""
        head = bytearray()
        for part in (*self._parts, piece):
            if len(head) >= self._head_max:
                break
            head += part[: self._head_max - len(head)]
        self._head = bytes(head)
        self._discard_size = self._size + len(piece)
        self._discarding = True
        self._parts = []
        self._size = 0


# --- Reading the id of a truncated request ---------------------------------------------------

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


@value
class HeadInfo:
    """What could be read from the start of a truncated JSON object (its top-level keys)."""

    keys: frozenset[str]  # top-level keys seen before the cut (a key whose value is cut counts)
    has_id: bool  # the ``id`` value itself was read completely
    id: JsonValue  # that value (``None`` also when not read: check ``has_id``)
    # The id exactly as written (``b"null"`` when not read), so an error reply echoes it.
    id_bytes: bytes = b"null"
    method: str | None = None  # the ``method`` value when it is a string read before the cut


def scan_head(head: bytes) -> HeadInfo:
    """Read the top-level keys (and the ``id`` value) of the truncated JSON object ``head``.

    Best effort: scanning stops at the cut or at anything that is not a JSON object's member;
    never raises. Uses the standard library decoder, which (unlike orjson) keeps integers above
    2**64 exact, so an error response can carry the request's id unchanged.
    """
    text = head.decode("utf-8", "replace")
    keys: set[str] = set()
    has_id = False
    found: JsonValue = None
    id_text = "null"
    method: str | None = None
    i = _WS.match(text).end()  # type: ignore[union-attr]  # the pattern matches the empty string
    if not text.startswith("{", i):
        return HeadInfo(frozenset(), False, None)
    i += 1
    try:
        while True:
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if not text.startswith('"', i):
                break
            key, i = _DECODER.raw_decode(text, i)
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if not text.startswith(":", i):
                break
            keys.add(key)
            i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
            vstart = i
            value, i = _DECODER.raw_decode(text, i)  # ValueError when the value is cut
            vend = i
            i = _WS.match(text, i).end()  # type: ignore[union-attr]
            if i >= len(text):
                break  # a number at the cut may be the start of a longer one: not read
            if key == "id":
                has_id, found, id_text = True, value, text[vstart:vend]
            elif key == "method" and isinstance(value, str):
                method = value
            if not text.startswith(",", i):
                break
            i += 1
    # JSONDecodeError: the cut (or garbage) was reached; RecursionError: a hostile head nested
    # deeper than the decoder goes (it used to take the whole proxy down).
    except (ValueError, RecursionError):
        pass
    return HeadInfo(frozenset(keys), has_id, found, id_text.encode(), method)


def _is_request_id(value: JsonValue) -> bool:
    # ACP digest §8.1: "RequestId may be a string, an integer or null" (JSON-RPC also allows a
    # number); anything else cannot be echoed back as an id.
    return value is None or (type(value) in (str, int, float))


def read_request_id(head: bytes) -> tuple[bool, JsonValue]:
    """``(True, id)`` when ``head`` starts a JSON-RPC request whose ``id`` can be read.

    "Looks like a request" means the top-level ``method`` key occurs before the cut. ``(False,
    None)`` otherwise (a notification, a response, a cut ``id``, not an object).
    """
    info = scan_head(head)
    if info.has_id and "method" in info.keys and _is_request_id(info.id):
        return True, info.id
    return False, None


def read_response_id(head: bytes) -> tuple[bool, JsonValue]:
    """``(True, id)`` when ``head`` starts a JSON-RPC response (``result``/``error``, no ``method``)
    whose ``id`` can be read; ``(False, None)`` otherwise."""
    info = scan_head(head)
    if (
        info.has_id
        and "method" not in info.keys
        and ("result" in info.keys or "error" in info.keys)
        and _is_request_id(info.id)
    ):
        return True, info.id
    return False, None
