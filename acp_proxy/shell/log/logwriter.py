"""The log's writer: log lines reach stderr (or a FIFO) without ever blocking the session.

Contract: owns the writes of rendered log lines to one file descriptor that may stop draining
(an editor that never reads the proxy's stderr, a paused FIFO reader). A line is written at once
when the descriptor can take it without blocking and nothing is queued before it; else it is
queued for a writer thread, within ``MAX_LOG_BACKLOG`` bytes; beyond that lines are dropped and
counted, and a ``log lines dropped`` line says how many once the descriptor drains. It never
renders events (``logsetup`` does) and never blocks its caller; at exit it waits at most
``LOG_EXIT_WAIT_S`` for the backlog.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import stat
import threading
from collections import deque
from collections.abc import Callable

# Log lines held while the descriptor does not drain, in bytes; lines beyond are dropped.
MAX_LOG_BACKLOG = 1024 * 1024
# At exit, the longest wait for the backlog to be written.
LOG_EXIT_WAIT_S = 1.0
# A write of at most this many bytes to a pipe that polls writable never blocks (POSIX PIPE_BUF).
_ATOMIC = getattr(select, "PIPE_BUF", 512)
DROPPED_EVENT = "log lines dropped (stderr was not read)"


def needs_writer(fd: int) -> bool:
    """Whether writes to ``fd`` can block for long: anything but a regular file."""
    try:
        return not stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


class LogWriter:
    """A file-like ``write``/``flush`` for structlog's loggers over descriptor ``fd``.

    ``dropped_line(n)`` renders the line that reports ``n`` dropped lines, in the log's format.
    """

    def __init__(
        self,
        fd: int,
        dropped_line: Callable[[int], bytes],
        max_backlog: int = MAX_LOG_BACKLOG,
    ) -> None:
        self._fd = fd
        self._dropped_line = dropped_line
        self.max_backlog = max_backlog
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._writing = False  # the thread is writing a line taken off the queue
        self.dropped = 0  # lines dropped since the last report
        self.dropped_total = 0
        self._thread: threading.Thread | None = None
        self._poll = select.poll()
        self._poll.register(fd, select.POLLOUT)

    def write(self, data: str | bytes) -> None:
        raw = data.encode("utf-8", "replace") if isinstance(data, str) else data
        with self._lock:
            if not self._queue and not self._writing and not self.dropped and self._can_write(raw):
                with contextlib.suppress(OSError):
                    os.write(self._fd, raw)
                return
            if self._queued + len(raw) > self.max_backlog:
                self.dropped += 1
                self.dropped_total += 1
                return
            self._queue.append(raw)
            self._queued += len(raw)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="acp-proxy-log", daemon=True)
                self._thread.start()
                atexit.register(self.close)
            self._ready.notify()

    def flush(self) -> None:
        """Nothing to do: lines are written (or queued) whole by ``write``."""

    def _can_write(self, raw: bytes) -> bool:
        if len(raw) > _ATOMIC:
            return False
        try:
            return any(event & select.POLLOUT for _, event in self._poll.poll(0))
        except OSError:
            return False

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self.dropped:
                    self._ready.wait()
                if self._queue:
                    raw = self._queue.popleft()
                    self._queued -= len(raw)
                else:
                    raw, self.dropped = self._dropped_line(self.dropped), 0
                self._writing = True
            try:
                _write_all(self._fd, raw)
            except OSError:
                pass
            finally:
                with self._lock:
                    self._writing = False
                    self._ready.notify_all()

    def close(self, wait_s: float = LOG_EXIT_WAIT_S) -> bool:
        """Wait at most ``wait_s`` for the backlog (and the dropped count) to be written;
        whether it was."""
        with self._lock:
            return self._ready.wait_for(
                lambda: not self._queue and not self._writing and not self.dropped, wait_s
            )


def _write_all(fd: int, raw: bytes) -> None:
    view = memoryview(raw)
    while view:
        view = view[os.write(fd, view) :]
