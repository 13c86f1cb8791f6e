"""The public middleware interface: the one stable import path for writing a middleware.

Contract: re-exports, and nothing else. Everything a middleware author needs is importable from
here: public names that users import get one stable import path. The modules behind it
(``acp_proxy.wire.chain``, ``acp_proxy.base.jsontypes``) may move between releases, this one
will not.

    from acp_proxy.middleware import FORWARD, BaseMiddleware, MessageContext, Replace, Verdict
"""

from __future__ import annotations

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.wire.chain import (
    FORWARD,
    BaseMiddleware,
    Concerns,
    Direction,
    Drop,
    Forward,
    MessageContext,
    Middleware,
    Replace,
    Reply,
    Ticking,
    Verdict,
)

__all__ = [
    "FORWARD",
    "BaseMiddleware",
    "Concerns",
    "Direction",
    "Drop",
    "Forward",
    "JsonObject",
    "JsonValue",
    "MessageContext",
    "Middleware",
    "Replace",
    "Reply",
    "Ticking",
    "Verdict",
]
