"""User middleware loaded by import path in tests/config/test_config.py (``custom_middleware:Tag``).

Not a test module: these classes stand for what a user writes in their own package.
"""

from __future__ import annotations

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.middleware import (
    FORWARD,
    BaseMiddleware,
    MessageContext,
    Replace,
    Ticking,
    Verdict,
)

NOT_CALLABLE = 42


class Tag(BaseMiddleware):
    """Sets one key of the message-level ``params._meta`` of every ``session/update``."""

    needles = (b'"session/update"',)

    def __init__(self, key: str = "example.dev/tag", value: str = "x") -> None:
        self.key = key
        self.value = value
        self.calls = 0  # per-instance (per-connection) state

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        self.calls += 1
        params = message.get("params")
        if message.get("method") != "session/update" or not isinstance(params, dict):
            return FORWARD
        meta = params.get("_meta")
        new_meta = dict(meta) if isinstance(meta, dict) else {}
        new_meta[self.key] = self.value
        return Replace(({**message, "params": {**params, "_meta": new_meta}},))


class Boom(BaseMiddleware):
    """Raises on every message (to test fail-open / fail-closed)."""

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        raise RuntimeError("boom")


class Picky(BaseMiddleware):
    """Rejects a bad option in its constructor."""

    def __init__(self, level: str = "info") -> None:
        if level not in ("info", "debug"):
            raise ValueError(f"level must be info or debug, not {level!r}")
        self.level = level


class Options(BaseMiddleware):
    """Keeps the options it was given (to check that each instance gets its own copy)."""

    def __init__(self, items: list[int], nested: dict[str, list[int]]) -> None:
        self.items = items
        self.nested = nested


class NotMiddleware:
    """Callable to construct, but its instances are not middleware (no ``name``, no call)."""

    def __init__(self) -> None:
        self.x = 1


def broken_import() -> None:
    """A function, not a class: calling it returns None, which is not a middleware."""


class Marker(BaseMiddleware):
    """Creates the file ``path`` when instantiated: shows whether a command built one."""

    def __init__(self, path: str) -> None:
        with open(path, "a", encoding="utf-8") as f:
            f.write("built\n")


class Duck:
    """A middleware without BaseMiddleware: a declared ``name`` and a ``__call__``."""

    name: str

    def __init__(self) -> None:
        self.name = "duck"

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        return FORWARD


class NoName:
    """Has a ``__call__`` but declares no ``name``."""

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        return FORWARD


class Callable:
    """Its instances are callable; the instance below is not a class."""

    def __call__(self) -> None:
        return None


CALLABLE_OBJECT = Callable()


class SelfNamed:
    """Names itself from its options in ``__init__`` (the class only declares ``name``)."""

    name: str

    def __init__(self, label: str) -> None:
        self.name = f"self-{label}"

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        return FORWARD


class FixedName(BaseMiddleware):
    """A class-level ``name``: known without building an instance."""

    name = "fixed"


class Ticker(BaseMiddleware, Ticking):
    """Keeps time: its first tick tells the client ``x/tick``, its second raises (a bug in a
    user's middleware), its third tells the client ``x/tick`` again."""

    def __init__(self) -> None:
        self.ticks = 0

    def on_tick(self) -> tuple[tuple[JsonObject, ...], tuple[JsonObject, ...]]:
        self.ticks += 1
        if self.ticks == 2:
            raise RuntimeError("tick bug")
        if self.ticks > 3:
            return (), ()
        return (), ({"jsonrpc": "2.0", "method": "x/tick", "params": {"n": self.ticks}},)
