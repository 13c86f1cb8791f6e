"""The ``record:`` settings as a value, apart from the record format.

Contract: holds ``RecordConfig``, its size default and how a record file is opened (its flags,
mode, and which existing files may take a record), nothing else, so that ``Config`` can name its
``record`` section (and the command line check a record file) without importing the format and
redaction code (start-up). Their public home stays ``acp_proxy.record.format``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import Field
from typing import Any, ClassVar, Final

from acp_proxy.base.values import value

DEFAULT_MAX_BYTES: Final = 256 * 1024 * 1024
# How a record file is opened (the recorder, and the command line's check before an early
# start): appended to, created private to the user (records hold prompts and file contents),
# never through a symbolic link (a link planted at the path would send the session elsewhere),
# never waiting (a FIFO without a reader yet, see ``acp_proxy.shell.record.recordfile``).
RECORD_OPEN_FLAGS: Final = (
    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
)
# A FIFO (a reader collects the record as it is written): never created, never followed.
RECORD_FIFO_FLAGS: Final = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
RECORD_FILE_MODE: Final = 0o600
# The log file (``--log-file``): as a record, except that a FIFO is waited for (the log has
# always been opened that way: its reader comes first).
LOG_OPEN_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW


def refusal(mode: int, owner: int, user: int, what: str = "record") -> str | None:
    """Why an existing record target (its ``st_mode`` and owner, seen without following a
    link) may not take a record for ``user``; ``None``: it may. Only a regular file or a FIFO
    owned by the user with no group or other access: a record holds the session's prompts and
    file contents, and appending to someone else's file, or one others can read, leaks them.
    The log file takes the same rules (``what="log"``): it can hold frame contents too."""
    if stat.S_ISLNK(mode):
        return f"it is a symbolic link (a {what} is never written through a link)"
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        return "it is not a regular file or a FIFO"
    if owner != user:
        return f"it is owned by another user (uid {owner})"
    if mode & 0o077:
        return (
            f"others may access it (mode {stat.S_IMODE(mode):04o}); a {what} must be private: "
            "chmod 600 it, or choose a new path"
        )
    return None


@value
class RecordConfig:
    """The ``record:`` settings (``--record`` overrides ``path``)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    path: str | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    # Added to the defaults (the defaults always apply).
    redact: tuple[str, ...] = ()
    redact_patterns: tuple[str, ...] = ()
