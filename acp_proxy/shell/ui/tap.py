"""The live view's tap on one session: what it keeps of each frame, and nothing more.

Contract: ``UiTap`` is the ``SessionObserver`` the live view (``acp_proxy.shell.ui.hub``) puts on
each session. It reads only the frames of the notes (``frames_only``: the session's core then
watches rather than observes, its fast paths kept, ``wire.connection.observe.watched``) and hands
the hub one item per run of frames that passed as they came (their bytes, as read: one
reference, no copy) and per other frame (its bytes, what was sent instead, the replies, who
changed it, what the links marked its messages with: ``FrameInfo.marks``), each with what it
costs; it describes nothing (the hub does, when someone looks). A frame longer than
``FRAME_SHOWN`` keeps its first bytes only (with the frames sent instead), the rest counted.
Never raises into the session, never waits.

Items are tuples: the session's ``conn``, the time since it started, what it is, its fields,
and last what it costs (``ITEM_BYTES`` beside the bytes it holds):

- ``(conn, t, "frame", direction, raw, sent, changed_by, kind, generated, cut, marks, size)``:
  ``kind`` ``None`` when the frame passed as it came (what it is is found when it is described,
  ``acp_proxy.ui.events.passed``), ``cut`` the bytes left out, ``marks`` its messages' marks
  (shown as its ``policy``, ``acp_proxy.ui.events.policy_marks``) or ``()``;
- ``(conn, t, "run", direction, parts, count, size)``: ``count`` frames that passed as they
  came, in ``parts`` (each some of them joined with ``\\n``, as the core reported them);
- ``(conn, t, "stderr", line, size)``; ``(conn, t, "version" | "end" | "coalesced", fields,
  size)``; ``(conn, t, name, fields, size)`` of a session's event (``event``: a detach, a
  reattach); ``(conn, t, "session", None, size)``; and the hub's own ``lost`` items.
"""

from __future__ import annotations

import time
from typing import Any, Final, Protocol

from acp_proxy.config import DEFAULT_MAX_PARSE_BYTES
from acp_proxy.record.format import AGENT_TO_CLIENT, CLIENT_TO_AGENT
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.take import Coalesced
from acp_proxy.wire.connection.observe import passed_kind
from acp_proxy.wire.notes import Observed, Passed, VersionNegotiated

FRAME_SHOWN: Final = 256 * 1024  # the bytes of a frame the view keeps (the rest is counted)
ITEM_BYTES: Final = 256  # what a tapped item costs beside its frames' bytes (counted)
NOTE_BYTES: Final = 512  # what a tapped merge note holds (counted as its cost)

DIRECTIONS: Final = {
    Direction.CLIENT_TO_AGENT: CLIENT_TO_AGENT,
    Direction.AGENT_TO_CLIENT: AGENT_TO_CLIENT,
}
_OTHER: Final = {
    Direction.CLIENT_TO_AGENT: AGENT_TO_CLIENT,
    Direction.AGENT_TO_CLIENT: CLIENT_TO_AGENT,
}


class Ingest(Protocol):
    """What the tap hands its items to (the hub)."""

    def ingest(self, item: tuple[Any, ...], size: int) -> None: ...


