"""Batches (ACP digest §1.2): a JSON-RPC array frame, entry by entry, left as one array.

Contract: each entry of an array frame passes the chain with ``in_batch=True`` and the array
leaves as one array, entries in their order: a ``Replace``'s first message takes the entry's
place, its others follow as separate frames right after the array; a dropped entry is removed;
an array whose entries are all dropped is not sent. No batch is ever created: replies go back
as one array only when the sender sent an array (JSON-RPC batch reply semantics). An array
whose entries are unchanged leaves as its original bytes; in a changed array only the changed
entries are re-encoded (each spliced into its own bytes), and everything between the entries
(separators, whitespace, the unchanged entries) keeps the original bytes. Pure, no I/O; the
request tables are the connection's (``tables.Requests``), its state ``state.ConnState``.
"""

from __future__ import annotations

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.connstate import Acc, ConnState, NotParsedWhy
from acp_proxy.wire.connection.observe import frame_info
from acp_proxy.wire.connection.rewrite import Rewriter, reply_bytes
from acp_proxy.wire.connection.tables import Requests
from acp_proxy.wire.connection.tracking import RequestTracker
from acp_proxy.wire.connection.unparsed import ParseBudget
from acp_proxy.wire.notes import Note, Result
from acp_proxy.wire.raw import rawjson, rawscan

_A2C = Direction.AGENT_TO_CLIENT


class Batches:
    """The batch handling of one connection (``state``, ``requests``), with its rewrite
    engine."""

    __slots__ = ("_budget", "_requests", "_rw", "_state")

    def __init__(
        self, state: ConnState, requests: Requests, rewriter: Rewriter, budget: ParseBudget
    ) -> None:
        self._state = state
        self._requests = requests
        self._rw = rewriter
        self._budget = budget

    def handle(
        self,
        direction: Direction,
        raw: bytes,
        entries: list[JsonValue],
        interested: tuple[bool, ...] | None,
        notes: tuple[Note, ...],
    ) -> Result:
        """The array frame ``raw`` (the non-empty ``entries``) travelling ``direction``."""
        state = self._state
        requests = self._requests
        rewriter = self._rw
        acc = Acc()
        acc.notes.extend(notes)
        version = state.version
        stats = state.stats
        inspect_all = state.inspect_all
        full = would_overflow(requests.tracker, direction, entries)
        routed = state.routed and state.chain_on and routes_any(state, direction, entries)
        if interested is None and not full and not routed:
            for entry in entries:
                if isinstance(entry, dict):
                    requests.track(direction, entry, acc.notes, None)
                    if inspect_all:
                        acc.notes.append(
                            frame_info(direction, entry, len(raw), (), requests.answers)
                        )
            acc.forward.append(OutFrame(raw, None, version))
            state.count_out(direction, 1)
            return acc.result()
        if interested is None:
            interested = tuple(False for _ in state.chain.links)
        ctx = state.bctx_a2c if direction is _A2C else state.bctx_c2a
        try:
            # Where the array opens (after any whitespace), then one scan of its elements, which
            # also gives where it closes: the batch is walked once, not three times.
            opens = rawscan.value_start(raw)
            spans, closes = rawscan.array_elements(raw, opens)
        except rawjson.Unparseable:  # pragma: no cover - ``raw`` parsed as this array
            why = NotParsedWhy("batch could not be scanned")
            return self._budget.forward(direction, raw, why)
        # Per entry: its bytes in the array (None: dropped), then the frames that follow it.
        kept: list[bytes | None] = []
        fused = (
            state.fused is not None
            and version == 2
            and not inspect_all
            and interested == state.fused_interest
        )
        follow: list[OutFrame] = []
        replies: list[bytes] = []
        changed = False
        for entry, (es, ee) in zip(entries, spans, strict=True):
            if not isinstance(entry, dict):  # invalid entry: the receiver answers it (-32600)
                kept.append(raw[es:ee])
                continue
            entry_raw = raw[es:ee]
            if full and "id" in entry and "method" in entry:
                refused = requests.refuse_if_full(direction, entry_raw, entry)
                if refused is not None:
                    acc.notes.append(requests.full_note(direction, entry))
                    replies.append(refused.raw)
                    stats.errors_replied += 1
                    kept.append(None)
                    changed = True
                    continue
            if fused and "id" not in entry:
                # A v2 notification in a batch: the fused path, as for a frame on its own.
                data = rewriter.fused_bytes(direction, entry_raw, entry)
                if data is not None:
                    kept.append(data)
                    changed = changed or data is not entry_raw
                    continue
            wanted: tuple[bool, ...] | None = interested
            if routed and "id" in entry and "method" in entry:
                wanted = state.route(direction, entry, interested)
            outcome = rewriter.chain.run(entry, ctx, wanted)
            rewriter.report(entry, outcome, acc.notes, inspect_all)
            for r in outcome.replies:
                replies.append(reply_bytes(r, entry_raw if "id" in r else None, entry))
                stats.errors_replied += "error" in r
            if inspect_all or state.watching:  # (watching: who changed it)
                acc.notes.append(
                    frame_info(
                        direction,
                        entry,
                        len(raw),
                        outcome.changed_by,
                        requests.answers,
                        marks=outcome.marks,
                    )
                )
            encoded = (
                rewriter.encode_outcome(entry_raw, entry, outcome, acc.notes)
                if outcome.changed
                else None
            )
            if encoded is None:  # unchanged (or unencodable: fail open)
                kept.append(entry_raw)
                requests.track(direction, entry, acc.notes, entry_raw)
                continue
            changed = True
            if not outcome.messages:
                kept.append(None)
            for i, (out, data) in enumerate(zip(outcome.messages, encoded, strict=True)):
                requests.track(direction, out, acc.notes, None)
                if i == 0:
                    kept.append(data)  # takes the entry's place inside the array
                else:
                    follow.append(OutFrame(data, out, version))  # never batched
        if not changed:
            acc.forward.append(OutFrame(raw, None, version))
        elif any(k is not None for k in kept):
            joined = join_array(raw, (opens, closes + 1), spans, kept)
            acc.forward.append(OutFrame(joined, None, version))
        acc.forward.extend(follow)
        if replies:
            # JSON-RPC: the answers to a batch are one array (ACP digest §1.2).
            stats.replies += 1
            acc.reply.append(OutFrame(b"[" + b",".join(replies) + b"]", None, version))
        state.count_out(direction, len(acc.forward))
        return acc.result()


