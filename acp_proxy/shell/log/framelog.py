"""The debug log's per-frame lines.

Contract: owns what ``--log-level debug`` says about each frame beyond its method: a response's
request method and latency, the frames the proxy inserted or generated, the v1 ``safe`` skips
with their reason, and with ``--log-frames`` the frame's contents (redacted with the record's
rules, then truncated). ``PumpSession`` calls it from its note logging, on the session's task;
it keeps one bounded table of request times per session.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from typing import Any

import orjson

from acp_proxy.record.format import RecordConfig, Redactor
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.connection.pipeline import FrameInfo, Observed, Rewritten, SkippedV1

# ``--log-frames``: the contents of each frame, at most this many characters per frame.
FRAME_LOG_LIMIT = 2000
# Requests whose send time is remembered for the latency of their response (oldest forgotten).
MAX_TIMED_REQUESTS = 10_000

_state: dict[str, Any] = {"frames": False}


def enable_frame_contents(on: bool = True) -> None:
    """``--log-frames``: debug lines carry each frame's (redacted, truncated) contents."""
    _state["frames"] = on


def frame_contents_enabled() -> bool:
    return bool(_state["frames"])


@functools.lru_cache(maxsize=8)
def _redactor(record: RecordConfig) -> Redactor:
    return Redactor.build(record.redact, record.redact_patterns)


def redacted_text(record: RecordConfig, raw: bytes) -> str:
    """``raw`` (a sample of agent output quoted in a log line) with its secrets removed."""
    cleaned, _ = _redactor(record).frame(raw)
    return cleaned.decode("utf-8", "backslashreplace")


def _id_key(direction: Direction, value: object) -> tuple[str, str]:
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # beyond 64 bits
        text = str(value)
    return (str(direction), text)


def _loggable(value: object) -> object:
    if type(value) is int and not -(2**63) <= value < 2**64:
        return str(value)
    return value


class FrameLog:
    """One session's debug frame lines."""

    def __init__(self, log: Any, record: RecordConfig) -> None:
        self.log = log
        self.contents = frame_contents_enabled()
        self.redactor = _redactor(record)
        self._sent: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()

    def text(self, raw: bytes) -> str:
        """``raw`` redacted, decoded and truncated to ``FRAME_LOG_LIMIT`` characters."""
        cleaned, _ = self.redactor.frame(raw)
        text = cleaned.decode("utf-8", "backslashreplace")
        if len(text) > FRAME_LOG_LIMIT:
            return text[:FRAME_LOG_LIMIT] + f"… ({len(text) - FRAME_LOG_LIMIT} more)"
        return text

    def frame(self, note: FrameInfo) -> None:
        now = time.monotonic()
        fields: dict[str, Any] = {}
        if note.method is not None and note.id is not None:
            # A request: remember when it passed, for its response's latency.
            self._sent[_id_key(note.direction, note.id)] = (note.method, now)
            if len(self._sent) > MAX_TIMED_REQUESTS:
                self._sent.popitem(last=False)
        elif note.method is None and note.id is not None:
            other = (
                Direction.CLIENT_TO_AGENT
                if note.direction is Direction.AGENT_TO_CLIENT
                else Direction.AGENT_TO_CLIENT
            )
            asked = self._sent.pop(_id_key(other, note.id), None)
            fields["answers"] = note.answers or (asked[0] if asked else None)
            if asked is not None:
                fields["latency_ms"] = round((now - asked[1]) * 1000, 3)
        self.log.debug(
            "frame",
            direction=str(note.direction),
            method=note.method,
            id=_loggable(note.id),
            update=note.update_kind,
            size=note.size,
            changed_by=list(note.changed_by) or None,
            **fields,
        )

    def rewritten(self, note: Rewritten) -> None:
        self.log.debug("rewritten", method=note.method, changed_by=list(note.changed_by))
        if note.count > 1:
            self.log.debug(
                "frames inserted after it",
                method=note.method,
                inserted=note.count - 1,
                changed_by=list(note.changed_by),
            )

    def skipped(self, note: SkippedV1) -> None:
        self.log.debug(
            "v1 update not annotated (v1.mode: safe)",
            method=note.method,
            update=note.update_kind,
            rules=list(note.rules),
            reason="the update carries no _meta object; adding one would erase the agent's "
            "metadata (a v1 client replaces _meta whole); v1.mode: stateful annotates it",
        )

    def observed(self, note: Observed) -> None:
        if not self.contents:
            return
        fields: dict[str, Any] = {"raw": self.text(note.raw)}
        if note.sent is not None:
            fields["sent"] = [self.text(f) for f in note.sent]
        self.log.debug("frame contents", direction=str(note.direction), **fields)

    def generated(self, toward: Direction, frames: tuple[bytes, ...]) -> None:
        fields: dict[str, Any] = {"count": len(frames)}
        if self.contents:
            fields["frames"] = [self.text(f) for f in frames[:10]]
        self.log.debug("frames generated by the proxy", direction=str(toward), **fields)
