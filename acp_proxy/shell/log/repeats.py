"""Repeated warnings, logged once and then counted: a chatty peer cannot flood the log.

Contract: owns the rule "the first event of a kind is logged; later ones are counted, with one
line carrying ``repeated=N`` every ``REPEAT_INTERVAL_S`` while they go on, and one for the rest
when the session ends (``flush``)". It holds one entry per kind (kinds are a fixed set chosen by
the caller: note types, a middleware's name), never the events themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# How often a warning that keeps repeating is logged again, with the count since the last line.
REPEAT_INTERVAL_S = 10.0


class Repeats:
    """Log the first event of each kind at once, then a count every ``interval_s``."""

    __slots__ = ("_clock", "_kinds", "interval_s")

    def __init__(
        self,
        interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        # kind -> [count since the last line, time of the last line, emit, event, fields]
        self._kinds: dict[object, list[Any]] = {}

    def __call__(self, kind: object, emit: Callable[..., Any], event: str, **fields: Any) -> None:
        """Log ``event`` with ``emit`` (``log.warning``...) or count it under ``kind``."""
        now = self._clock()
        entry = self._kinds.get(kind)
        if entry is None:
            self._kinds[kind] = [0, now, emit, event, fields]
            emit(event, **fields)
            return
        entry[0] += 1
        entry[2:] = emit, event, fields
        if now - entry[1] >= self.interval_s:
            emit(event, repeated=entry[0], **fields)
            entry[0], entry[1] = 0, now

    def flush(self) -> None:
        """Log the count of every kind repeated since its last line (the session ends)."""
        for entry in self._kinds.values():
            count, _, emit, event, fields = entry
            if count:
                emit(event, repeated=count, **fields)
                entry[0], entry[1] = 0, self._clock()