def routes_any(state: ConnState, direction: Direction, entries: list[JsonValue]) -> bool:
    """Whether a link is handed one of the requests among ``entries`` by name."""
    names = state.chain.routes[direction]
    return any(isinstance(e, dict) and "id" in e and e.get("method") in names for e in entries)


def would_overflow(tracker: RequestTracker, direction: Direction, entries: list[JsonValue]) -> bool:
    """Whether the requests of a batch may not all fit in their table."""
    room = tracker.room(direction)
    requests = 0
    for entry in entries:
        if isinstance(entry, dict) and "id" in entry and "method" in entry:
            requests += 1
    return requests > room


def join_array(
    raw: bytes,
    span: tuple[int, int],
    spans: list[tuple[int, int]],
    kept: list[bytes | None],
) -> bytes:
    """The batch ``raw`` (the array at ``raw[span[0]:span[1]]``, its entries at ``spans``) with
    entry ``i`` replaced by ``kept[i]`` (removed when ``None``); the separators and whitespace
    between surviving neighbours are the original bytes."""
    start, end = span
    out = [raw[start : spans[0][0]]]
    prev = -1
    for i, piece in enumerate(kept):
        if piece is None:
            continue
        if prev >= 0:
            out.append(raw[spans[prev][1] : spans[i][0]] if prev == i - 1 else b",")
        out.append(piece)
        prev = i
    out.append(raw[spans[-1][1] : end])
    return b"".join(out)
