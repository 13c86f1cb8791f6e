"""Request tracking: which requests await an answer, in each direction, within a stated bound.

Contract: owns the two tables of JSON-RPC requests that crossed the proxy and have not been
answered yet (client requests awaiting the agent, agent requests awaiting the client), keyed by
id, each with its method and the id's bytes exactly as the sender wrote them (the error replies
the proxy writes echo the request id's original bytes). Ids that are equal as values (``1`` and
``1.0``) or repeated (the same id twice: a peer's bug) are all kept, oldest first: a response
answers the oldest request with its id, and every request still waiting when a peer is gone
gets its own error, so no request that crossed the proxy is left without an answer. Bounded
(docs/bounds.md): at most ``max_pending`` requests per direction (repeats counted) and
``MAX_PENDING_ID_BYTES`` of ids for both; past that a request is not admitted (the pipeline
answers it with an error instead of forwarding it). Builds the ``-32603`` errors owed when a
peer is gone, lazily, in chunks. Pure: no I/O, no clock.

Directions are those of the request: ``CLIENT_TO_AGENT`` is the table of client requests, which
responses travelling ``AGENT_TO_CLIENT`` answer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.errors import INTERNAL_ERROR, error_bytes

# Bytes of request ids held in both tables together (an id may be a string of any length).
MAX_PENDING_ID_BYTES = 16 * 1024 * 1024
# Errors owed at a peer's exit are built and handed out this many at a time (bounded memory:
# 400,000 responses built at once took 1.9 GB).
ABORT_CHUNK = 1000


def is_id(value: object) -> bool:
    """A valid request id: ACP digest §8.1, a string, an integer or null (JSON-RPC: also a
    number)."""
    return value is None or type(value) in (str, int, float)


# One waiting request: its method and its id's bytes.
Pending = tuple[str, bytes]


class RequestTracker:
    """The two tables of requests awaiting an answer (see the module docstring).

    Each table maps an id to its oldest waiting request; requests whose id is equal to one
    already waiting (a repeat, or ``1.0`` beside ``1``) wait in ``_more`` behind it, so the
    common case costs one dict operation.
    """

    __slots__ = ("_bytes", "_more", "_more_count", "_tables", "max_pending")

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self._tables: dict[Direction, dict[JsonValue, Pending]] = {
            Direction.CLIENT_TO_AGENT: {},
            Direction.AGENT_TO_CLIENT: {},
        }
        # Requests behind an equal id, oldest first, and how many there are per direction.
        self._more: dict[Direction, dict[JsonValue, deque[Pending]]] = {
            Direction.CLIENT_TO_AGENT: {},
            Direction.AGENT_TO_CLIENT: {},
        }
        self._more_count = {Direction.CLIENT_TO_AGENT: 0, Direction.AGENT_TO_CLIENT: 0}
        self._bytes = 0  # id bytes held in both tables

    def waiting(self, direction: Direction) -> int:
        """Requests sent in ``direction`` and not answered yet."""
        return len(self._tables[direction]) + self._more_count[direction]

    def knows(self, direction: Direction, rid: JsonValue) -> bool:
        return rid in self._tables[direction]

    def full(self, direction: Direction) -> bool:
        """No room for one more request in ``direction``."""
        return self.waiting(direction) >= self.max_pending or self._bytes >= MAX_PENDING_ID_BYTES

    def room(self, direction: Direction) -> int:
        """How many more requests ``direction`` may have waiting."""
        if self._bytes >= MAX_PENDING_ID_BYTES:
            return 0
        return max(0, self.max_pending - self.waiting(direction))

    def admit(self, direction: Direction, rid: JsonValue, method: str, id_bytes: bytes) -> bool:
        """Track a request sent in ``direction``; False (not tracked) when its table is full."""
        table = self._tables[direction]
        if (
            len(table) + self._more_count[direction] >= self.max_pending
            or self._bytes + len(id_bytes) > MAX_PENDING_ID_BYTES
        ):
            return False
        self._bytes += len(id_bytes)
        if rid in table:  # an equal id is waiting: this one waits behind it
            self._more[direction].setdefault(rid, deque()).append((method, id_bytes))
            self._more_count[direction] += 1
        else:
            table[rid] = (method, id_bytes)
        return True

    def answer(self, request_direction: Direction, rid: JsonValue) -> Pending | None:
        """A response answers the oldest request ``rid`` sent in ``request_direction``; the
        request's method and id bytes, or ``None`` when no such request was waiting."""
        table = self._tables[request_direction]
        entry = table.pop(rid, None)
        if entry is not None:
            self._bytes -= len(entry[1])
            more = self._more[request_direction]
            if more and rid in more:
                queue = more[rid]
                table[rid] = queue.popleft()
                self._more_count[request_direction] -= 1
                if not queue:
                    del more[rid]
        return entry

    def abort(
        self,
        direction: Direction,
        message: str,
        data: bytes | None = None,
        *,
        name_method: bool = True,
        detail: str | None = None,
    ) -> Iterator[tuple[tuple[bytes, ...], int]]:
        """Forget every request waiting in ``direction`` now, and yield the ``-32603`` errors
        owed for them (``message``, then " during METHOD" with ``name_method``, then
        ": DETAIL" with ``detail``; ``data`` as ``error.data``),
        ``ABORT_CHUNK`` at a time, each chunk with its size; built only as the caller iterates.
        Order: arrival order, except that requests behind an equal id come last."""
        table = self._tables[direction]
        more = self._more[direction]
        self._tables[direction] = {}
        self._more[direction] = {}
        self._more_count[direction] = 0
        waiting = list(table.values())
        for queue in more.values():
            waiting.extend(queue)
        self._bytes -= sum(len(v[1]) for v in waiting)
        return _errors(waiting, message, data, name_method, detail)


def _errors(
    waiting: list[Pending],
    message: str,
    data: bytes | None,
    name_method: bool,
    detail: str | None,
) -> Iterator[tuple[tuple[bytes, ...], int]]:
    chunk: list[bytes] = []
    for method, id_bytes in waiting:
        text = f"{message} during {method}" if name_method and method else message
        if detail:
            text = f"{text}: {detail}"
        chunk.append(error_bytes(id_bytes, INTERNAL_ERROR, text, data))
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
]
