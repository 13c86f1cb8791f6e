"""``--record``: one session's frames appended to a JSON Lines file while they pass.

Contract: owns the record file of one session. A ``Recorder`` is a ``SessionObserver``: it turns
each observation into record lines (``acp_proxy.record.format``, which also redacts) on the
session's task, and hands them to a writer thread that appends them with one ``write`` per
batch on an ``O_APPEND`` descriptor, so every frame reaches the kernel as soon as the thread
gets to it (a killed proxy loses at most the lines not yet handed over). The session never waits
for the disk: the queue holds at most ``QUEUE_BYTES``; past that, lines are dropped and counted
(a ``"lost"`` event says how many), never buffered without bound. After ``max_bytes`` the
recorder writes a ``"stopped"`` line, logs a warning and records nothing more.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from acp_proxy import __version__
from acp_proxy.record.format import (
    AGENT_TO_CLIENT,
    CLIENT_TO_AGENT,
    RecordConfig,
    Redactor,
    event_line,
    frame_line,
    header,
)
from acp_proxy.record.settings import RECORD_FILE_MODE, RECORD_OPEN_FLAGS
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.pipeline import Observed, VersionNegotiated

if TYPE_CHECKING:
    from acp_proxy.config import Config
    from acp_proxy.shell.hooks import EndedSession
    from acp_proxy.wire.pipeline import Note

# Lines waiting for the writer thread, in bytes: past this the session drops lines rather than
# wait for a slow disk (a frame may be up to max_frame_bytes, so a single line may exceed it).
QUEUE_BYTES = 16 * 1024 * 1024

_DIR = {Direction.CLIENT_TO_AGENT: CLIENT_TO_AGENT, Direction.AGENT_TO_CLIENT: AGENT_TO_CLIENT}
_OTHER = {Direction.CLIENT_TO_AGENT: AGENT_TO_CLIENT, Direction.AGENT_TO_CLIENT: CLIENT_TO_AGENT}


def build_redactor(settings: RecordConfig) -> Redactor:
    """The redactor of the ``record:`` settings (its patterns were checked by the config)."""
    return Redactor.build(settings.redact, settings.redact_patterns)


def record_path(path: str, conn: int | None) -> str:
    """The file for connection ``conn``: ``{conn}`` in ``path`` replaced; a directory gets
    ``session-<UTC time>-<pid>-<conn>.jsonl`` inside it."""
    if conn is not None and "{conn}" in path:
        return path.replace("{conn}", str(conn))
    if os.path.isdir(path) or path.endswith(os.sep):
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        name = f"session-{stamp}-{os.getpid()}" + (f"-{conn}" if conn is not None else "")
        return os.path.join(path, name + ".jsonl")
    return path


class _Writer:
    """A thread that appends queued lines to a descriptor; bounded queue, never blocks callers."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._lost = 0
        self._closed = False
        self._cond = threading.Condition()
        self.error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="acp-proxy-recorder", daemon=True)
        self._thread.start()

    def put(self, line: bytes, now: float, start: float) -> bool:
        """Queue ``line``; False (and counted) when the queue is full or the file failed."""
        with self._cond:
            if self.error is not None or self._closed:
                return False
            if self._queued + len(line) > QUEUE_BYTES and self._queue:
                self._lost += 1
                return False
            if self._lost:
                lost = event_line(now - start, "lost", frames=self._lost)
                self._queue.append(lost)
                self._queued += len(lost)
                self._lost = 0
            self._queue.append(line)
            self._queued += len(line)
            self._cond.notify()
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue and self._closed:
                    return
                batch = b"".join(self._queue)
                self._queue.clear()
                self._queued = 0
            try:
                view = memoryview(batch)
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError as exc:
                with self._cond:
                    self.error = exc
                    self._queue.clear()
                return

    def close(self, timeout: float) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
        os.close(self._fd)


