"""Which links of a chain may act on a frame: their needles, the requests they are handed by
name, and whether the fused annotation path may run beside them.

Contract: ``LinkInterest`` is built once per connection from its chain and answers, for the
connection and its engines: per link, whether it may act on a raw frame (``of``: its needle
prefilter), which links a parsed request goes to by its method (``route``: ``Concerns``), the
request methods that must take the general path (``general``), and the fused path's terms
(``fused``, ``fused_interest``, ``lane_blockers``). Pure: no I/O, no state but the version
flag the connection sets (``on``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.wire.chain import Chain, Direction, FastAnnotator, needle_escapes
from acp_proxy.wire.raw.block_scan import contains, scan
from acp_proxy.wire.raw.prefilter import has_any

# Per link, whether it may act on a frame; ``None``: no link may (``connection.connstate.UNSET``:
# not yet computed).
Interest = tuple[bool, ...] | None


def _needles_of(middleware: object) -> tuple[bytes, ...] | None:
    needles = getattr(middleware, "needles", None)
    return None if needles is None else tuple(needles)


class LinkInterest:
    """The interest of one connection's links (see the module)."""

    __slots__ = (
        "all_needles",
        "any_needles",
        "escapes",
        "fused",
        "fused_interest",
        "general",
        "lane_blockers",
        "link_needles",
        "on",
        "read_v1",
        "read_v2",
        "readers",
        "reading",
        "routed",
        "routes",
        "watch",
    )

    def __init__(self, chain: Chain) -> None:
        self.on = False  # some link has needles and the version is known (``of`` answers)
        self.link_needles = tuple(_needles_of(link.middleware) for link in chain.links)
        self.escapes = needle_escapes(self.link_needles)  # same rule as Chain.interested
        # Some link has needles to look for (a link without any is handed requests by name).
        self.any_needles = any(n is None or n for n in self.link_needles)
        # Every link's needles and the escapes that could hide one, for one scan that answers
        # "no link" for most frames (``None``: a link wants every frame).
        self.all_needles: tuple[bytes, ...] | None = None
        if all(n is not None for n in self.link_needles):
            found = dict.fromkeys(x for n in self.link_needles if n for x in n)
            self.all_needles = (*found, *self.escapes)
        self.routes = chain.routes
        # Client requests whose response takes the general path: ``initialize`` (the version
        # negotiation) and those a link is told the response of (``Concerns.answers``).
        self.watch = frozenset({"initialize", *chain.answers})
        # Request methods some link is handed by name (``Concerns.requests``): parsed anyway,
        # such a request takes the general path, where ``route`` adds those links; so do the
        # watched ones.
        self.routed = frozenset(m for by_name in chain.routes.values() for m in by_name)
        self.general = self.routed | self.watch
        # One middleware that can answer v2 upserts without building a message (the rules
        # middleware's ``fused_v2``, when its rules allow it): the annotation hot path. The
        # other links, if any, declare their concerns (they never change a notification); a
        # frame one of them wants (``fused_interest`` differs) takes the chain instead, and so
        # does a lane line holding one of their needles (``lane_blockers``).
        self.fused: Callable[[JsonObject, Direction], Any] | None = None
        annotators = [
            (i, mw) for i, link in enumerate(chain.links)
            if isinstance(mw := link.middleware, FastAnnotator) and mw.fusable
        ]  # fmt: skip
        fusable = [i for i, _ in annotators]
        if len(fusable) == 1 and all(
            chain.concerned[i] for i in range(len(chain)) if i != fusable[0]
        ):
            self.fused = annotators[0][1].fused_v2
        self.fused_interest = tuple(bool(fusable) and i == fusable[0] for i in range(len(chain)))
        # Per link, whether it may see a notification without the chain around it: it only
        # reads notifications (``Concerns``), or it is the fused path's. ``reading``: some
        # link that only reads has needles (the read lane of a block is worth trying).
        self.readers = tuple(
            chain.concerned[i] or self.fused_interest[i] for i in range(len(chain))
        )
        self.reading = any(
            chain.concerned[i] and bool(self.link_needles[i]) for i in range(len(chain))
        )
        # The interests the read lane takes (v2: the fused path's link among them; else not),
        # each with the links that only read (``Rewriter.beside_fused`` runs those first).
        self.read_v2: dict[tuple[bool, ...], tuple[bool, ...]] = {}
        self.read_v1: dict[tuple[bool, ...], tuple[bool, ...]] = {}
        if self.reading and len(chain) <= 8:  # (2 ** links interests at most)
            for bits in range(1, 2 ** len(chain)):
                wanted = tuple(bool(bits >> i & 1) for i in range(len(chain)))
                if all(r or not w for w, r in zip(wanted, self.readers, strict=True)):
                    side = tuple(
                        w and not f for w, f in zip(wanted, self.fused_interest, strict=True)
                    )
                    self.read_v2[wanted] = side
                    if side == wanted:
                        self.read_v1[wanted] = side
        others = [n for i, n in enumerate(self.link_needles) if not self.fused_interest[i]]
        blockers = tuple(x for n in others if n for x in n)
        self.lane_blockers = (*blockers, *needle_escapes(others)) if blockers else ()

    def of(self, raw: bytes) -> Interest:
        """Per link, whether it may act on ``raw``; ``None`` when no link may.

        The same answer as ``Chain.interested`` (a link without needles always; otherwise one of
        its needles occurs, or the frame has a JSON escape that could hide one). Most frames hold
        none of them: one ``scan.scan`` of every link's needles and the escapes says so in one
        pass (the accelerator's SIMD search when built); otherwise each link's needles are
        looked for with ``scan.contains`` (``in`` on bytes costs an internal exception per
        call on CPython 3.11), the escape scan done once, only when needed.
        """
        if not self.on:
            return None
        needles = self.all_needles
        if needles is not None and not scan(raw, needles)[1]:
            return None  # no needle of any link, no escape (the usual frame): one C pass
        escaped: bool | None = None
        flags: list[bool] = []
        for needles in self.link_needles:
            if needles is None:
                flags.append(True)
                continue
            if not needles:  # a link handed only its requests by name (``route``)
                flags.append(False)
                continue
            hit = False
            for needle in needles:
                if contains(raw, needle):
                    hit = True
                    break
            if not hit:
                if escaped is None:
                    escaped = has_any(raw, self.escapes)
                hit = escaped
            flags.append(hit)
        return tuple(flags) if True in flags else None

    def route(self, direction: Direction, message: JsonObject, interested: Interest) -> Interest:
        """``interested`` plus the links that are handed the request ``message`` by name."""
        links = self.routes[direction].get(message.get("method"))  # type: ignore[arg-type]
        if links is None:
            return interested
        if interested is None:
            return links
        return tuple(a or b for a, b in zip(interested, links, strict=True))
