"""The outbound queue toward one side: bounded, ordered, and (later) coalescing under backpressure.

Contract: owns what waits to be written to a peer and in which order. The shell pushes frames
while there is room and takes everything ready when the peer can accept a write. Pure: no I/O, no
clock (``now`` is passed in, in seconds, from a monotonic clock).

SKELETON: plain FIFO with bounds; coalescing (issue 4) is added behind the same API.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from acp_proxy.config import CoalesceConfig
from acp_proxy.jsontypes import JsonObject


@dataclass(frozen=True, slots=True)
class OutFrame:
    """One frame to write: its bytes *without* the trailing newline."""

    raw: bytes
    # The decoded message when the pipeline already parsed it (a single message, not a batch),
    # so the queue does not parse twice. ``None``: not parsed (or a batch / non-JSON line).
    message: JsonObject | None = None
    # The protocol version negotiated when the frame was produced.
    version: int | None = None


@dataclass(slots=True)
class QueueStats:
    pushed: int = 0  # frames pushed
    written: int = 0  # frames handed out by take()
    merged: int = 0  # frames absorbed into a pending frame
    split: int = 0  # extra frames created by clear-then-object splits


class OutboundQueue:
    """A bounded FIFO of frames toward one peer."""

    __slots__ = ("_bytes", "_config", "_frames", "_merge", "stats")

    def __init__(self, config: CoalesceConfig, *, coalesce: bool) -> None:
        self._config = config
        self._merge = coalesce and config.enabled
        self._frames: deque[OutFrame] = deque()
        self._bytes = 0
        self.stats = QueueStats()

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    def has_room(self) -> bool:
        """True while below both bounds; the shell stops reading from the producer otherwise."""
        return (
            len(self._frames) < self._config.max_queue_messages
            and self._bytes < self._config.max_queue_bytes
        )

    def push(self, frame: OutFrame, now: float) -> None:
        """Append ``frame`` (the caller has checked ``has_room``, or must push regardless)."""
        self.stats.pushed += 1
        self._frames.append(frame)
        self._bytes += len(frame.raw) + 1

    def take(self, now: float) -> tuple[list[bytes], float | None]:
        """Everything ready to write now, each frame ending in ``\\n``, and when to call again.

        The deadline (same clock as ``now``) is set when frames are held back by the rate limit;
        ``None`` means "call again when something is pushed".
        """
        out = [f.raw + b"\n" for f in self._frames]
        self.stats.written += len(out)
        self._frames.clear()
        self._bytes = 0
        return out, None
