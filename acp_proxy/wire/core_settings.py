"""The settings the protocol core reads: its bounds' defaults, the non-JSON policy, coalescing.

Contract: values only. They live in the core so that the core never imports the configuration
package: ``acp_proxy.config`` builds them from the file (and re-exports them), the core reads
them. No parsing, no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import Field
from typing import Any, ClassVar

from acp_proxy.base.values import value

# The longest frame (one line) the proxy takes; past it the frame is cut (docs/bounds.md).
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
# Bounded memory (docs/bounds.md): a frame is parsed only when its estimated parsed
# size is at most this; requests awaiting an answer are at most this many per direction.
DEFAULT_MAX_PARSE_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_PENDING_REQUESTS = 10_000


class NonJsonPolicy(enum.StrEnum):
    """What to do with agent stdout lines that are not JSON."""

    LOG = "log"  # divert to the log with a warning (once per kind, then counted)
    FORWARD = "forward"  # forward them to the client as they are


@value
class CoalesceConfig:
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too
    enabled: bool = True
    max_queue_messages: int = 4096
    max_queue_bytes: int = 16 * 1024 * 1024
    min_interval_ms: int = 0
