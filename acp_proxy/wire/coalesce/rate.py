"""The optional rate limit of an outbound queue: which waiting entries are due and which held.

Contract: pure (the caller passes the times, from a monotonic clock); decides, never writes.
Only entries of the tail run (after the last barrier) can be held: a barrier releases every
entry before it, so requests and responses are never delayed and nothing crosses a barrier.
An entity written less than ``interval`` ago is held; its later updates merge into the held
entry in the queue. Remembers when each entity was last written, forgetting entities written
longer than the interval ago (they can no longer be held), so its table stays bounded by the
entities written within one interval.
"""

from __future__ import annotations

from collections.abc import Sequence

from acp_proxy.wire.coalesce.keys import EntityKey
from acp_proxy.wire.coalesce.merge import Group
from acp_proxy.wire.coalesce.take import Run


class RateLimit:
    """When each entity was last written, and what that holds back (module docstring)."""

    __slots__ = ("_last_written", "_prune_at", "interval")

    def __init__(self, interval: float) -> None:
        self.interval = interval  # seconds
        self._last_written: dict[EntityKey, float] = {}
        self._prune_at = 1024

    def split(
        self, entries: Sequence[bytes | Run | Group], now: float
    ) -> tuple[list[bytes | Run | Group], list[Group], float | None]:
        """``entries`` in order, as (due now, held, the earliest held entity's due time). A due
        group counts as written at ``now``."""
        last_barrier = -1
        for i, entry in enumerate(entries):
            if not isinstance(entry, Group):  # a line or a run of lines as they came
                last_barrier = i
        due: list[bytes | Run | Group] = []
        held: list[Group] = []
        deadline: float | None = None
        last_written = self._last_written
        for i, entry in enumerate(entries):
            if isinstance(entry, Group):
                if i > last_barrier:
                    written_at = last_written.get(entry.key)
                    # Compare with the very deadline returned, so taking at it always releases.
                    at = written_at + self.interval if written_at is not None else now
                    if now < at:
                        held.append(entry)
                        deadline = at if deadline is None else min(deadline, at)
                        continue
                last_written[entry.key] = now
            due.append(entry)
        self._prune(now)
        return due, held, deadline

    def _prune(self, now: float) -> None:
        """Forget entities written longer than the interval ago (they can no longer be held)."""
        if len(self._last_written) < self._prune_at:
            return
        horizon = now - self.interval
        self._last_written = {k: t for k, t in self._last_written.items() if t > horizon}
        self._prune_at = max(1024, 2 * len(self._last_written))
