"""The process-wide buffer budget: how many bytes all sessions' buffers may hold, together.

Contract: owns counting the bytes every session holds (partial lines, outbound queues, one read
reserved per reader) against ``max_buffer_bytes``, and making a reader wait while the total is
too high; it never reads, writes or holds a frame itself. A reader asks before each read
(``reserve_read`` / ``try_reserve_read``); its session reports what it holds (``add``).
"""

from __future__ import annotations

import anyio

from acp_proxy.config import Config

READ_SIZE = 256 * 1024  # one read of a session's reader, reserved in the budget before it reads


class BufferBudget:
    """The process-wide bound on bytes held by all sessions' buffers (README "Bounds": partial
    lines, queues and one reserved read per reader, summed, stay within ``max_buffer_bytes``).

    Counts what every session holds in its ``LineSplitter`` partial lines and its outbound
    queues (queued frames, replies, unwritten tails, the write in flight), plus one read
    (``READ_SIZE``) reserved by each reader before it reads. A reader reads only while the total
    stays below ``limit - reserve``; otherwise it waits until another session releases bytes.

    ``reserve`` (one maximal frame plus one read) is kept for a single reader at a time, the
    *owner*: a reader in the middle of a line may take it when it is free and what the others
    hold leaves room for a whole frame, so one legal frame can always complete (a budget full
    of partial lines would otherwise deadlock: every reader waits for the others to finish
    their lines). The owner gives it back once its pending line is complete. Normal reads keep
    the total below ``limit - reserve`` and the owner adds at most one frame and one read, so
    the total never exceeds ``limit`` (bytes a stream returns beyond ``READ_SIZE`` aside).

    Not thread-safe: all sessions sharing it run on one event loop.
    """

    __slots__ = ("_owner", "_waiters", "held", "limit", "peak", "reserve", "waits")

    def __init__(self, limit: int, reserve: int) -> None:
        """Raises ``ValueError`` unless ``limit`` leaves room for ``reserve`` and two reads."""
        if limit < reserve + 2 * READ_SIZE:
            raise ValueError(f"a buffer budget of {limit} bytes cannot hold {reserve} + 2 reads")
        self.limit = limit
        self.reserve = reserve
        self.held = 0  # bytes held and reserved right now, by all sessions
        self.peak = 0  # the largest ``held`` seen
        self.waits = 0  # times a reader had to wait for the budget
        self._owner: object | None = None  # the reader allowed into the reserve
        self._waiters: list[anyio.Event] = []

    def add(self, delta: int) -> None:
        """Account for ``delta`` more (or, negative, fewer) bytes held."""
        self.held += delta
        if delta > 0:
            self.peak = max(self.peak, self.held)
        elif delta < 0 and self._waiters:
            self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for event in waiters:
            event.set()

    def _may_read(self, reader: object, partial: int) -> bool:
        if self._owner is reader:
            return True
        threshold = self.limit - self.reserve
        if self.held + READ_SIZE <= threshold:
            return True
        # The reserve is free and this reader is in the middle of a line: it may finish it,
        # provided what the others hold leaves room for a whole frame (else wait for them).
        if partial and self._owner is None and self.held - partial <= threshold:
            self._owner = reader
            return True
        return False

    async def reserve_read(self, reader: object, partial: int) -> int:
        """Wait until ``reader`` may read, reserve one read (``READ_SIZE``) and return it.

        ``partial``: the bytes of the line ``reader`` is in the middle of (0: none); only such a
        reader may take the reserve.
        """
        while not self._may_read(reader, partial):
            event = anyio.Event()
            self._waiters.append(event)
            self.waits += 1
            try:
                await event.wait()
            finally:
                if event in self._waiters:
                    self._waiters.remove(event)
        self.add(READ_SIZE)
        return READ_SIZE

    def try_reserve_read(self, reader: object, partial: int) -> bool:
        """``reserve_read`` without waiting: True (one read reserved) when ``reader`` may read
        now, else False (nothing reserved)."""
        if not self._may_read(reader, partial):
            return False
        self.add(READ_SIZE)
        return True

    def keep_read(self, reader: object) -> bool:
        """Whether ``reader``, which just handled the chunk of its reserved read and holds no
        partial line, may keep that read reserved for its next read: True exactly when
        ``add(-READ_SIZE)``, ``release_owner(reader)`` and ``try_reserve_read(reader, 0)``
        would leave the budget as it is (nobody waits to be woken, ``reader`` does not own the
        reserve, and the budget has room for the read): three calls less per message on
        interactive traffic, where each read is one line."""
        return (
            self._owner is not reader
            and not self._waiters
            and self.held <= self.limit - self.reserve
        )

    def release_owner(self, reader: object) -> None:
        """``reader`` finished its line (or stopped): the reserve is free for another."""
        if self._owner is reader:
            self._owner = None
            self._wake()

    def owned_by(self, reader: object) -> bool:
        return self._owner is reader


_BUDGETS: dict[tuple[int, int], BufferBudget] = {}


def process_budget(config: Config) -> BufferBudget:
    """The budget every session of this process with these settings shares (one per process in
    practice: all sessions of a listener use one config). Never below what one maximal frame
    needs, even for a ``Config`` built in code without the file's validation."""
    reserve = config.max_frame_bytes + READ_SIZE
    limit = max(config.max_buffer_bytes, reserve + 2 * READ_SIZE)
    budget = _BUDGETS.get((limit, reserve))
    if budget is None:
        budget = _BUDGETS[(limit, reserve)] = BufferBudget(limit, reserve)
    return budget
