"""The outbound queue toward one side: bounded, ordered, and coalescing under backpressure.

Contract: owns what waits to be written to a peer and in which order, when waiting
``session/update`` notifications are combined so that the client ends in exactly the state the
unmerged stream would have produced, and how much it holds in memory. Pure: no I/O, no clock
(``now`` is passed in, in seconds, from a monotonic clock), never mutates the caller's JSON; a
frame that was not merged leaves as the exact bytes that came in (style.md habit 4). How two
updates combine is ``coalesce_merge`` (``coalesce_bytes`` without a parse); what a line is
(kind, entity), ``coalesce_keys`` (``coalesce_shape`` without a parse); how a line joins the
waiting entries, ``coalesce_run``.

How it works:

* The shell pushes frames while ``has_room()`` and takes everything ready whenever the peer can
  accept a write. Pushing costs no parse: a frame (the shell joins runs of untouched lines into
  one) waits as it came. A consumer that keeps up therefore sees every frame unmerged and
  undelayed, at the cost of a plain FIFO.
* Merging happens only among frames that are *still waiting*: while the writer waits for a slow
  peer to read down its kernel buffer (``look``: as many lines as fit in that wait), when a
  writer that cannot see its peer's pace takes them, or when the queue reaches its bound. Then
  the frames pushed since the last merge pass (or the first of them) are split into lines,
  each line is looked at once (its kind and entity), and a mergeable one is merged into the
  **last** waiting entry of the same entity in the **tail run** (the run after the last
  barrier), found through a per-entity index. Nothing is compared against the rest of the
  queue, nothing moves across a barrier, and per entity updates keep their order (digest 3.3:
  clients apply updates "in the order they are received for each" id).
* The kinds that dominate real streams merge without a parse (the bytes path, with the C
  accelerator): one scan of a line validates it and gives its shape (kind, session, entity id,
  which members its update has, the text of a bare text chunk), and text chunks, v2 upserts
  without two ``_meta`` patches, and snapshots merge from their lines' bytes, byte for byte as
  the parse would have merged them. Anything else (or a pair the bytes path cannot judge) is
  parsed and classified, and merged by parsing.
* It pays for itself or it stops: a merge pass in which fewer than one line in eight merged
  makes the queue skip merging for the next lines (as many as the pass looked at, doubling while
  nothing merges), so a stream that does not merge costs a FIFO again; and while the writer makes
  no progress (a paused client; filling its kernel buffer is no progress) the proxy reads at
  most ``PAUSE_INPUT_FACTOR`` times the bound before ``has_room`` says no, however well the
  frames merge (even while merging keeps the queue below its bound): a paused client does not
  make the proxy burn CPU merging an endless stream.
* Without the accelerator, a text chunk whose bytes repeat a waiting group's last line around
  another text (same message, same envelope) merges without a parse (``Group.text_of``): a
  streamed reply costs a few byte comparisons and the decoding of its text per chunk.
* The byte bound counts what the queue holds in memory: the frames' bytes, a fixed overhead per
  waiting line and index entry, and the parsed objects a merged group keeps (an upper estimate).

* Rate limit (``min_interval_ms`` > 0, off by default): every frame is classified when pushed.
  An entry of the tail run whose entity was written less than ``min_interval`` ago is *held*;
  later updates of that entity merge into it, and ``take`` returns a deadline. Only the tail run
  can be held: pushing a barrier releases every held entry before it at the next ``take``, so
  requests and responses are never delayed by the rate limit and nothing crosses a barrier.
  Cost: an entity's latest state may reach the client up to ``min_interval_ms`` late, and other
  entities' updates may overtake a held one within its run (per-entity order is kept). What is
  due and what is held is ``coalesce_rate``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.base.values import value
from acp_proxy.wire.coalesce.fresh import Frame, Fresh
from acp_proxy.wire.coalesce.keys import table_of
from acp_proxy.wire.coalesce.merge import Group, encode_ahead
from acp_proxy.wire.coalesce.pace import Pace
from acp_proxy.wire.coalesce.rate import RateLimit
from acp_proxy.wire.coalesce.run import Entry, TailRun
from acp_proxy.wire.coalesce.shape import BYTES_PATH, KIND_TABLES, split_lines
from acp_proxy.wire.coalesce.take import (
    FRAME_OVERHEAD,
    Coalesced,
    QueueStats,
    frames_of,
    take_some,
    waiting,
)
from acp_proxy.wire.core_settings import CoalesceConfig

_NEEDLE = b'"session/update"'
# One entry of the per-entity index: the dict slot, the key tuple and its strings, the position.
INDEX_OVERHEAD = 400
# A merge pass that merged fewer than one line in this many makes the next lines skip merging.
_YIELD = 8
_MIN_PASS = 64  # a pass over fewer lines says nothing about the stream
_MAX_SKIP = 1 << 16
# While the writer takes nothing (or only fills a paused peer's buffer), at most this many times
# the bound is read: about what the queue holds with merging off once that buffer is filled.
PAUSE_INPUT_FACTOR = 2
_HOT = 4  # text groups tried before a line is parsed
_ROOM_PASS = 256  # lines merged at most when the bound is reached (a few ms; looks do the rest)
# What a merge pass costs the proxy per line it looks at (parse, classify, index, merge), as the
# queue reckons it: about three times what a pass measured on the bench's notify stream, a
# margin for slower machines (docs/performance.md, "Figures behind the code"). A pass pays when
# the lines it merges away would have taken the consumer longer to read than the pass takes.
MERGE_COST_S = 15e-6
# What encoding a merged group for the write costs, as the queue reckons it (splice the merged
# members into its last line with the parse the merge kept, or join a text chunk's texts into
# its bytes; with a margin over what the bench's notify stream measured, as above): a look with
# nothing to merge encodes about its wait's worth ahead of the write.
ENCODE_COST_S = 30e-6


@value
class OutFrame:
    """One frame to write: its bytes *without* the trailing newline."""

    raw: bytes
    # The decoded message when the pipeline already parsed it (a single message, not a batch).
    # The queue does not keep it (its bound counts bytes it holds): a line is parsed again only
    # if it has to wait and may merge.
    message: JsonObject | None = None
    # The protocol version negotiated when the frame was produced.
    version: int | None = None
    # How many lines ``raw`` holds, when its producer knows (a run of lines the shell joined:
    # its scan counted them); 0: the queue counts them (a frame of one message has no newline).
    # Counting the newlines of every byte again cost as much as the scan that found them.
    lines: int = field(default=0, compare=False)


class OutboundQueue:
    """A bounded queue of frames toward one peer that coalesces waiting ``session/update``s."""

    __slots__ = (
        "_base",
        "_bytes",
        "_config",
        "_count",
        "_done",
        "_fresh",
        "_groups",
        "_in_bytes",
        "_in_lines",
        "_interval",
        "_merge",
        "_now",
        "_pace",
        "_prepared",
        "_pushed_bytes",
        "_rate",
        "_ratio",
        "_run",
        "_skip",
        "_skip_until",
        "_version",
        "on_coalesced",
        "peer_waits",
        "rate_limited",
        "stats",
    )

    def __init__(self, config: CoalesceConfig, *, coalesce: bool) -> None:
        self._config = config
        self._merge = coalesce and config.enabled
        self._interval = config.min_interval_ms / 1000.0 if self._merge else 0.0
        # ``min_interval_ms`` applies: every frame must pass through ``push``.
        self.rate_limited = self._interval != 0.0
        # Looked at by a merge pass (or skipped it), in order; the tail run is indexed.
        self._done: list[Entry] = []
        self._base = 0  # the position of ``_done[0]`` since the queue was last empty
        self._prepared = 0  # the position up to which groups were encoded ahead (``look``)
        self._fresh = Fresh()  # pushed since the last pass
        self._run = TailRun(self._interval)  # the tail run's index: what merges into what
        self._version: int | None = None  # the version the index was built for
        self._groups = 0  # entries of ``_done`` that are groups
        self._rate = RateLimit(self._interval)  # used only when ``_interval`` is set
        self._bytes = 0  # held in memory (without the index, counted by its length)
        self._count = 0  # frames it will write
        self._in_lines = self._in_bytes = 0  # read since the writer last took something
        self._skip = 0  # merging does not pay: the next pass waits this many lines
        self._skip_until = 0  # ... until ``stats.pushed`` reaches this
        self._ratio = 1.0  # the share of lines the last pass merged away
        self._pace = Pace()  # how fast the consumer reads
        self._pushed_bytes = 0
        self._now = 0.0  # the latest time pushed or taken at
        # Set by the writer: whether its last write had to wait for the peer (the kernel did
        # not take it all at once). While the peer takes everything at once, it is waiting for
        # the proxy, and merging could only slow it down.
        self.peer_waits = True
        self.stats = QueueStats()
        # Told what each merged group became when it is written (the live view); None: nobody.
        self.on_coalesced: Callable[[Coalesced], None] | None = None

    def __len__(self) -> int:
        """Frames waiting (a merged group counts as the frames it will write)."""
        return self._count

    @property
    def pending_bytes(self) -> int:
        """What the waiting frames hold in memory: their bytes, the parsed objects kept for
        merging (an upper estimate) and the fixed overhead per frame, line and index entry."""
        return self._bytes + INDEX_OVERHEAD * len(self._run.index)

    @property
    def paused_input(self) -> tuple[int, int]:
        """(lines, bytes) read since the writer last made progress."""
        return self._in_lines, self._in_bytes

    def room_now(self) -> bool:
        """``has_room`` without its merge pass: no side effect (for a look from outside)."""
        config = self._config
        return not self._capped() and (
            self._count < config.max_queue_messages and self.pending_bytes < config.max_queue_bytes
        )

    def _capped(self) -> bool:
        config = self._config
        return self._merge and (
            self._in_lines >= PAUSE_INPUT_FACTOR * config.max_queue_messages
            or self._in_bytes >= PAUSE_INPUT_FACTOR * config.max_queue_bytes
        )

    def has_room(self) -> bool:
        """True while below both bounds (else the shell stops reading the producer). At the
        bound, what was pushed since the last pass is merged first (when merging pays). While
        the writer takes nothing, at most ``PAUSE_INPUT_FACTOR`` times the bound is read, however
        well it merges, until a take that is not a paused peer's fill, the queue empty or not
        (the writer wakes the reader after every take for that reason)."""
        if self.room_now():
            return True
        if self._capped() or not self._fresh or not self._merge or not self._pays(self._now):
            return False
        self._pass(_ROOM_PASS)  # bounded: the reader's task holds the event loop meanwhile
        return self.room_now()

    # -- push -----------------------------------------------------------------------------

    def push(self, frame: OutFrame, now: float) -> None:
        """Append ``frame`` (merged, if at all, when it has to wait).

        The caller has checked ``has_room`` (or must push regardless, e.g. a reply it owes).
        """
        raw = frame.raw
        lines = frame.lines or (raw.count(b"\n") + 1 if b"\n" in raw else 1)
        size = len(raw) + 1
        self._now = now
        self._pushed_bytes += size
        self.stats.pushed += lines
        self._count += lines
        self._in_lines += lines
        self._in_bytes += size
        if not self._merge:
            self._done.append(waiting(raw, lines))
            self._bytes += size + FRAME_OVERHEAD
            return
        self._bytes += self._fresh.add(raw, frame.version, lines, self.stats.pushed - lines)
        if self._interval:
            self._pass()  # the rate limit needs every entry's entity at once

    # -- when merging pays ----------------------------------------------------------------

    def consumed(self, nbytes: int, span: float) -> None:
        """The writer saw the peer read ``nbytes`` in the last ``span`` seconds (from what the
        kernel says is still unread): its pace, in lines of the size of the lines pushed."""
        per_line = self._pushed_bytes / self.stats.pushed if self.stats.pushed else 1.0
        self._pace.consumed(nbytes / per_line, span)

    def merging(self, now: float) -> bool:
        """Whether the waiting frames are being merged and it pays: the last pass merged at
        least one line in ``_YIELD`` and the next would run. The writer then keeps the peer's
        kernel buffer short, so that the backlog stays here, where it still merges."""
        return (
            self._merge
            and self._interval == 0.0
            and self._ratio * _YIELD >= 1.0
            and self.stats.pushed >= self._skip_until
            and self.peer_waits
            and self._ratio >= MERGE_COST_S * self._pace.lines_per_s(now)
        )

    def _pays(self, now: float) -> bool:
        """Whether the waiting frames should be looked at: past the lines that skip merging,
        and the consumer slow enough that what the last pass merged away (its share) saves it
        more time than a pass costs the proxy (``MERGE_COST_S`` a line). A consumer so fast
        that even merging everything would not pay is never made to wait for a pass."""
        if self._interval != 0.0:
            return True
        if self._fresh.first < self._skip_until or not self.peer_waits:
            return False
        return self._ratio >= MERGE_COST_S * self._pace.lines_per_s(now)

    # -- merge pass -----------------------------------------------------------------------

    def look(self, now: float, seconds: float) -> bool:
        """While the writer waits for a slow peer to read down its kernel buffer: merge the
        frames pushed since the last pass for about ``seconds`` (``MERGE_COST_S`` a line), time
        the peer needs anyway. What is left waits, still fresh, for the next look. False: there
        was nothing left to merge or to encode ahead."""
        self._now = now
        if self._interval != 0.0:
            return False
        if self._fresh and self._pays(now):
            self._pass(max(_MIN_PASS, int(seconds / MERGE_COST_S)))
            return True
        # Nothing fresh (a paused peer, a full queue): encode merged groups ahead of the write,
        # from the head, so that a peer that resumes gets a plain queue's pace.
        start = max(0, self._prepared - self._base)
        budget = max(_MIN_PASS // 4, int(seconds / ENCODE_COST_S))
        end, charge = encode_ahead(self._done, start, budget) if self._groups else (start, 0)
        self._bytes += charge
        self._prepared = self._base + end
        return end > start

    def _pass(self, max_lines: int | None = None) -> None:
        """Look at the frames pushed since the last pass (the first of them, about
        ``max_lines`` lines): merge what merges into the tail run."""
        if not self._pays(self._now):
            fresh = self._first_of(None)
            self._as_barriers(fresh)
            return
        fresh = self._first_of(max_lines)
        self.stats.passes += 1
        merged_before = self.stats.merged
        looked = 0
        run = self._run
        run.begin(self._done, self._base)
        for raw, version, n in fresh:
            if version != self._version:
                run.forget()  # a new index for each version
                self._version = version
            table = table_of(version)
            if table is None:
                # Nothing merges before the version is known.
                self._done.append(waiting(raw, n))
                self._bytes += len(raw) + 1 + FRAME_OVERHEAD
                continue
            lines = split_lines(raw) if n > 1 else (raw,)
            looked += n
            run.add_lines(lines, table, KIND_TABLES.get(version) if BYTES_PATH else None)
        self._bytes += run.bytes
        self._count += run.count
        self._groups += run.groups
        self.stats.merged += run.merged
        if looked < _MIN_PASS:
            return
        merged = self.stats.merged - merged_before
        self._ratio = merged / looked
        if merged * _YIELD < looked:
            # Merging did not pay on these lines: skip it for as many (doubling), so a stream
            # that does not merge costs a FIFO again. (A consumer that keeps up is looked at
            # before every pass: ``_pays``.)
            self._skip = min(max(looked, 2 * self._skip), _MAX_SKIP)
            self._skip_until = self._fresh.first + self._skip
        else:
            self._skip = 0

    def _first_of(self, max_lines: int | None, max_bytes: int | None = None) -> list[Frame]:
        """The first fresh frames (``Fresh.cut``), no longer fresh: their charge leaves
        ``_bytes`` (the caller adds what they become)."""
        frames, held = self._fresh.cut(max_lines, max_bytes)
        self._bytes -= held
        return frames

    def _as_barriers(self, fresh: list[Frame], skipped: bool = True) -> None:
        """Frames that skip merging (or are taken unparsed: not ``skipped``): waiting as they
        came, closing the tail run (nothing may merge across a line that was not looked at)."""
        self._run.index.clear()
        done = self._done
        for raw, _version, lines in fresh:
            done.append(waiting(raw, lines))
            self._bytes += len(raw) + 1 + FRAME_OVERHEAD
            if skipped:
                self.stats.skipped += lines

    # -- take -----------------------------------------------------------------------------

    def take(
        self, now: float, limit: int | None = None, *, look: bool = True, paused: bool = False
    ) -> tuple[list[bytes], float | None]:
        """What is ready to write now (at most about ``limit`` bytes: whole lines, at least
        one), and when to call again.

        The frames come as one or more byte strings, each a run of whole lines ending in
        ``\\n``. The deadline (same clock as ``now``) is set when frames are held back by the
        rate limit; ``None`` means "call again when something is pushed". What is not taken
        stays in the queue, where later updates of its entities still merge into it: a writer
        that takes only what its peer can accept now keeps the backlog mergeable.

        With ``look`` (a writer that cannot see its peer's pace) the frames pushed since the
        last pass are merged first, when it pays; without (the writer merges with ``look()``
        while it waits for the peer), what was merged goes first, then fresh frames as they
        came, unparsed.
        """
        if not paused:  # (``paused``: this take fills a paused peer's buffer, no progress)
            self._in_lines = self._in_bytes = 0
        self._now = now
        if self._interval != 0.0:
            written = self.stats.written
            limited = self._take_limited(now)
            self._pace.taken(self.stats.written - written, now)
            return limited
        if self._fresh:
            if look and (self._done or len(self._fresh) > 1):
                self._pass()  # (when it pays; else the frames wait as they came, unparsed)
            elif not self._done or limit is None or self._bytes <= limit:
                # Unparsed, as they came (one frame alone waited behind nothing): about the
                # piece taken, the rest stays fresh and mergeable.
                self._as_barriers(self._first_of(None, None if self._done else limit), False)
        done = self._done
        if not done:
            return [], None
        if limit is not None and self._bytes > limit:
            return [self._take_some(limit, now)], None
        parts = frames_of(done, self._written)[0]
        parts.append(b"")  # the last line's newline, in the same copy
        out = [b"\n".join(parts)]
        self._pace.taken(self._count, now)
        self._done = []
        self._base = self._prepared = 0
        self._run.forget()
        self._groups = 0
        self.stats.written += self._count
        self._bytes = self._count = 0
        return out, None

    def _take_some(self, limit: int, now: float) -> bytes:
        """The first entries, about ``limit`` bytes of them (whole lines, at least one); the
        rest waits, its index entries still valid."""
        taken = take_some(self._done, limit, self._written)
        self._bytes -= taken.freed
        self._groups -= taken.groups
        self._base += taken.entries
        if not self._done:
            self._base = self._prepared = 0
            self._run.index.clear()
        self._run.hot = []
        self._count -= taken.lines
        self.stats.written += taken.lines
        self._pace.taken(taken.lines, now)
        return taken.data

    def _written(self, group: Group) -> list[bytes]:
        frames = group.frames()
        if len(frames) > 1:
            self.stats.split += len(frames) - 1
        if group.merged and self.on_coalesced is not None:
            size = sum(len(frame) + 1 for frame in frames)
            merge = Coalesced(group.spec.kind, group.key, group.merged + 1, len(frames), size)
            self.on_coalesced(merge)
        return frames

    def _take_limited(self, now: float) -> tuple[list[bytes], float | None]:
        due, held, deadline = self._rate.split(self._done, now)
        parts, written = frames_of(due, self._written)
        self._done = list(held)
        self._run.forget()
        self._run.index.update((entry.key, (i, entry.spec)) for i, entry in enumerate(held))
        self._base = self._prepared = 0
        self._groups = len(held)
        self._count = sum(entry.lines for entry in held)
        self._bytes = sum(entry.charge for entry in held)
        self.stats.written += written
        if not parts:
            return [], deadline
        parts.append(b"")  # the last line's newline, in the same copy
        return [b"\n".join(parts)], deadline
