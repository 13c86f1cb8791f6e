"""The ``record:`` settings as a value (issue 11), apart from the record format.

Contract: holds ``RecordConfig``, its size default and how a record file is opened, nothing
else, so that ``Config`` can name its ``record`` section (and the command line check a record
file) without importing the format and redaction code (start-up, issue 13).
Their public home stays ``acp_proxy.record.format``.
"""

from __future__ import annotations

import os
from dataclasses import Field
from typing import Any, ClassVar, Final

from acp_proxy.values import value

DEFAULT_MAX_BYTES: Final = 256 * 1024 * 1024
# How a record file is opened (the recorder, and the command line's check before an early
# start): appended to, created private to the user (records hold prompts and file contents).
RECORD_OPEN_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
RECORD_FILE_MODE: Final = 0o600


@value
class RecordConfig:
    """The ``record:`` settings (``--record`` overrides ``path``)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    path: str | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    # Added to the defaults (the defaults always apply).
    redact: tuple[str, ...] = ()
    redact_patterns: tuple[str, ...] = ()
