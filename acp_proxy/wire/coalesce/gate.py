"""The write gate toward a peer the queue merges for: when to write, judged from its unread bytes.

Contract: pure. The caller (the outbox's writer) passes the time from a monotonic clock, the
bytes the peer has not read yet (as its kernel buffer reports them) and the bytes written so
far; the gate answers how long to wait before the next write, whether the peer is behind the
proxy (merging may pay) or waits for it, its pace, and whether it is paused. It never writes,
never reads a clock, never touches the queue.

The rules:
- **Unread bound.** While the queue merges, the peer's kernel buffer holds at most about
  ``GATE_UNREAD`` bytes it has not read: what waits in the queue still merges, what sits in
  the kernel no longer can. Above it the writer waits ``(unread - GATE_UNREAD) / pace``, within
  ``GATE_MIN_S`` .. ``GATE_MAX_S``.
- **Idle backoff.** While the peer reads nothing and its pace is unknown, the wait doubles from
  ``GATE_MIN_S`` up to ``GATE_IDLE_MAX_S`` (a paused peer costs few wake-ups); the first look
  that finds it read starts short again (a peer that resumed waits at most that long).
- **Paused.** A peer that read nothing for ``GATE_PAUSED_S`` is paused.
- **Drained.** A look that finds it read (nearly) all it was given, down to less than
  ``STARVED_UNREAD``, says it waits for the proxy: merging stops. It is behind again only once
  more than half of ``GATE_UNREAD`` stayed unread for a rate window since it last drained.
- **Stale looks.** A look more than four rate windows after the last, with little unread,
  starts the pace afresh; what the peer read meanwhile still counts for the judgement (a paused
  peer that resumed and read down its buffer is fed at once).
"""

from __future__ import annotations

from acp_proxy.base.values import value
from acp_proxy.wire.coalesce.pace import RATE_WINDOW_S

# The unread bytes the writer keeps in the peer's kernel buffer while the queue merges (a pipe
# of 1 MiB would otherwise hold ~1,500 updates nothing can merge any more), checking every
# GATE_MIN_S to GATE_MAX_S as the peer's pace says.
GATE_UNREAD = 64 * 1024
GATE_MIN_S = 0.0005
GATE_MAX_S = 0.02
# While the peer reads nothing (paused), the writer looks again after at most this long: a
# peer that resumes waits no longer for the proxy (about 200 wake-ups a second of pause).
GATE_IDLE_MAX_S = 0.005
# A peer that read nothing for this long is paused: once nothing is left to merge or encode
# ahead, the writer fills its kernel buffer and waits in the write (the kernel wakes it the
# moment the peer reads, as with coalescing off).
GATE_PAUSED_S = 0.1
# A look that finds the peer read what it was given, down to less than this unread: the peer
# waits for the proxy, not the other way round, so the queue stops merging.
STARVED_UNREAD = 16 * 1024


@value
class GateLook:
    """What one look at the peer found.

    ``read``: bytes it read since the last look; ``rate``: its pace in bytes a second over
    the window being measured (0.0: unknown, or it read nothing); ``consumed``: a complete
    window's (bytes read, span) for the queue's pace, or None; ``peer_waits``: the judgement
    (True: behind the proxy, merging may pay; False: it waits for the proxy; None: unchanged).
    """

    read: int
    rate: float
    consumed: tuple[int, float] | None
    peer_waits: bool | None


class WriteGate:
    """The gate's memory between looks (see the module docstring for its rules)."""

    __slots__ = (
        "_at",
        "_drained_at",
        "_idle",
        "_idle_since",
        "_read",
        "_sent",
        "_unread",
        "_window",
    )

    def __init__(self) -> None:
        self._at: float | None = None  # the last look: when, the unread bytes, the bytes sent
        self._unread = self._sent = 0
        self._read = 0  # bytes read in the window being measured ...
        self._window = 0.0  # ... which started then
        self._idle = GATE_MIN_S  # the wait while the pace is unknown
        self._idle_since: float | None = None  # since when the peer has read nothing
        self._drained_at: float | None = None  # when a look last found it had read it all

    def look(self, now: float, unread: int, sent: int) -> GateLook:
        """Look at the peer: ``unread`` bytes in its buffer, ``sent`` bytes written in all."""
        rate = 0.0
        read = 0
        consumed: tuple[int, float] | None = None
        last = self._at
        if last is not None:
            # What it read since the last look, however long ago.
            read = max(0, self._unread + (sent - self._sent) - unread)
        if last is not None and now - last > 4 * RATE_WINDOW_S and unread < GATE_UNREAD:
            last = None  # not looked for a while and nothing much waits: a fresh start
        if last is not None:
            self._read += read
            self._idle = GATE_MIN_S if read else min(2 * self._idle, GATE_IDLE_MAX_S)
            if read:
                self._idle_since = None
            elif self._idle_since is None:
                self._idle_since = last
            span = now - self._window
            if span >= RATE_WINDOW_S:
                rate = self._read / span
                consumed = (self._read, span)
                self._window, self._read = now, 0
            elif now > self._window:
                rate = self._read / (now - self._window)
        else:
            self._window, self._read = now, 0
            self._idle, self._idle_since = GATE_MIN_S, None
        self._at, self._unread, self._sent = now, unread, sent
        return GateLook(read, rate, consumed, self._judge(now, unread, read))

    def _judge(self, now: float, unread: int, read: int) -> bool | None:
        if read and unread < STARVED_UNREAD:
            # It read (nearly) all it was given: it waits for the proxy, where merging could
            # only make it wait longer (a fast peer, a paused one that resumed).
            self._drained_at = now
            return False
        if unread > GATE_UNREAD // 2 and (
            self._drained_at is None or now - self._drained_at >= RATE_WINDOW_S
        ):
            # It left data unread for a rate window since it last read everything. Not
            # sooner: right after a write a peer that keeps up has not read it yet, and merging
            # would make it wait (a peer that stops gets at most its kernel buffer unmerged).
            return True
        return None

    def wait(self, unread: int, rate: float, merging: bool) -> float | None:
        """How long to wait before the next write (None: write now), after a look that found
        ``unread`` bytes and pace ``rate``, while the queue ``merging`` or not."""
        if unread <= GATE_UNREAD or not merging:
            return None
        if rate <= 0.0:
            return self._idle
        return min(max((unread - GATE_UNREAD) / rate, GATE_MIN_S), GATE_MAX_S)

    def paused(self, now: float, paused_s: float = GATE_PAUSED_S) -> bool:
        """The peer has read nothing for ``paused_s`` (as far as the looks saw)."""
        since = self._idle_since
        return since is not None and now - since >= paused_s
