"""The process-wide buffer budget: how many bytes all sessions' buffers may hold, together.

Contract: owns counting the bytes every session holds (partial lines, outbound queues, one read
reserved per reader) against ``max_buffer_bytes``, and making a reader wait while the total is
too high; it never reads, writes or holds a frame itself. A reader asks before each read
(``reserve_read`` / ``try_reserve_read``); its session reports what it holds (``add``), through
its ``Share``.

Fairness (``--listen``): each session's ``Share`` has a floor of the budget of its own
(``FLOOR_BYTES``, less when ``max_connections`` floors would not fit), which it may always use
whatever the others hold; only what a session holds beyond its floor comes from the pool shared
by all. Clients that never read while their agents stream, or that park unfinished lines, fill
the pool and then wait, while a well-behaved session (a few small frames and its two reserved
reads) stays within its floor and is never held up by them. A session waiting for the pool
does not wait forever on lines parked by others: a partial line that has not grown for
``PARKED_S`` and holds more than its session's fair share of the pool (the pool divided by the
sessions) is refused, for that connection only (dropped up to its newline, then answered like
a frame over the size limit), and its bytes go back to the pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import anyio

from acp_proxy.config import Config

READ_SIZE = 256 * 1024  # one read of a session's reader, reserved in the budget before it reads
# Each session's own part of the budget: its two readers' reads and a few small frames.
FLOOR_BYTES = 1024 * 1024
# A partial line that has not grown for this long while another session waits for the budget
# is refused when it holds more than its session's fair share of the pool (a parked line).
PARKED_S = 5.0


class _Splitter(Protocol):
    @property
    def buffered(self) -> int: ...

    def refuse(self, limit: int) -> bool: ...


class Watched(Protocol):
    """What the budget sees of a session's reader: its line splitter, and since when it has
    been waiting for input (None: not waiting)."""

    @property
    def splitter(self) -> _Splitter: ...

    @property
    def receiving(self) -> float | None: ...


class BufferBudget:
    """The process-wide bound on bytes held by all sessions' buffers (docs/bounds.md: partial
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

    __slots__ = (
        "_owner",
        "_waiters",
        "floor",
        "held",
        "limit",
        "open",
        "peak",
        "pool_used",
        "refused",
        "reserve",
        "shares",
        "waits",
    )

    def __init__(self, limit: int, reserve: int, floor: int = 0) -> None:
        """Raises ``ValueError`` unless ``limit`` leaves room for ``reserve`` and two reads.

        ``floor``: each ``Share``'s own part (see the module docstring); 0: none, every byte
        comes from the pool."""
        if limit < reserve + 2 * READ_SIZE:
            raise ValueError(f"a buffer budget of {limit} bytes cannot hold {reserve} + 2 reads")
        self.limit = limit
        self.reserve = reserve
        self.floor = floor
        self.shares = 0  # open shares, each with its floor
        self.open: set[Share] = set()  # those whose readers are watched for parked lines
        self.refused = 0  # parked partial lines refused
        self.held = 0  # bytes held and reserved right now, by all sessions
        self.pool_used = 0  # the part of ``held`` beyond the shares' floors
        self.peak = 0  # the largest ``held`` seen
        self.waits = 0  # times a reader had to wait for the budget
        self._owner: object | None = None  # the reader allowed into the reserve
        self._waiters: list[anyio.Event] = []

    @property
    def pool(self) -> int:
        """The bytes the sessions may hold beyond their floors, together (without the reserve)."""
        return self.limit - self.reserve - self.floor * self.shares

    def share(self) -> Share:
        """A session's part of the budget (``Share.close`` when the session ends)."""
        self.shares += 1
        return Share(self)

    def add(self, delta: int) -> None:
        """Account for ``delta`` more (or, negative, fewer) bytes held outside any share (all
        from the pool)."""
        self.held += delta
        self.pool_used += delta
        if delta > 0:
            self.peak = max(self.peak, self.held)
        elif delta < 0 and self._waiters:
            self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for event in waiters:
            event.set()

    def _may_read(self, reader: object, partial: int, share: Share | None = None) -> bool:
        if self._owner is reader:
            return True
        pool = self.pool
        if share is None:  # bytes outside any share: all from the pool
            grow, own = READ_SIZE, partial
        else:
            if share.held + READ_SIZE <= self.floor:
                return True  # within the session's own floor: nobody else's bytes matter
            beyond = max(share.held - self.floor, 0)
            grow = max(share.held + READ_SIZE - self.floor, 0) - beyond
            own = min(partial, beyond)
        if self.pool_used + grow <= pool:
            return True
        # The reserve is free and this reader is in the middle of a line: it may finish it,
        # provided what the others hold leaves room for a whole frame (else wait for them).
        if partial and self._owner is None and self.pool_used - own <= pool:
            self._owner = reader
            return True
        return False

    async def _wait(self, timeout: float = float("inf")) -> None:
        event = anyio.Event()
        self._waiters.append(event)
        self.waits += 1
        try:
            with anyio.move_on_after(timeout):
                await event.wait()
        finally:
            if event in self._waiters:
                self._waiters.remove(event)

    def relieve(self, waiter: Share | None) -> int:
        """Refuse the partial lines parked by other sessions (see the module docstring);
        returns how many."""
        now = time.monotonic()
        fair = max(self.pool // max(self.shares, 1), self.floor)
        refused = 0
        for share in list(self.open):
            if share is waiter:
                continue
            for reader in share.readers:
                since = reader.receiving
                splitter = reader.splitter
                if (
                    since is not None
                    and now - since >= PARKED_S
                    and splitter.buffered > fair
                    and splitter.refuse(fair)
                ):
                    refused += 1
                    if self._owner is splitter:
                        self._owner = None
                    share.recount()
        if refused:
            self.refused += refused
            self._wake()
        return refused

    async def reserve_read(self, reader: object, partial: int) -> int:
        """Wait until ``reader`` may read, reserve one read (``READ_SIZE``) and return it.

        ``partial``: the bytes of the line ``reader`` is in the middle of (0: none); only such a
        reader may take the reserve.
        """
        while not self._may_read(reader, partial):
            await self._wait()
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
        return self._owner is not reader and not self._waiters and self.pool_used <= self.pool

    def release_owner(self, reader: object) -> None:
        """``reader`` finished its line (or stopped): the reserve is free for another."""
        if self._owner is reader:
            self._owner = None
            self._wake()

    def owned_by(self, reader: object) -> bool:
        return self._owner is reader


class Share:
    """One session's part of a ``BufferBudget``: the same calls as the budget, counted against
    the session's floor first and the shared pool beyond it (see the module docstring)."""

    __slots__ = ("budget", "closed", "held", "readers", "recount")

    def __init__(self, budget: BufferBudget) -> None:
        self.budget = budget
        self.held = 0  # what this session holds and has reserved
        self.closed = False
        self.readers: Sequence[Watched] = ()
        self.recount: Callable[[], None] = _nothing

    def watch(self, readers: Sequence[Watched], recount: Callable[[], None]) -> None:
        """Let the budget refuse the lines these readers park (``BufferBudget.relieve``);
        ``recount`` re-counts what the session holds once one was refused."""
        self.readers = readers
        self.recount = recount
        self.budget.open.add(self)

    @property
    def limit(self) -> int:
        return self.budget.limit

    @property
    def peak(self) -> int:
        return self.budget.peak

    @property
    def waits(self) -> int:
        return self.budget.waits

    def add(self, delta: int) -> None:
        """Account for ``delta`` more (or, negative, fewer) bytes held by this session."""
        budget = self.budget
        floor = budget.floor
        before = self.held - floor if self.held > floor else 0
        self.held += delta
        after = self.held - floor if self.held > floor else 0
        budget.pool_used += after - before
        budget.held += delta
        if delta > 0:
            budget.peak = max(budget.peak, budget.held)
        elif delta < 0 and budget._waiters:
            budget._wake()

    async def reserve_read(self, reader: object, partial: int) -> int:
        """``BufferBudget.reserve_read`` for one of this session's readers."""
        budget = self.budget
        while not budget._may_read(reader, partial, self):
            await budget._wait(PARKED_S)
            if not budget._may_read(reader, partial, self):
                budget.relieve(self)
        self.add(READ_SIZE)
        return READ_SIZE

    def try_reserve_read(self, reader: object, partial: int) -> bool:
        if not self.budget._may_read(reader, partial, self):
            return False
        self.add(READ_SIZE)
        return True

    def keep_read(self, reader: object) -> bool:
        """``BufferBudget.keep_read`` for this session: the read may stay reserved when the
        session is within its floor or the pool has room (and nobody waits)."""
        budget = self.budget
        return (
            budget._owner is not reader
            and not budget._waiters
            and (self.held <= budget.floor or budget.pool_used <= budget.pool)
        )

    def release_owner(self, reader: object) -> None:
        self.budget.release_owner(reader)

    def owned_by(self, reader: object) -> bool:
        return self.budget.owned_by(reader)

    def close(self) -> None:
        """The session ended: give back what it still counts, and its floor."""
        if self.closed:
            return
        self.closed = True
        if self.held:
            self.add(-self.held)
        self.budget.shares -= 1
        self.budget.open.discard(self)
        self.budget._wake()


def _nothing() -> None:
    pass


_BUDGETS: dict[tuple[int, int, int], BufferBudget] = {}


def process_budget(config: Config) -> BufferBudget:
    """The budget every session of this process with these settings shares (one per process in
    practice: all sessions of a listener use one config). Never below what one maximal frame
    needs, even for a ``Config`` built in code without the file's validation."""
    reserve = config.max_frame_bytes + READ_SIZE
    limit = max(config.max_buffer_bytes, reserve + 2 * READ_SIZE)
    # Every connection's floor, and as much again for the pool, fit in the budget.
    floor = min(FLOOR_BYTES, (limit - reserve) // (2 * max(config.max_connections, 1)))
    budget = _BUDGETS.get((limit, reserve, floor))
    if budget is None:
        budget = _BUDGETS[(limit, reserve, floor)] = BufferBudget(limit, reserve, floor)
    return budget
