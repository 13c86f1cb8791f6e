"""The seam between a connection and the engines it calls (rewrite, batches, blocks, diversion,
oversize): what of the connection they may use, and the small values they pass each other.

Contract: types only, no behaviour, no I/O. ``acp_proxy.wire.connection.pipeline.Connection``
satisfies
``Host``; the engines import this module, never ``pipeline`` (the import graph stays a tree:
the protocol object above its engines).
"""

from __future__ import annotations

from typing import Protocol

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.base.values import value
from acp_proxy.wire.chain import Chain, Direction, MessageContext
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.tracking import RequestTracker
from acp_proxy.wire.framing import Line, Oversize
from acp_proxy.wire.interest import Interest, LinkInterest
from acp_proxy.wire.notes import Note, PipelineStats, Result


class Unset:
    """The prefilter was not run yet (``interested`` unknown)."""


UNSET = Unset()


@value
class NotParsedWhy:
    """Why a frame was not parsed."""

    reason: str
    budget: bool = False  # over the parse budget (valid JSON, as far as anyone knows)


class Acc:
    """Accumulates the pieces of one ``Result``."""

    __slots__ = ("forward", "notes", "reply")

    def __init__(self) -> None:
        self.forward: list[OutFrame] = []
        self.reply: list[OutFrame] = []
        self.notes: list[Note] = []

    def result(self) -> Result:
        return Result(tuple(self.forward), tuple(self.reply), tuple(self.notes))

    def extend(self, result: Result) -> None:
        self.forward.extend(result.forward)
        self.reply.extend(result.reply)
        self.notes.extend(result.notes)


class Host(Protocol):
    """What the engines read and call on the connection that owns them: its negotiated state,
    its counters, and its request tables (tracking stays with the protocol object)."""

    chain: Chain
    stats: PipelineStats
    version: int | None
    _chain_on: bool
    _has_links: bool
    _inspect_all: bool
    _watching: bool
    _fused: object
    _fused_interest: tuple[bool, ...]
    _lane_blockers: tuple[bytes, ...]
    _link_interest: LinkInterest
    _routed: frozenset[str]
    _answers: dict[JsonValue, str]
    _tracker: RequestTracker
    _ctx_a2c: MessageContext
    _ctx_c2a: MessageContext
    _bctx_a2c: MessageContext
    _bctx_c2a: MessageContext

    def handle(self, direction: Direction, event: Line | Oversize) -> Result: ...

    def _agent_line(self, raw: bytes, interested: Interest | Unset = ...) -> Result: ...

    def _client_line(self, raw: bytes, interested: Interest | Unset = ...) -> Result: ...

    def _interested(self, raw: bytes) -> Interest: ...

    def _parsed(
        self,
        direction: Direction,
        raw: bytes,
        parsed: object,
        interested: Interest,
        notes: tuple[Note, ...],
    ) -> Result: ...

    def _count_out(self, direction: Direction, n: int) -> None: ...

    def _count_passed(self, direction: Direction, n: int) -> None: ...

    def _track(
        self, direction: Direction, message: JsonObject, notes: list[Note], raw: bytes | None
    ) -> None: ...

    def _admit(
        self, direction: Direction, rid: JsonValue, method: str, id_bytes: bytes
    ) -> OutFrame | None: ...

    def _answered(self, direction: Direction, rid: JsonValue) -> tuple[str, bytes] | None: ...

    def _route(
        self, direction: Direction, message: JsonObject, interested: Interest
    ) -> Interest: ...

    def _refuse_if_full(
        self, direction: Direction, raw: bytes, message: JsonObject
    ) -> OutFrame | None: ...

    def _full_note(self, direction: Direction, message: JsonObject | str) -> Note: ...