class UiTap:
    """The ``SessionObserver`` of one session for the live view (see the module docstring)."""

    __slots__ = ("conn", "hub", "max_parse", "start")

    frames_only: Final = True  # (``hooks.SessionObserver``)

    def __init__(self, hub: Ingest, conn: int, max_parse: int = DEFAULT_MAX_PARSE_BYTES) -> None:
        self.hub = hub
        self.conn = conn
        self.max_parse = max_parse  # the session's parse budget (what a passed frame is)
        self.start = time.monotonic()

    def on_notes(self, notes: tuple[Any, ...], now: float) -> None:
        t = now - self.start
        hub = self.hub
        # Consecutive runs of one direction (a read's, between the frames a middleware or the
        # request tables looked at and let pass) are one item: what a read costs the tap.
        parts: list[bytes] = []
        run_to: Direction | None = None  # their direction
        count = size = 0
        for note in notes:
            kind = type(note)
            if kind is Passed:
                if note.direction is not run_to:
                    if parts:
                        self._run(run_to, parts, count, size, t)
                        parts = []
                    run_to, count, size = note.direction, 0, ITEM_BYTES
                lengths = [len(part) for part in note.parts]
                if max(lengths) <= FRAME_SHOWN:
                    parts += note.parts
                    size += sum(lengths)
                    count += note.count
                    continue
                for part in note.parts:  # (a frame of it may be longer than the view keeps)
                    if len(part) > FRAME_SHOWN:
                        if parts:
                            self._run(run_to, parts, count, size, t)
                            parts, count, size = [], 0, ITEM_BYTES
                        for raw in part.split(b"\n"):
                            self._frame(DIRECTIONS[note.direction], raw, t)
                        continue
                    parts.append(part)
                    size += len(part)
                    count += 1 + part.count(b"\n")
                continue
            if parts:
                self._run(run_to, parts, count, size, t)
                parts, run_to = [], None
            if kind is Observed:
                changed_by: list[str] = []
                marks: tuple[object, ...] = ()
                for info in note.messages:
                    if info.changed_by:
                        changed_by.extend(n for n in info.changed_by if n not in changed_by)
                    if info.marks:
                        marks += info.marks
                direction = DIRECTIONS[note.direction]
                self._frame(
                    direction,
                    note.raw,
                    t,
                    sent=note.sent,
                    changed_by=changed_by,
                    kind=note.kind,
                    marks=marks,
                )
                for reply in note.replies:
                    self._frame(_OTHER[note.direction], reply, t, kind="message", generated=True)
            elif kind is VersionNegotiated:
                fields = {"protocolVersion": note.version}
                hub.ingest((self.conn, t, "version", fields, ITEM_BYTES), ITEM_BYTES)
        if parts:
            self._run(run_to, parts, count, size, t)

    def _run(
        self, direction: Direction | None, parts: list[bytes], count: int, size: int, t: float
    ) -> None:
        """Hand the hub ``count`` frames that passed as they came (``parts``: runs of them)."""
        assert direction is not None  # (parts come with their direction)
        item = (self.conn, t, "run", DIRECTIONS[direction], parts, count, size)
        self.hub.ingest(item, size)

    def _frame(
        self,
        direction: str,
        raw: bytes,
        t: float,
        *,
        sent: tuple[bytes, ...] | None = None,
        changed_by: list[str] | tuple[()] = (),
        kind: str | None = None,
        marks: tuple[object, ...] = (),
        generated: bool = False,
    ) -> None:
        """Hand the hub one frame (``kind`` ``None``: it passed as it came)."""
        size = len(raw)
        if sent:
            size += sum(map(len, sent))
        cut = 0
        if size > FRAME_SHOWN:
            if kind is None:  # found now: only its first bytes are kept
                kind = passed_kind(raw, self.max_parse)
            raw, sent, cut = _shown(raw, sent, size)
            size -= cut
        size += ITEM_BYTES
        item = (self.conn, t, "frame", direction, raw, sent, changed_by, kind, generated, cut)
        self.hub.ingest((*item, marks, size), size)

    def on_generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        t = now - self.start
        for frame in frames:
            self._frame(DIRECTIONS[direction], frame, t, kind="message", generated=True)

    def on_coalesced(self, direction: Direction, merge: Coalesced, now: float) -> None:
        fields = {
            "direction": DIRECTIONS[direction],
            "update": merge.kind,
            "entity": list(merge.entity),
            "frames": merge.merged,
            "written": merge.written,
            "bytes": merge.size,
        }
        item = (self.conn, now - self.start, "coalesced", fields, NOTE_BYTES)
        self.hub.ingest(item, NOTE_BYTES)  # (more than the note and its item hold)

    def event(self, name: str, now: float, **fields: object) -> None:  # as Recorder.event
        self.hub.ingest((self.conn, now - self.start, name, fields, NOTE_BYTES), NOTE_BYTES)

    def on_end(self, session: Any, now: float) -> None:
        summary = dict(session.summary())
        version = summary.pop("version", None)
        fields = {"exit": None, "protocolVersion": version, "summary": summary}
        self.hub.ingest((self.conn, now - self.start, "end", fields, ITEM_BYTES), ITEM_BYTES)


def cut(frame: bytes, keep: int) -> bytes:
    """The first ``keep`` bytes of ``frame`` at most, not ending inside a UTF-8 sequence."""
    if len(frame) <= keep:
        return frame
    while keep > 0 and frame[keep] & 0xC0 == 0x80:
        keep -= 1
    return frame[:keep]


def _shown(
    raw: bytes, sent: tuple[bytes, ...] | None, size: int
) -> tuple[bytes, tuple[bytes, ...] | None, int]:
    """What the view keeps of a frame and the frames sent instead (``size`` bytes together):
    ``FRAME_SHOWN`` bytes at most, the frame first; and how many bytes it leaves out."""
    kept = cut(raw, FRAME_SHOWN)
    left = FRAME_SHOWN - len(kept)
    if sent:
        shown_sent = []
        for frame in sent:
            part = cut(frame, left)
            shown_sent.append(part)
            left -= len(part)
        sent = tuple(shown_sent)
    return kept, sent, size - (FRAME_SHOWN - left)
