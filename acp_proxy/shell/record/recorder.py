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
import select
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
from acp_proxy.shell.record.recordfile import open_fifo, open_record_file
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.connection.pipeline import Observed, VersionNegotiated

if TYPE_CHECKING:
    from acp_proxy.config import Config
    from acp_proxy.shell.session.hooks import EndedSession
    from acp_proxy.wire.connection.pipeline import Note

# Lines waiting for the writer thread, in bytes: past this the session drops lines rather than
# wait for a slow disk (a frame may be up to max_frame_bytes, so a single line may exceed it).
QUEUE_BYTES = 16 * 1024 * 1024
# One write: lines are joined up to this (one line alone may be longer).
BATCH_BYTES = 1024 * 1024
# How long the end of a session waits for the record's last lines to be written; then what is
# left is counted lost (logged), and the process goes on to exit.
EXIT_WAIT_S = 2.0
# How often a writer waiting on a FIFO (no reader, or a full pipe) looks again.
POLL_S = 0.05

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
    """A thread that appends queued lines to the record; bounded queue, never blocks callers.

    The session's side (``put``) only queues: past ``QUEUE_BYTES`` a line is dropped and
    counted. The thread writes batches of at most ``BATCH_BYTES``; a descriptor that does not
    take them (a FIFO whose reader pauses: non-blocking, polled) holds the batch while the queue
    fills; a write that fails (a full disk, ``ulimit -f``) drops that batch, counted, and the
    next batch is tried (a line cut short by the failure is ended first, so a reader sees one
    unusable line, never two lines glued together). Every dropped line is reported in the file
    by a ``lost`` line put before the next line queued (a dropped ``lost`` line carries its
    count on). A FIFO with no reader yet is opened once one comes.
    """

    def __init__(self, fd: int | None, path: str) -> None:
        self._fd = fd
        self._path = path
        self._queue: deque[tuple[bytes, int]] = deque()  # (line, lines it stands for)
        self._queued = 0
        self._lost = 0  # dropped, not yet reported by a queued "lost" line
        self.lost_total = 0  # every line dropped (a "lost" line itself not counted)
        self._closed = False
        self._abandoned = False
        self._torn = False  # the last write stopped inside a line
        self._inflight: list[tuple[bytes, int]] | None = None  # the batch being written
        self._cond = threading.Condition()
        self.error: OSError | None = None  # the last write's error; None once one succeeds
        self.errors = 0  # write failures so far
        self._thread = threading.Thread(target=self._run, name="acp-proxy-recorder", daemon=True)
        self._thread.start()

    def put(self, line: bytes, now: float, start: float) -> bool:
        """Queue ``line``; False (and counted) when the queue is full or the writer closed."""
        with self._cond:
            if self._closed:
                return False
            if self._queued + len(line) > QUEUE_BYTES and self._queue:
                self._lost += 1
                self.lost_total += 1
                return False
            if self._lost:
                lost = event_line(now - start, "lost", frames=self._lost)
                self._queue.append((lost, self._lost))
                self._queued += len(lost)
                self._lost = 0
            self._queue.append((line, 0))
            self._queued += len(line)
            self._cond.notify()
        return True

    def _drop(self, lines: Sequence[tuple[bytes, int]]) -> None:
        """Count ``lines`` as lost (the lock held)."""
        for _line, carried in lines:
            if carried:
                self._lost += carried  # a "lost" line: its count goes on
            else:
                self._lost += 1
                self.lost_total += 1

    def _take(self) -> list[tuple[bytes, int]] | None:
        """The next batch (``None``: closed and drained, or abandoned)."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._abandoned or not self._queue:
                return None
            batch: list[tuple[bytes, int]] = []
            size = 0
            while self._queue and (not batch or size + len(self._queue[0][0]) <= BATCH_BYTES):
                item = self._queue.popleft()
                batch.append(item)
                size += len(item[0])
            self._queued -= size
            self._inflight = batch
            return batch

    def _run(self) -> None:
        try:
            while (batch := self._take()) is not None:
                self._write(batch)
        finally:
            with self._cond:
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
                self._cond.notify_all()

    def _ready(self) -> bool:
        """Whether there is a descriptor to write to (a FIFO's reader may come later)."""
        while self._fd is None:
            try:
                self._fd = open_fifo(self._path)
            except OSError as exc:
                self._failed(exc)
                return False
            if self._fd is None:
                with self._cond:
                    if self._abandoned:
                        return False
                    self._cond.wait(POLL_S)
        return True

    def _failed(self, exc: OSError) -> None:
        with self._cond:
            self.error = exc
            self.errors += 1

    def _write(self, batch: list[tuple[bytes, int]]) -> None:
        if not self._ready():
            with self._cond:
                if self._inflight is batch:
                    self._drop(batch)
                self._inflight = None
            return
        assert self._fd is not None
        data = (b"\n" if self._torn else b"") + b"".join(line for line, _ in batch)
        skip = 1 if self._torn else 0  # the newline that ends a torn line is no line of its own
        view = memoryview(data)
        done = 0
        while done < len(data):
            with self._cond:
                abandoned = self._abandoned
            if abandoned:
                break
            try:
                done += os.write(self._fd, view[done:])
            except BlockingIOError:
                select.select([], [self._fd], [], POLL_S)
            except OSError as exc:
                self._failed(exc)
                break
        if done == len(data):
            self._torn = False
            with self._cond:
                self.error = None
                self._inflight = None
            return
        if done:
            self._torn = data[done - 1 : done] != b"\n"
        # What was not written whole is lost.
        ends = []
        offset = skip
        for line, _ in batch:
            offset += len(line)
            ends.append(offset)
        with self._cond:
            if self._inflight is batch:
                self._drop([item for item, end in zip(batch, ends, strict=True) if end > done])
            self._inflight = None

    def close(self, timeout: float) -> int:
        """Stop taking lines; wait up to ``timeout`` seconds for the queue to be written, then
        give up on what is left. Returns how many lines the file did not get in all."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            return self.lost_total
        with self._cond:
            self._abandoned = True
            self._drop(list(self._queue))
            self._queue.clear()
            self._cond.notify_all()
        # A writer waiting on a FIFO sees that at once and counts what it holds; one inside a
        # write to a slow disk cannot: what it holds is counted here.
        self._thread.join(4 * POLL_S)
        with self._cond:
            if self._inflight is not None:
                self._drop(self._inflight)
                self._inflight = None
            return self.lost_total


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
        fd, _fifo = open_record_file(path)
        self._writer = _Writer(fd, path)
        self._failing = False  # a write error was logged; the file has not taken lines since
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
                rule_keys=_rule_keys(config),
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
        error = self._writer.error
        if error is not None and not self._failing:
            self._report(error)
        elif error is None and self._failing:
            self._failing = False
            self.log.warning(
                "the record file takes lines again", record=self.path, lost=self._writer.lost_total
            )

    def _report(self, error: OSError) -> None:
        """Log a write error once, until the file takes lines again."""
        self._failing = True
        self.log.error(
            "cannot write the record; lines are dropped and counted until it takes them again",
            record=self.path,
            error=error.strerror or str(error),
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
        conductor's dialect and each envelope's hop metadata:
        ``shell.session.component_runtime``)."""
        self._put(event_line(now - self.start, name, **fields), now)

    def on_end(self, session: EndedSession, now: float) -> None:
        self._summary = session.summary()
        self._ended = now

    def finish(self, exit_info: dict[str, Any] | None = None, wait: float = EXIT_WAIT_S) -> None:
        """Write the trailer (``exit_info``: the agent's exit, when known) and close the file,
        waiting at most ``wait`` seconds for the lines still queued (then they are lost, and
        the log says how many lines the record misses in all)."""
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
        lost = self._writer.close(timeout=wait)
        error = self._writer.error
        if error is not None and not self._failing:
            # The file refused lines only after the last one was put (the writer thread runs
            # beside the session): the reason is still said, before what it cost.
            self._report(error)
        if lost:
            self.log.warning(
                "the record is missing lines the file did not take",
                record=self.path,
                lost=lost,
                reported_in_file="by its lost lines, except those of the last "
                f"{wait:g} s when the file took nothing more",
            )


def _rule_keys(config: Config) -> dict[str, list[str]] | None:
    """The entity `_meta` keys each rule writes, for the header (a viewer credits each key to
    its rule); the rules engine is imported only when there are rules (start-up time)."""
    if not config.rules:
        return None
    from acp_proxy.rules.engine import entity_keys_by_rule

    return entity_keys_by_rule(config.rules)


def open_recorder(
    config: Config,
    *,
    log: Any,
    agent: Sequence[str] | None = None,
    connect: str | None = None,
    conn: int | None = None,
    path: str | None = None,
    refused: list[str] | None = None,
) -> Recorder | None:
    """The recorder the config asks for (``None``: not recording, or the file cannot be opened,
    which is logged, and said in ``refused`` as ``--record PATH: WHY``)."""
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
        why = exc.strerror or str(exc)
        log.error("cannot open the record file", record=target, error=why)
        if refused is not None:
            refused.append(f"--record {target}: {why}")
        return None
    log.info("recording", record=target)
    return recorder


def exit_info(returncode: int) -> dict[str, Any]:
    """The trailer's ``exit`` object for an agent's raw return code."""
    from acp_proxy.shell.agent.process import describe_status, exit_code_of

    return {
        "code": exit_code_of(returncode),
        "signal": -returncode if returncode < 0 else None,
        "status": describe_status(returncode),
    }
