"""What the engines of a connection see of it: its negotiated state, and the small values the
engines pass each other.

Contract: ``ConnState`` is the typed state every engine reads (the version, whether the chain
runs, the inspect and watch flags, the message contexts, which links may act on a frame) and
the counters they add to; ``Connection`` (``pipeline``) makes it and is the only writer of the
version (``set_version``, when an ``initialize`` response fixes it). The request tables are
``tracking.Requests``, handed to the engines beside it. No engine holds the connection itself:
the import graph stays a tree (the protocol object above its engines, this module below them).
No I/O.
"""

from __future__ import annotations

from acp_proxy.base.values import value
from acp_proxy.wire.chain import Chain, Direction, MessageContext
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.interest import LinkInterest
from acp_proxy.wire.notes import Note, PipelineStats, Result

_A2C = Direction.AGENT_TO_CLIENT
_C2A = Direction.CLIENT_TO_AGENT


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


class ConnState:
    """The state of one connection that its engines read.

    Fixed for the connection's life: ``chain``, ``stats`` (the engines add to its counters),
    ``inspect_all`` (every frame parsed and described), ``observe`` / ``watching`` (the notes
    the shell wants), ``max_parse`` (the parse budget) and the links' interest (``links`` and
    the handles taken from it: ``interested``, ``route``, ``routed``, ``general``, ``watch``,
    ``fused``, ``fused_interest``, ``lane_blockers``). Changed once, by ``set_version``:
    ``version``, ``chain_on`` (links exist and the version is known), ``needles_on`` (the
    prefilter runs) and the four message contexts.
    """

    __slots__ = (
        "bctx_a2c",
        "bctx_c2a",
        "chain",
        "chain_on",
        "ctx_a2c",
        "ctx_c2a",
        "fused",
        "fused_interest",
        "general",
        "has_links",
        "inspect_all",
        "interested",
        "lane_blockers",
        "links",
        "max_parse",
        "needles_on",
        "observe",
        "route",
        "routed",
        "stats",
        "version",
        "watch",
        "watching",
    )

    def __init__(
        self, chain: Chain, *, inspect_all: bool, observe: bool, watching: bool, max_parse: int
    ) -> None:
        self.chain = chain
        self.stats = PipelineStats()
        self.inspect_all = inspect_all
        self.observe = observe
        self.watching = watching
        self.max_parse = max_parse
        self.has_links = len(chain) > 0
        # Which links may act on a frame (``wire.interest``), and its handles as attributes.
        links = LinkInterest(chain)
        self.links = links
        self.interested = links.of
        self.route = links.route
        self.routed = links.routed
        self.general = links.general
        self.watch = links.watch
        self.fused = None if watching else links.fused  # (it names no rule it ran)
        self.fused_interest = links.fused_interest
        self.lane_blockers = links.lane_blockers
        self.version: int | None = None
        self.set_version(None)

    def set_version(self, version: int | None) -> None:
        """The negotiated protocol version (``None``: not yet); the chain runs from then on."""
        self.version = version
        self.chain_on = self.has_links and version is not None
        self.needles_on = self.links.on = self.chain_on and self.links.any_needles
        observe = self.observe
        self.ctx_a2c = MessageContext(_A2C, version, False, observe)
        self.ctx_c2a = MessageContext(_C2A, version, False, observe)
        self.bctx_a2c = MessageContext(_A2C, version, True, observe)
        self.bctx_c2a = MessageContext(_C2A, version, True, observe)

    def count_out(self, direction: Direction, n: int) -> None:
        """``n`` frames forwarded ``direction``."""
        if direction is _A2C:
            self.stats.agent_to_client_out += n
        else:
            self.stats.client_to_agent_out += n

    def count_passed(self, direction: Direction, n: int) -> None:
        """``n`` frames read and forwarded untouched."""
        if direction is _A2C:
            self.stats.agent_to_client_in += n
            self.stats.agent_to_client_out += n
        else:
            self.stats.client_to_agent_in += n
            self.stats.client_to_agent_out += n
