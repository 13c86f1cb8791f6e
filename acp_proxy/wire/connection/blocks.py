"""Many frames read together: ``Connection.handle_many`` and the blocks of ``feed_blocks``.

Contract: the same output and stats as handling the frames one by one (``Connection.handle``),
at a fraction of the cost: frames that pass untouched and unparsed are collected into runs
without a ``Result`` each; in a block (several complete lines read together), one scan finds the
lines something may need (a needle of an interested link, an ``"id"`` for the request tables, an
escape that could hide either, anything that does not start like ``{"``), which take the
per-line path, and the runs between them are forwarded as they arrived, unsplit and unparsed.
On a v2 connection with one fusable middleware (beside links that declared their concerns), a
notification in a block that no other link may want goes through the fused lane
(``Rewriter.lane``). Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.connstate import UNSET, Acc, ConnState, Unset
from acp_proxy.wire.connection.lines import Lines
from acp_proxy.wire.connection.observe import described, passes
from acp_proxy.wire.connection.rewrite import Rewriter
from acp_proxy.wire.framing import Block, Line, Oversize
from acp_proxy.wire.notes import Note, Passed, Result
from acp_proxy.wire.raw import block_scan
from acp_proxy.wire.raw.block_scan import contains
from acp_proxy.wire.raw.prefilter import ESCAPES, ID_KEY, passes_unparsed

_A2C = Direction.AGENT_TO_CLIENT
_C2A = Direction.CLIENT_TO_AGENT


class _Passing:
    """The frames of a read that passed as they came and are not reported yet (watching):
    reported as one ``Passed`` when a frame that did not pass, or the read's end, comes."""

    __slots__ = ("count", "parts")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.count = 0

    def add(self, part: bytes, n: int) -> None:
        self.parts.append(part)
        self.count += n

    def report(self, direction: Direction, notes: list[Note]) -> None:
        if self.parts:
            notes.append(Passed(direction, tuple(self.parts), self.count))
            self.parts = []
            self.count = 0


