"""The pace of the consumer behind an outbound queue: how many lines a second it reads.

Contract: pure (the caller passes the times, from a monotonic clock). Two sources, the better
one winning: what the writer measured of the peer itself (``consumed``: bytes the peer read,
from what the kernel says is still unread, smoothed over windows), else what the writer took
from the queue (``taken``: lines over windows of ``RATE_WINDOW_S``). The queue weighs a merge
pass against it (``coalesce.MERGE_COST_S`` a line): merging pays only for a slow consumer.
"""

from __future__ import annotations

from typing import Final

# Rates are measured over windows of at least this long (a shorter span is too noisy to say
# anything; a longer one reacts late when a paused client resumes).
RATE_WINDOW_S: Final = 0.005
_MIN_SPAN_S: Final = 0.001
# The weight of the newest window in the smoothed pace of the peer: a slow client catching up
# after a stall reads in a burst; a fast one shows it in a window or two.
_WEIGHT: Final = 0.25


class Pace:
    """The consumer's pace in lines a second (see the module docstring)."""

    __slots__ = ("_consumer", "_rate", "_win_lines", "_win_start")

    def __init__(self) -> None:
        self._consumer: float | None = None  # measured of the peer (``consumed``), smoothed
        self._rate = 0.0  # lines taken a second over the last complete window
        self._win_start: float | None = None  # the window being measured: its start ...
        self._win_lines = 0  # ... and the lines taken since

    def lines_per_s(self, now: float) -> float:
        """The pace (0.0: unknown, or the consumer reads nothing).

        Of what was taken, the window being measured counts once it spans ``_MIN_SPAN_S`` (it
        is the newest word: a stall shows at once, and so does a paused client that resumed);
        before that, the last complete window."""
        if self._consumer is not None:
            return self._consumer
        start = self._win_start
        if start is None:
            return 0.0
        span = now - start
        if span >= _MIN_SPAN_S:
            return self._win_lines / span
        return self._rate

    def taken(self, lines: int, now: float) -> None:
        """The writer took ``lines`` from the queue at ``now``."""
        start = self._win_start
        if start is None:
            self._win_start, self._win_lines = now, 0
            return
        self._win_lines += lines
        span = now - start
        if span >= RATE_WINDOW_S:
            self._rate = self._win_lines / span
            self._win_start, self._win_lines = now, 0

    def consumed(self, lines: float, span: float) -> None:
        """The peer read about ``lines`` lines in the last ``span`` seconds."""
        if span > 0.0:
            rate = lines / span
            last = self._consumer
            self._consumer = rate if last is None else last + _WEIGHT * (rate - last)
