"""Log lines for what the core reports: one session's notes turned into structured log events.

Contract: owns the wording and level of the log line for each kind of ``Note`` the pipeline
returns (warnings for non-JSON output, oversize frames, middleware failures, refused requests;
info for the negotiated version and dropped messages) and hands the debug frame notes to the
``FrameLog``. It never changes a frame and never raises for a value it cannot log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from acp_proxy.shell.log.repeats import Repeats
from acp_proxy.wire.connection.pipeline import (
    Dropped,
    FrameInfo,
    MiddlewareFailed,
    NonJson,
    Note,
    NotParsed,
    Observed,
    OversizeFrame,
    PendingFull,
    Rewritten,
    SkippedV1,
    UnusualVersion,
    VersionNegotiated,
)
from acp_proxy.wire.notes import Passed

if TYPE_CHECKING:
    from acp_proxy.record.settings import RecordConfig
    from acp_proxy.shell.log.framelog import FrameLog


class NoteLog:
    """Logs one session's notes on ``log``; ``frame_log`` (debug only) gets the frame notes.

    ``debug``: the debug level is on (every non-JSON line is logged, not only the first of its
    kind); ``record``: the redaction settings applied to samples of the agent's own output.
    """

    __slots__ = ("debug", "frame_log", "log", "record", "repeats")

    def __init__(
        self, log: Any, frame_log: FrameLog | None, debug: bool, record: RecordConfig
    ) -> None:
        self.log = log
        self.frame_log = frame_log
        self.debug = debug
        self.record = record
        # Warnings a peer can repeat at will: logged once, then counted.
        self.repeats = Repeats()

    def flush(self) -> None:
        """The session ends: log how often each counted warning repeated since its last line."""
        self.repeats.flush()

    def __call__(self, notes: tuple[Note, ...]) -> None:
        log = self.log
        frame_log = self.frame_log
        for note in notes:
            if type(note) is Passed:  # (frames a watcher keeps: nothing to log)
                continue
            if type(note) is FrameInfo:
                if frame_log is not None:
                    frame_log.frame(note)
            elif type(note) is Rewritten:
                if frame_log is not None:
                    frame_log.rewritten(note)
            elif type(note) is SkippedV1:
                if frame_log is not None:
                    frame_log.skipped(note)
            elif type(note) is Observed:
                if frame_log is not None:
                    frame_log.observed(note)
            elif type(note) is NonJson:
                # Warn once per kind (the pipeline marks the first), then only count (summary).
                if note.first_of_kind or self.debug:
                    from acp_proxy.shell.log.framelog import redacted_text

                    (log.warning if note.first_of_kind else log.debug)(
                        "agent wrote non-JSON output"
                        + ("; forwarded" if note.forwarded else "; diverted to the log")
                        + (
                            " (further lines of this kind are only counted)"
                            if note.first_of_kind
                            else ""
                        ),
                        kind=note.kind,
                        size=note.size,
                        # The agent's own output: secrets in it stay out of the log (the record's
                        # redaction rules apply to log samples too).
                        sample=redacted_text(self.record, note.sample),
                    )
            elif type(note) is OversizeFrame:
                self.repeats(
                    OversizeFrame,
                    log.warning,
                    "frame over the size limit discarded",
                    size=note.size,
                    limit=note.limit,
                    id=_loggable(note.request_id),
                    replied=note.replied,
                    answered=note.answered,
                )
            elif type(note) is MiddlewareFailed:
                failure = note.failure
                self.repeats(
                    (MiddlewareFailed, failure.middleware, failure.fail_closed),
                    log.error,
                    "middleware failed",
                    middleware=failure.middleware,
                    error=failure.error,
                    policy="fail-closed: message dropped"
                    if failure.fail_closed
                    else "fail-open: message forwarded unchanged",
                )
            elif type(note) is VersionNegotiated:
                log.info("protocol version negotiated", version=note.version)
            elif type(note) is Dropped:
                log.info("message dropped by middleware", method=note.method, by=note.dropped_by)
            elif type(note) is NotParsed:
                # Warn for the first, then count (the summary's ``not_parsed``).
                (log.warning if note.first_of_kind else log.debug)(
                    "frame could not be parsed; forwarded untouched, no rule applied"
                    + (" (further ones are only counted)" if note.first_of_kind else ""),
                    direction=str(note.direction),
                    size=note.size,
                    reason=note.reason,
                )
            elif type(note) is UnusualVersion:
                self.repeats(
                    UnusualVersion,
                    log.warning,
                    "initialize response has an unusual protocolVersion",
                    protocol_version=note.value,
                    action=note.action,
                )
            elif type(note) is PendingFull:
                self.repeats(
                    (PendingFull, note.direction),
                    log.warning,
                    "too many requests awaiting an answer; request answered with an error",
                    direction=str(note.direction),
                    method=note.method,
                    limit=note.limit,
                )


def _loggable(value: object) -> object:
    # orjson cannot encode integers above 64 bits; a log line must never fail.
    if type(value) is int and not -(2**63) <= value < 2**64:
        return str(value)
    return value