class Blocks:
    """The many-frames path of one connection (``state``), over its line path (``lines``)."""

    __slots__ = ("_lines", "_needles_by_state", "_rw", "_state")

    def __init__(self, state: ConnState, lines: Lines, rewriter: Rewriter) -> None:
        self._state = state
        self._lines = lines
        self._rw = rewriter
        # ``_block_needles`` by (direction, chain on): at most four entries.
        self._needles_by_state: dict[tuple[Direction, bool], tuple[bytes, ...] | None] = {}

    def many(
        self,
        direction: Direction,
        events: Iterable[Line | Oversize | Block],
        join: bool,
        passing: _Passing | None = None,
    ) -> Result:
        """``Connection.handle_many``: each event in order, the results concatenated.

        Frames that pass untouched and unparsed (the hot path) are collected without a
        ``Result`` each; with ``join``, each run of them becomes ONE ``OutFrame`` (the frames
        joined with ``b"\\n"``, ``message=None``). The outbound queue splits such a frame into
        its lines when it has to wait (its merge pass), so coalescing still sees every
        line.

        Watching, the frames that pass as they came are reported together (``passing``: those
        of the read this is part of, not reported yet)."""
        forward: list[OutFrame] = []
        reply: list[OutFrame] = []
        notes: list[Note] = []
        run: list[bytes] = []  # consecutive untouched, unparsed frames
        a2c = direction is _A2C
        state = self._state
        fast = not state.inspect_all
        own = passing is None and state.watching
        if own:
            passing = _Passing()
        for item in events:
            event = item
            if type(event) is Block:
                if event.raw.find(b"\n") < 0:
                    # One line (interactive traffic: a request, its response): the per-line
                    # path below without the block's scan and nested call (the round
                    # trip). ``feed_blocks`` never makes a blank block, so nothing is dropped.
                    event = Line(event.raw)
                else:
                    if run:
                        self._flush_run(direction, run, forward, join, passing)
                        run = []
                    acc = Acc()
                    acc.forward, acc.reply, acc.notes = forward, reply, notes
                    self.block(direction, event, acc, join=join, passing=passing)
                    continue
            interested: tuple[bool, ...] | Unset | None = UNSET
            if fast and type(event) is Line:
                raw = event.raw
                interested = state.interested(raw) if state.chain_on else None
                if interested is None and passes_unparsed(a2c, raw):
                    run.append(raw)
                    continue
            if run:
                self._flush_run(direction, run, forward, join, passing)
                run = []
            assert not isinstance(event, Block)
            if not isinstance(interested, Unset) and type(event) is Line:
                # The prefilter's answer is known: do not compute it twice (hot path).
                if a2c:
                    res = self._lines.agent(event.raw, interested)
                else:
                    res = self._lines.client(event.raw, interested)
                if passing is not None:  # watching (``handle`` reports for itself)
                    raw = event.raw
                    sent = res.forward
                    # ``observe.passes`` and ``passing.add`` inlined (a call each per frame
                    # was most of what watching a stream of small frames cost).
                    if not res.notes and not res.reply and len(sent) == 1 and sent[0].raw == raw:
                        forward.append(sent[0])
                        passing.parts.append(raw)
                        passing.count += 1
                        continue
                    res = described(direction, event, raw, res)
            else:
                res = self._lines.event(direction, event)
            if passing is not None:
                passing.report(direction, notes)
            forward.extend(res.forward)
            if res.reply:
                reply.extend(res.reply)
            if res.notes:
                notes.extend(res.notes)
        if run:
            self._flush_run(direction, run, forward, join, passing)
        if own:
            assert passing is not None
            passing.report(direction, notes)
        return Result(tuple(forward), tuple(reply), tuple(notes))

    def _flush_run(
        self,
        direction: Direction,
        run: list[bytes],
        forward: list[OutFrame],
        join: bool,
        passing: _Passing | None,
    ) -> None:
        n = len(run)
        self._state.count_passed(direction, n)
        version = self._state.version
        if join:
            joined = b"\n".join(run) if n > 1 else run[0]
            forward.append(OutFrame(joined, None, version, n))
            if passing is not None:
                passing.add(joined, n)
        else:
            forward.extend([OutFrame(raw, None, version) for raw in run])
            if passing is not None:
                passing.parts.extend(run)
                passing.count += n

    def block(
        self,
        direction: Direction,
        block: Block,
        acc: Acc,
        *,
        join: bool,
        passing: _Passing | None = None,
    ) -> None:
        """The lines of ``block``, results added to ``acc``.

        Only the lines that something may need go through the per-line path: those holding a
        needle of an interested link, an ``"id"`` (requests and responses, for the tracker; the
        initialize response), or, when links have needles, a ``\\u`` / ``\\/`` escape that could
        hide one. The runs of lines between them are forwarded as they arrived, without being
        split or parsed, after one check that each starts like a JSON frame (non-JSON agent
        output must still be diverted).
        """
        state = self._state
        raw = block.raw
        # Until the version is known the chain is off, and the initialize response inside this
        # block may turn it on halfway: take such blocks line by line (once per connection).
        waiting = state.has_links and not state.chain_on
        needles = None if state.inspect_all or waiting else self._block_needles(direction)
        if needles is None:
            acc.extend(self.many(direction, block.lines(), join, passing))
            return
        # One pass (``acp_proxy.wire.raw.block_scan``, C when built): the lines that hold a needle
        # or do
        # not start like ``{"`` (a batch, a blank line, whitespace before a frame, non-JSON
        # output: the per-line path diverts what cannot be a frame). The runs of ``{"`` lines
        # between them are forwarded whole (a stream of updates with the odd batch in it).
        lines, specials = block_scan.scan(raw, needles)
        # The fused lane: a v2 notification that the one fusable middleware answers goes
        # straight from here to ``Rewriter.fused_bytes``, skipping the per-line path's steps
        # that cannot change its outcome there (see ``Rewriter.lane``).
        lane = state.fused is not None and state.version == 2 and state.chain_on
        # A line another link may want is not the lane's (``Connection._lane_blockers``).
        blockers = state.lane_blockers
        # The read lane: a notification only links that read it (the policy) want.
        reading = state.links.reading and state.chain_on
        if specials and self._pass_as_is(direction, raw, specials, lane):
            # Every line the scan picked passes untouched too (a batch of notifications in a
            # stream of them): the block is one run, forwarded without cutting runs out of it
            # (each cut copied its bytes).
            specials = []
        index = 0  # the line index of ``pos``
        pos = 0
        special: list[Line | Oversize] = []  # consecutive lines for the per-line path
        for line_index, start, stop in specials:
            if line_index > index:
                if special:  # one call per group (a block of updates that all need a look)
                    acc.extend(self.many(direction, special, join, passing))
                    special = []
                part = raw[pos : start - 1]
                self._plain_run(
                    direction, part, line_index - index, acc, join=join, passing=passing
                )
            index = line_index + 1
            pos = stop + 1
            line = raw[start:stop]
            if (
                lane
                and line[:2] == b'{"'
                and not contains(line, ID_KEY)
                and not (blockers and any(contains(line, b) for b in blockers))
            ):
                out = self._rw.lane(direction, line, state.max_parse)
                if out is not None:
                    if special:
                        acc.extend(self.many(direction, special, join, passing))
                        special = []
                    acc.forward.append(out)  # (never watching: no fused path then)
                    continue
            if reading and line[:2] == b'{"' and not contains(line, ID_KEY):
                # The lines before it first: a reader keeps state (the policy's tool calls, a
                # permission request that asked about one), so it sees them in order.
                if special:
                    acc.extend(self.many(direction, special, join, passing))
                    special = []
                read = self._rw.read_lane(direction, line, state.max_parse)
                if read is not None:
                    if passing is not None:  # watching: reported as the per-line path does
                        event = Line(line)
                        if passes(event, line, read):
                            acc.forward.extend(read.forward)
                            passing.add(line, 1)
                            continue
                        passing.report(direction, acc.notes)
                        read = described(direction, event, line, read)
                    acc.extend(read)
                    continue
            if line and not line.isspace():  # blank lines are dropped, as ``Block.lines`` does
                special.append(Line(line))
        if special:
            acc.extend(self.many(direction, special, join, passing))
        if lines > index:
            self._plain_run(direction, raw[pos:], lines - index, acc, join=join, passing=passing)

    def _block_needles(self, direction: Direction) -> tuple[bytes, ...] | None:
        """What makes a line of a block need the per-line path; None: every line does. Built
        once per direction and state of the chain (it turns on once, with the version)."""
        key = (direction, self._state.chain_on)
        cached = self._needles_by_state.get(key, UNSET)
        if not isinstance(cached, Unset):
            return cached
        made = self._make_block_needles(direction)
        self._needles_by_state[key] = made
        return made

    def _make_block_needles(self, direction: Direction) -> tuple[bytes, ...] | None:
        needles: list[bytes] = [b'"id"']  # requests and responses, for the tracker
        if direction is _C2A:
            needles.extend(ESCAPES)  # ``client_needs_parse`` parses escaped client frames too
        if self._state.chain_on:
            for link_needles in self._state.links.link_needles:
                if link_needles is None:
                    return None
                needles.extend(link_needles)
            needles.extend(self._state.links.escapes)
        return tuple(needles)

    def _pass_as_is(
        self,
        direction: Direction,
        raw: bytes,
        specials: list[tuple[int, int, int]],
        lane: bool,
    ) -> bool:
        """Whether each of the ``specials`` lines of ``raw`` passes untouched and unparsed: what
        ``many`` decides for a line (no link interested, a frame start, no ``"id"``, for a
        client's line no escape either), and no blank line (dropped) nor a fused-lane line."""
        state = self._state
        if state.inspect_all:
            return False
        a2c = direction is _A2C
        chain_on = state.chain_on
        for _, start, stop in specials:
            line = raw[start:stop]
            if not line or line.isspace():
                return False
            if lane and line[:2] == b'{"' and not contains(line, ID_KEY):
                return False
            if chain_on and state.interested(line) is not None:
                return False
            if not passes_unparsed(a2c, line):
                return False
        return True

    def _plain_run(
        self,
        direction: Direction,
        run: bytes,
        n: int,
        acc: Acc,
        *,
        join: bool,
        passing: _Passing | None,
    ) -> None:
        """``n`` lines that start like ``{"`` and that no middleware and no tracker needs."""
        state = self._state
        if join:
            state.count_passed(direction, n)
            acc.forward.append(OutFrame(run, None, state.version, n))
            if passing is not None:
                passing.add(run, n)
        else:
            lines = run.split(b"\n") if n > 1 else [run]
            self._flush_run(direction, lines, acc.forward, False, passing)
