"""Opening a record file or the log file safely: no link followed, private, never someone
else's file.

Contract: owns the ``open`` of a record path and of the log file (the flags, mode and rules are
``acp_proxy.record.settings``'s): a new file is created ``0600``; an existing one takes the record
(or the log) only if it is a regular file or a FIFO owned by the user with no group or other
access, seen without following a link, and checked again on the descriptor opened (a file
swapped in between is refused too). Refusals are ``RecordRefused`` with the reason. A record's
FIFO is opened without waiting: with no reader yet, the writer opens it once one comes
(``open_fifo``); the log's waits for its reader, as it always did. Imports only the settings
(the command line checks a record before an early start, and opens the log before the loop).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from acp_proxy.record.settings import (
    LOG_OPEN_FLAGS,
    RECORD_FIFO_FLAGS,
    RECORD_FILE_MODE,
    RECORD_OPEN_FLAGS,
    refusal,
)


class RecordRefused(OSError):
    """A record path that may not take a record (``strerror``: why)."""


def _check(path: str, st: os.stat_result, what: str = "record") -> None:
    why = refusal(st.st_mode, st.st_uid, os.geteuid(), what)
    if why is not None:
        raise RecordRefused(errno.EPERM, why, path)


def _opened(path: str, fd: int, fifo: bool, what: str = "record") -> int:
    """``fd`` once its file passes the rules (closed and refused if not)."""
    try:
        st = os.fstat(fd)
        _check(path, st, what)
        if stat.S_ISFIFO(st.st_mode) != fifo:
            raise RecordRefused(errno.EPERM, "it was replaced while being opened", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_record_file(path: str) -> tuple[int | None, bool]:
    """``(descriptor, is_fifo)`` for ``path``; the descriptor is ``None`` for a FIFO that has
    no reader yet. ``RecordRefused`` or another ``OSError`` when it cannot take the record."""
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        _check(path, st)
        if stat.S_ISFIFO(st.st_mode):
            return open_fifo(path), True
    try:
        fd = os.open(path, RECORD_OPEN_FLAGS, RECORD_FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW: a link appeared at the path
            raise RecordRefused(
                errno.ELOOP,
                "it is a symbolic link (a record is never written through a link)",
                path,
            ) from None
        if exc.errno == errno.ENXIO:  # a FIFO with no reader appeared at the path
            return None, True
        raise
    fifo = stat.S_ISFIFO(os.fstat(fd).st_mode)
    return _opened(path, fd, fifo), fifo


def open_log_file(path: str) -> int:
    """A descriptor appending to the log file at ``path``, by the record's rules (a FIFO waits
    for its reader). ``RecordRefused`` or another ``OSError`` when it may not take the log."""
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        _check(path, st, "log")
    try:
        fd = os.open(path, LOG_OPEN_FLAGS, RECORD_FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW: a link appeared at the path
            raise RecordRefused(
                errno.ELOOP, "it is a symbolic link (a log is never written through a link)", path
            ) from None
        raise
    return _opened(path, fd, stat.S_ISFIFO(os.fstat(fd).st_mode), "log")


def open_fifo(path: str) -> int | None:
    """The FIFO at ``path`` opened for writing, without waiting; ``None``: no reader yet."""
    try:
        fd = os.open(path, RECORD_FIFO_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return None
        if exc.errno == errno.ELOOP:
            raise RecordRefused(
                errno.ELOOP,
                "it is a symbolic link (a record is never written through a link)",
                path,
            ) from None
        raise
    return _opened(path, fd, True)


def can_record(path: str) -> bool:
    """Whether a record could be opened at ``path`` now (a regular file, or a new one, created
    as the recorder creates it). A FIFO is left to the recorder alone: opening and closing it
    here would give its reader EOF before the record."""
    with contextlib.suppress(OSError):
        if stat.S_ISFIFO(os.lstat(path).st_mode):
            return False
    try:
        fd, fifo = open_record_file(path)
    except OSError:
        return False
    if fd is not None:
        os.close(fd)
    return not fifo