class Recorder:
    """The ``SessionObserver`` that records one session (see the module docstring)."""

    def __init__(
        self,
        path: str,
        settings: RecordConfig,
        redactor: Redactor,
        *,
        log: Any,
        agent: Sequence[str] | None,
        connect: str | None,
        config: Config,
        conn: int | None = None,
    ) -> None:
        """Open ``path`` for appending and write the header; ``OSError`` if it cannot."""
        self.path = path
        self.log = log
        self.redactor = redactor
        self.max_bytes = settings.max_bytes
        self.start = time.monotonic()
        self.version: int | None = None
        self.written = 0
        self.stopped = False
        self._summary: dict[str, Any] | None = None
        self._ended: float | None = None
        self._finished = False
        fd = os.open(path, RECORD_OPEN_FLAGS, RECORD_FILE_MODE)
        self._writer = _Writer(fd)
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
        self._put(
            header(
                started=started,
                version=__version__,
                agent=agent,
                connect=connect,
                config=config.source,
                rules=config.rule_names,
                middleware=[spec.name for spec in config.middleware],
                conn=conn,
                redactor=redactor,
                extra_keys=settings.redact,
                extra_patterns=settings.redact_patterns,
            ),
            self.start,
        )

    def _put(self, line: bytes, now: float) -> None:
        if self.stopped:
            return
        if self.written + len(line) > self.max_bytes:
            self.stopped = True
            self._writer.put(
                event_line(now - self.start, "stopped", reason="record.max_bytes reached"),
                now,
                self.start,
            )
            self.log.warning(
                "record size limit reached; recording stopped",
                record=self.path,
                max_bytes=self.max_bytes,
            )
            return
        if self._writer.put(line, now, self.start):
            self.written += len(line)
        elif self._writer.error is not None and not self.stopped:
            self.stopped = True
            self.log.error(
                "cannot write the record; recording stopped",
                record=self.path,
                error=self._writer.error.strerror or str(self._writer.error),
            )

    # -- SessionObserver --------------------------------------------------------------------

    def on_notes(self, notes: tuple[Note, ...], now: float) -> None:
        if self.stopped:
            return
        t = now - self.start
        redactor = self.redactor
        for note in notes:
            if type(note) is Observed:
                changed_by: list[str] = []
                for info in note.messages:
                    changed_by.extend(n for n in info.changed_by if n not in changed_by)
                self._put(
                    frame_line(
                        t,
                        _DIR[note.direction],
                        note.raw,
                        redactor,
                        sent=note.sent,
                        changed_by=changed_by,
                        kind=note.kind,
                    ),
                    now,
                )
                for reply in note.replies:
                    line = frame_line(t, _OTHER[note.direction], reply, redactor, generated=True)
                    self._put(line, now)
            elif type(note) is VersionNegotiated:
                self.version = note.version
                self._put(event_line(t, "version", protocolVersion=note.version), now)

    def on_generated(self, direction: Direction, frames: tuple[bytes, ...], now: float) -> None:
        t = now - self.start
        for frame in frames:
            self._put(frame_line(t, _DIR[direction], frame, self.redactor, generated=True), now)

    def event(self, name: str, now: float, **fields: object) -> None:
        """An event line the session's transport adds (a proxy component records its
        conductor's dialect and each envelope's hop metadata: ``shell.component``)."""
        self._put(event_line(now - self.start, name, **fields), now)

    def on_end(self, session: EndedSession, now: float) -> None:
        self._summary = session.summary()
        self._ended = now

    def finish(self, exit_info: dict[str, Any] | None = None) -> None:
        """Write the trailer (``exit_info``: the agent's exit, when known) and close the file."""
        if self._finished:
            return
        self._finished = True
        now = self._ended if self._ended is not None else time.monotonic()
        summary = dict(self._summary or {})
        summary.pop("version", None)
        self._put(
            event_line(
                now - self.start,
                "end",
                exit=exit_info,
                protocolVersion=self.version,
                summary=summary,
            ),
            now,
        )
        self._writer.close(timeout=10.0)


def open_recorder(
    config: Config,
    *,
    log: Any,
    agent: Sequence[str] | None = None,
    connect: str | None = None,
    conn: int | None = None,
    path: str | None = None,
) -> Recorder | None:
    """The recorder the config asks for (``None``: not recording, or the file cannot be opened,
    which is logged: a session is never refused because its record cannot be written)."""
    settings = config.record
    base = path if path is not None else settings.path
    if base is None:
        return None
    target = record_path(base, conn)
    try:
        recorder = Recorder(
            target,
            settings,
            build_redactor(settings),
            log=log,
            agent=agent,
            connect=connect,
            config=config,
            conn=conn,
        )
    except OSError as exc:
        log.error("cannot open the record file", record=target, error=exc.strerror or str(exc))
        return None
    log.info("recording", record=target)
    return recorder


def exit_info(returncode: int) -> dict[str, Any]:
    """The trailer's ``exit`` object for an agent's raw return code."""
    from acp_proxy.shell.process import describe_status, exit_code_of

    return {
        "code": exit_code_of(returncode),
        "signal": -returncode if returncode < 0 else None,
        "status": describe_status(returncode),
    }
