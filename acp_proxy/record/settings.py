"""The ``record:`` settings as a value (issue 11), apart from the record format.

Contract: holds ``RecordConfig`` and its size default, nothing else, so that ``Config`` can name
its ``record`` section without importing the format and redaction code (start-up, issue 13).
Their public home stays ``acp_proxy.record.format``.
"""

from __future__ import annotations

from dataclasses import Field
from typing import Any, ClassVar, Final

from acp_proxy.values import value

DEFAULT_MAX_BYTES: Final = 256 * 1024 * 1024


@value
class RecordConfig:
    """The ``record:`` settings (``--record`` overrides ``path``)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    path: str | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    # Added to the defaults (the defaults always apply).
    redact: tuple[str, ...] = ()
    redact_patterns: tuple[str, ...] = ()
