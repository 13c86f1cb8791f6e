"""The line path: one frame read on its own, from its bytes to its ``Result``.

Contract: what happens to one event (a line, an oversize frame): an agent line that cannot be a
frame is diverted (``divert``); a line that no middleware may act on and that the request tables
do not need passes as it came, unparsed (``prefilter.passes_unparsed``, the one test every path
asks); anything else is parsed within the parse budget (``unparsed``) and goes to the batch
engine (an array), the rewrite engine (a message some link may act on) or straight on, tracked
(``tables.Requests``). Observing, every frame's result carries its description (``observe``).
The engine reads the connection's ``state.ConnState`` and its request tables, never the
connection itself; the block path (``blocks``) calls it for the lines it picks. Pure, no I/O.
"""

from __future__ import annotations

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.batches import Batches
from acp_proxy.wire.connection.connstate import UNSET, ConnState, NotParsedWhy, Unset
from acp_proxy.wire.connection.divert import Diversion
from acp_proxy.wire.connection.observe import frame_info, observed, watched
from acp_proxy.wire.connection.oversize import oversize
from acp_proxy.wire.connection.rewrite import Rewriter
from acp_proxy.wire.connection.tables import Requests
from acp_proxy.wire.connection.unparsed import ParseBudget
from acp_proxy.wire.core_settings import NonJsonPolicy
from acp_proxy.wire.framing import Line, Oversize
from acp_proxy.wire.notes import EMPTY, Note, Result
from acp_proxy.wire.raw import rawjson
from acp_proxy.wire.raw.prefilter import FRAME_STARTS, passes_unparsed

_A2C = Direction.AGENT_TO_CLIENT
_C2A = Direction.CLIENT_TO_AGENT


class Lines:
    """The line path of one connection (``state``, ``requests``), with the engines it calls."""

    __slots__ = ("_batches", "_budget", "_diversion", "_requests", "_rw", "_state")

    def __init__(
        self,
        state: ConnState,
        requests: Requests,
        rewriter: Rewriter,
        budget: ParseBudget,
        non_json: NonJsonPolicy,
    ) -> None:
        self._state = state
        self._requests = requests
        self._rw = rewriter
        self._budget = budget
        self._batches = Batches(state, requests, rewriter, budget)
        self._diversion = Diversion(state, budget, non_json, self.parsed)

    def event(self, direction: Direction, event: Line | Oversize) -> Result:
        """One event read from the side ``direction`` starts at (observing: described)."""
        state = self._state
        if state.observe:
            return self._observed(direction, event)
        if type(event) is Line:
            if direction is _A2C:
                return self.agent(event.raw, UNSET)
            return self.client(event.raw, UNSET)
        assert isinstance(event, Oversize)
        return oversize(state, self._requests, direction, event)

    def _observed(self, direction: Direction, event: Line | Oversize) -> Result:
        """``event`` plus an ``Observed`` note describing the frame and its fate."""
        self._requests.answers.clear()
        if type(event) is Line:
            raw = event.raw
            res = self.agent(raw, UNSET) if direction is _A2C else self.client(raw, UNSET)
        else:
            assert isinstance(event, Oversize)
            raw = event.head
            res = oversize(self._state, self._requests, direction, event)
        return (watched if self._state.watching else observed)(direction, event, raw, res)

    def agent(self, raw: bytes, interested: tuple[bool, ...] | Unset | None = UNSET) -> Result:
        """A line from the agent (``interested``: the prefilter's answer, when known)."""
        state = self._state
        state.stats.agent_to_client_in += 1
        if not raw:
            return EMPTY
        if raw[:2] not in FRAME_STARTS and not rawjson.could_be_frame(raw):
            return self._diversion.odd_line(raw)
        if isinstance(interested, Unset):
            interested = state.interested(raw) if state.needles_on else None
        if interested is None and not state.inspect_all and passes_unparsed(True, raw):
            state.stats.agent_to_client_out += 1
            return Result((OutFrame(raw, None, state.version),))
        parsed = self._budget.parse(raw)
        if type(parsed) is NotParsedWhy:
            return self._budget.forward(_A2C, raw, parsed)
        return self.parsed(_A2C, raw, parsed, interested, ())

    def client(self, raw: bytes, interested: tuple[bool, ...] | Unset | None = UNSET) -> Result:
        """A line from the client: never diverted (the agent answers a malformed one)."""
        state = self._state
        state.stats.client_to_agent_in += 1
        if isinstance(interested, Unset):
            interested = state.interested(raw) if state.needles_on else None
        if interested is None and not state.inspect_all and passes_unparsed(False, raw):
            state.stats.client_to_agent_out += 1
            return Result((OutFrame(raw, None, state.version),))
        parsed = self._budget.parse(raw)
        if type(parsed) is NotParsedWhy:
            # Malformed or unreadable: forwarded as is, the agent answers it (-32700).
            return self._budget.forward(_C2A, raw, parsed)
        return self.parsed(_C2A, raw, parsed, interested, ())

    def parsed(
        self,
        direction: Direction,
        raw: bytes,
        parsed: object,
        interested: tuple[bool, ...] | None,
        notes: tuple[Note, ...],
    ) -> Result:
        """A frame that was parsed."""
        if isinstance(parsed, dict):
            return self._single(direction, raw, parsed, interested, notes)
        if isinstance(parsed, list) and parsed:
            return self._batches.handle(direction, raw, parsed, interested, notes)
        # A scalar, or an empty array: forwarded, the peer answers it (JSON-RPC -32600).
        state = self._state
        state.count_out(direction, 1)
        return Result((OutFrame(raw, None, state.version),), (), notes)

    def _single(
        self,
        direction: Direction,
        raw: bytes,
        message: JsonObject,
        interested: tuple[bool, ...] | None,
        notes: tuple[Note, ...],
    ) -> Result:
        state = self._state
        requests = self._requests
        version = state.version  # (the frame that negotiates it is not of the new version)
        if "id" in message and "method" in message:
            refused = requests.refuse_if_full(direction, raw, message)
            if refused is not None:
                return Result((), (refused,), (*notes, requests.full_note(direction, message)))
            if state.routed and state.chain_on:
                interested = state.route(direction, message, interested)
        if interested is None:  # parsed only for tracking / inspection
            inspect_all = state.inspect_all
            if "id" in message or inspect_all:
                acc_notes = list(notes)
                requests.track(direction, message, acc_notes, raw)
                if inspect_all:
                    info = frame_info(direction, message, len(raw), (), requests.answers)
                    acc_notes.append(info)
                notes = tuple(acc_notes)
            state.count_out(direction, 1)
            return Result((OutFrame(raw, message, version),), (), notes)
        return self._rw.single(direction, raw, message, interested, notes)
