"""Deprecated import path, kept for one release: use ``acp_proxy.middleware``.

Contract: re-exports the public middleware interface from its old place (``acp_proxy.chain``
before the layout of issue 14); the implementation lives in ``acp_proxy.wire.chain``.
"""

from __future__ import annotations

from acp_proxy.middleware import (
    FORWARD,
    BaseMiddleware,
    Direction,
    Drop,
    Forward,
    MessageContext,
    Middleware,
    Replace,
    Reply,
    Verdict,
)

__all__ = [
    "FORWARD",
    "BaseMiddleware",
    "Direction",
    "Drop",
    "Forward",
    "MessageContext",
    "Middleware",
    "Replace",
    "Reply",
    "Verdict",
]
