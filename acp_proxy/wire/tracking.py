"""Request tracking: which requests await an answer, in each direction, within a stated bound.

Contract: owns the two tables of JSON-RPC requests that crossed the proxy and have not been
answered yet (client requests awaiting the agent, agent requests awaiting the client), keyed by
id, each with its method and the id's bytes exactly as the sender wrote them (the error replies
the proxy writes echo the request id's original bytes). Bounded (README "Bounds"): at most
``max_pending`` requests per direction and ``MAX_PENDING_ID_BYTES`` of ids for both; past that a
request is not admitted (the pipeline answers it with an error instead of forwarding it). Builds
the ``-32603`` errors owed when a peer is gone, lazily, in chunks. Pure: no I/O, no clock.

Directions are those of the request: ``CLIENT_TO_AGENT`` is the table of client requests, which
responses travelling ``AGENT_TO_CLIENT`` answer.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.wire.chain import INTERNAL_ERROR, Direction

# Bytes of request ids held in both tables together (an id may be a string of any length).
MAX_PENDING_ID_BYTES = 16 * 1024 * 1024
# Errors owed at a peer's exit are built and handed out this many at a time (bounded memory:
# 400,000 responses built at once took 1.9 GB).
ABORT_CHUNK = 1000


def is_id(value: object) -> bool:
    """A valid request id: ACP digest §8.1, a string, an integer or null (JSON-RPC: also a
    number)."""
    return value is None or type(value) in (str, int, float)


def error_frame_bytes(id_bytes: bytes, code: int, message: str) -> bytes:
    """A JSON-RPC error response whose ``id`` is ``id_bytes`` exactly as the request spelled it."""
    return b"".join(
        (
            b'{"jsonrpc":"2.0","id":',
            id_bytes,
            b',"error":{"code":',
            str(code).encode(),
            b',"message":',
            orjson.dumps(message),
            b"}}",
        )
    )


# One waiting request: its method and its id's bytes.
Pending = tuple[str, bytes]


class RequestTracker:
    """The two tables of requests awaiting an answer (see the module docstring)."""

    __slots__ = ("_bytes", "_tables", "max_pending")

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self._tables: dict[Direction, dict[JsonValue, Pending]] = {
            Direction.CLIENT_TO_AGENT: {},
            Direction.AGENT_TO_CLIENT: {},
        }
        self._bytes = 0  # id bytes held in both tables

    def waiting(self, direction: Direction) -> int:
        """Requests sent in ``direction`` and not answered yet."""
        return len(self._tables[direction])

    def knows(self, direction: Direction, rid: JsonValue) -> bool:
        return rid in self._tables[direction]

    def full(self, direction: Direction) -> bool:
        """No room for one more request in ``direction``."""
        table = self._tables[direction]
        return len(table) >= self.max_pending or self._bytes >= MAX_PENDING_ID_BYTES

    def room(self, direction: Direction) -> int:
        """How many more requests ``direction`` may have waiting."""
        if self._bytes >= MAX_PENDING_ID_BYTES:
            return 0
        return max(0, self.max_pending - len(self._tables[direction]))

    def admit(self, direction: Direction, rid: JsonValue, method: str, id_bytes: bytes) -> bool:
        """Track a request sent in ``direction``; False (not tracked) when its table is full."""
        table = self._tables[direction]
        if rid not in table and (
            len(table) >= self.max_pending or self._bytes + len(id_bytes) > MAX_PENDING_ID_BYTES
        ):
            return False
        previous = table.pop(rid, None)  # a reused id: the newest request is the one answered
        if previous is not None:
            self._bytes -= len(previous[1])
        table[rid] = (method, id_bytes)
        self._bytes += len(id_bytes)
        return True

    def answer(self, request_direction: Direction, rid: JsonValue) -> Pending | None:
        """A response answers the request ``rid`` sent in ``request_direction``; the request's
        method and id bytes, or ``None`` when no such request was waiting."""
        entry = self._tables[request_direction].pop(rid, None)
        if entry is not None:
            self._bytes -= len(entry[1])
        return entry

    def abort(self, direction: Direction, message: str) -> Iterator[tuple[tuple[bytes, ...], int]]:
        """Forget every request waiting in ``direction`` now, and yield the ``-32603`` errors
        owed for them (``message``), in arrival order, ``ABORT_CHUNK`` at a time, each chunk
        with its size; built only as the caller iterates."""
        table = self._tables[direction]
        self._tables[direction] = {}
        self._bytes -= sum(len(v[1]) for v in table.values())
        return _errors(table, message)


def _errors(
    table: dict[JsonValue, Pending], message: str
) -> Iterator[tuple[tuple[bytes, ...], int]]:
    chunk: list[bytes] = []
    for _method, id_bytes in table.values():
        chunk.append(error_frame_bytes(id_bytes, INTERNAL_ERROR, message))
        if len(chunk) == ABORT_CHUNK:
            yield tuple(chunk), len(chunk)
            chunk = []
    if chunk:
        yield tuple(chunk), len(chunk)


__all__ = [
    "ABORT_CHUNK",
    "MAX_PENDING_ID_BYTES",
    "Pending",
    "RequestTracker",
    "error_frame_bytes",
]
