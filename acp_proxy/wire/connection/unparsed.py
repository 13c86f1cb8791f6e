"""The parse budget and the frames it, or a parse error, leaves unparsed.

Contract: owns whether a frame is parsed (``parse``: within the parse budget, ``prefilter.
parse_cost``, and valid JSON) and what a frame that was not becomes (``forward``): it is never
dropped but forwarded as it came, with a ``NotParsed`` note (``first`` once per connection), and
the request tables are kept right from what its head says: a response answers its request; a
request over the parse budget is tracked (its receiver can read it; one that is not JSON cannot
be answered with its id, so it is not). Pure, no I/O.
"""

from __future__ import annotations

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.connstate import ConnState, NotParsedWhy
from acp_proxy.wire.connection.tables import Requests
from acp_proxy.wire.connection.tracking import is_id
from acp_proxy.wire.framing import HEAD_BYTES, read_response_id, scan_head
from acp_proxy.wire.notes import NotParsed, Result
from acp_proxy.wire.raw import rawjson
from acp_proxy.wire.raw.prefilter import parse_cost


class ParseBudget:
    """The parse budget of one connection (``state``, ``requests``) and its unparsed frames."""

    __slots__ = ("_requests", "_seen", "_state", "max_parse")

    def __init__(self, state: ConnState, requests: Requests, max_parse: int) -> None:
        self._state = state
        self._requests = requests
        self.max_parse = max_parse
        self._seen = False  # a frame was left unparsed already (only the first note says so)

    def parse(self, raw: bytes) -> JsonValue | NotParsedWhy:
        """The frame's value, exactly (``rawjson.loads``), or why it was not parsed."""
        budget = self.max_parse
        if parse_cost(raw, budget) > budget:
            return NotParsedWhy(f"over the parse budget of {budget} bytes", budget=True)
        try:
            return rawjson.loads(raw)
        except rawjson.Unparseable as exc:
            return NotParsedWhy(f"not parseable JSON: {exc}")

    def forward(self, direction: Direction, raw: bytes, why: NotParsedWhy) -> Result:
        """Forward a frame that could not be parsed as it came, its request tracked."""
        state = self._state
        requests = self._requests
        state.stats.not_parsed += 1
        note = NotParsed(direction, len(raw), why.reason, not self._seen)
        self._seen = True
        head = raw[:HEAD_BYTES]
        if raw.find(b'"id"') >= 0:
            info = scan_head(head)
            if "method" in info.keys:
                if why.budget and info.has_id and is_id(info.id):
                    method = info.method if info.method is not None else "?"
                    refused = requests.admit(direction, info.id, method, info.id_bytes)
                    if refused is not None:
                        full = requests.full_note(direction, method)
                        return Result((), (refused,), (note, full))
            else:
                is_response, rid = read_response_id(head)
                if is_response:
                    requests.answered(direction, rid)
        state.count_out(direction, 1)
        return Result((OutFrame(raw, None, state.version),), (), (note,))
