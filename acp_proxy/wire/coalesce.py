"""The outbound queue toward one side: bounded, ordered, and coalescing under backpressure.

Contract: owns what waits to be written to a peer and in which order, and how waiting
``session/update`` notifications are combined so that the client ends in exactly the state the
unmerged stream would have produced (issue 4). Pure: no I/O, no clock (``now`` is passed in, in
seconds, from a monotonic clock), never mutates the caller's JSON; a frame that was not merged
leaves as the exact bytes that came in (style.md habit 4).

How it works:

* The shell pushes frames while ``has_room()`` and takes everything ready whenever the peer can
  accept a write. A consumer that keeps up therefore sees every frame unmerged and undelayed:
  merging only happens among frames that are *still waiting* (backpressure).
* A frame holding several lines (the shell joins runs of untouched lines) is split into its
  lines only when it has to wait behind something (lines stay byte-exact either way).
* The queue is a sequence of entries. An entry is either a **barrier** (a request, a response, any
  notification other than a mergeable ``session/update``, a batch, a frame that is not JSON, a
  ``session/update`` of a kind that is never merged, or any frame of an unknown protocol version)
  or a **member** of a *run* of consecutive mergeable ``session/update`` notifications.
* A new member is merged only into the **last** waiting entry of the same entity in the **tail**
  run (the run after the last barrier), so nothing ever moves across a barrier and, per entity,
  updates keep their order (digest §3.3: clients apply updates "in the order they are received for
  each" id). Entities of different kinds that share an id (a tool call and its content chunks, a
  message and its chunks, a terminal and its output chunks) are one entity.
* Merge rules (only when the two notifications are equal apart from ``params.update``: same
  ``sessionId``, same or absent ``params._meta``, which is notification data, not a patch; RFD
  "Does this change `params._meta`": no):

  - upserts: ``updates.merge_updates``, which may return a clear followed by an object (RFD:
    "Intermediaries that combine updates MUST keep removals and clears. Replacing a clear followed
    by an object with just that object is wrong"); the extra frame is counted in ``stats.split``;
  - chunks: concatenated only where the client cannot tell the difference (plain text blocks
    without ``_meta`` or annotations, equal apart from the text; terminal output bytes decoded,
    joined and re-encoded);
  - whole snapshots (``plan_update`` per plan, ``state_update``, ``usage_update``,
    ``available_commands_update``, ``config_option_update``, v1 ``plan`` and
    ``current_mode_update``): the later replaces the earlier in place, keeping its exact bytes;
  - everything else is never merged.

* Rate limit (``min_interval_ms`` > 0, off by default): an entry of the tail run whose entity was
  written less than ``min_interval`` ago is *held*; later updates of that entity merge into it,
  and ``take`` returns a deadline. Only the tail run can be held: pushing a barrier releases every
  held entry before it at the next ``take``, so requests and responses are never delayed by the
  rate limit and nothing crosses a barrier. Cost: an entity's latest state may reach the client
  up to ``min_interval_ms`` late, and other entities' updates may overtake a held one within its
  run (the same freedom merging already uses; per-entity order is kept).
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections import deque

import orjson

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.base.values import value
from acp_proxy.config import CoalesceConfig
from acp_proxy.meta.registry import (
    CHUNK_KINDS,
    SESSION_UPDATE,
    SNAPSHOT_KINDS,
    SUPPORTED_VERSIONS,
    UPSERT_KINDS,
    ChunkKind,
    MetaRule,
    entity_key,
    upsert_entity_key,
)
from acp_proxy.meta.updates import merge_updates
from acp_proxy.wire import rawjson, rawscan, rawsplice

_NEEDLE = b'"session/update"'
# An estimate of a re-encoded entry's size may drift up to this factor (plus slack) from its last
# exact size before the entry is re-encoded to measure it: amortized O(input bytes) encoding.
_SLACK_BYTES = 512


@value
class OutFrame:
    """One frame to write: its bytes *without* the trailing newline."""

    raw: bytes
    # The decoded message when the pipeline already parsed it (a single message, not a batch),
    # so the queue does not parse twice. ``None``: not parsed (or a batch / non-JSON line).
    message: JsonObject | None = None
    # The protocol version negotiated when the frame was produced.
    version: int | None = None


@value(frozen=False)
class QueueStats:
    # Counted in messages (lines): the shell may push a run of untouched lines as one frame.
    pushed: int = 0  # messages pushed
    written: int = 0  # messages handed out by take()
    merged: int = 0  # frames absorbed into a pending frame
    split: int = 0  # extra frames created by clear-then-object splits (counted when written)


class _Class(enum.Enum):
    """How a waiting entry may combine with a later one of the same entity."""

    UNCLASSIFIED = "unclassified"  # pushed into an empty queue; classified only if needed
    BARRIER = "barrier"
    UPSERT = "upsert"  # merge_updates
    TEXT_CHUNK = "text_chunk"  # plain text blocks concatenate
    B64_CHUNK = "b64_chunk"  # terminal output bytes concatenate
    SNAPSHOT = "snapshot"  # the later replaces the earlier
    OPAQUE = "opaque"  # a run member with a known entity that never merges


def _chunk_class(chunk: ChunkKind) -> _Class:
    if chunk.value_field == "data":
        return _Class.B64_CHUNK  # terminal_output_chunk: bytes appended to a byte stream
    if chunk.entity == "tool_call":
        # A tool_call_content_chunk appends one ToolCallContent *item*: two items are not one.
        return _Class.OPAQUE
    return _Class.TEXT_CHUNK  # one ContentBlock appended to a message / summary


# v1 message chunks may omit messageId, and a change of kind or messageId starts a new message,
# so every v1 message chunk of a session belongs to one stream entity: nothing reorders among them.
_V1_STREAM = "v1_message_stream"
_V1_STREAM_KINDS = frozenset({"user_message_chunk", "agent_message_chunk", "agent_thought_chunk"})

# The queue's entity key: the version, then the registry's entity key.
EntityKey = tuple[object, ...]


@value
class _Info:
    """A classified mergeable ``session/update``."""

    cls: _Class
    key: EntityKey
    kind: str
    message: JsonObject


def _classify(message: object, version: int | None) -> _Info | None:
    """The merge class and entity of a single ``session/update`` notification, else ``None``.

    ``None`` (a barrier) for everything else: other messages, unknown versions, unknown kinds
    ("unknown kinds are never merged"), removals and events (``plan_removed``, ``notice``), and
    malformed known kinds (missing ids).
    """
    if version not in SUPPORTED_VERSIONS or not isinstance(message, dict):
        return None
    if message.get("method") != SESSION_UPDATE or "id" in message:
        return None
    if message.get("jsonrpc") != "2.0":
        return None
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    session_id = params.get("sessionId")
    update = params.get("update")
    if not isinstance(session_id, str) or not isinstance(update, dict):
        return None
    kind = update.get("sessionUpdate")
    if not isinstance(kind, str):
        return None
    assert version is not None
    key: tuple[str | None, ...] | None = None
    upsert = UPSERT_KINDS[version].get(kind)
    if upsert is not None:
        key = upsert_entity_key(upsert, session_id, update)
        # v1 tool_call (re)creates the entity: a run member that never merges.
        cls = _Class.OPAQUE if upsert.meta_rule is MetaRule.CREATE else _Class.UPSERT
    elif (chunk := CHUNK_KINDS[version].get(kind)) is not None:
        cls = _chunk_class(chunk)
        if version == 1 and kind in _V1_STREAM_KINDS:
            key = (_V1_STREAM, session_id)
        else:
            key = entity_key(message, version)
    elif kind in SNAPSHOT_KINDS[version]:
        cls = _Class.SNAPSHOT
        key = entity_key(message, version)
    if key is None:
        return None
    return _Info(cls, (version, *key), kind, message)


def _equal_except(a: JsonObject, b: JsonObject, skip: str) -> bool:
    """``a`` and ``b`` are JSON-equal apart from the key ``skip``."""
    if a.keys() != b.keys():
        return False
    return all(k == skip or rawjson.json_equal(v, b[k]) for k, v in a.items())


def _same_envelope(a: JsonObject, b: JsonObject) -> bool:
    """Two notifications equal apart from ``params.update`` (``params._meta`` is kept exactly)."""
    pa, pb = a["params"], b["params"]
    assert isinstance(pa, dict) and isinstance(pb, dict)
    return _equal_except(a, b, "params") and _equal_except(pa, pb, "update")


def _no_meta(update: JsonObject) -> bool:
    """A chunk whose `_meta` is absent or null ("Omitted and null are equivalent" for chunks)."""
    return update.get("_meta") is None


# A chunk that carries anything else (an unknown field) is never concatenated.
_CHUNK_KEYS = frozenset(
    {"sessionUpdate", "messageId", "compactionId", "terminalId", "content", "data", "_meta"}
)


def _plain_text(update: JsonObject) -> str | None:
    """The text of a chunk whose content is exactly ``{"type": "text", "text": ...}``.

    No `_meta` on the chunk and none (nor ``annotations``) on the block: a client may show or
    keep those per chunk, so only bare text is provably the same once joined.
    """
    if not _CHUNK_KEYS.issuperset(update):
        return None
    content = update.get("content")
    if not isinstance(content, dict) or content.keys() != {"type", "text"}:
        return None
    text = content["text"]
    if content["type"] != "text" or not isinstance(text, str) or not _no_meta(update):
        return None
    return text


def _b64_bytes(update: JsonObject) -> bytes | None:
    """The decoded bytes of a terminal output chunk, ``None`` unless strictly valid base64."""
    data = update.get("data")
    if not _CHUNK_KEYS.issuperset(update) or not isinstance(data, str) or not _no_meta(update):
        return None
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def _with_update(message: JsonObject, update: JsonObject) -> JsonObject:
    params = message["params"]
    assert isinstance(params, dict)
    return {**message, "params": {**params, "update": update}}


def _dumps(message: JsonObject) -> bytes:
    return orjson.dumps(message) + b"\n"


class _Entry:
    """One waiting frame, or a group of merged frames (mutable: owned by the queue only)."""

    __slots__ = (
        "base",
        "cls",
        "encoded",
        "exact",
        "key",
        "kind",
        "lines",
        "message",
        "nbytes",
        "pieces",
        "raw",
        "texts",
        "updates",
        "version",
    )

    def __init__(self, raw: bytes, message: JsonObject | None, version: int | None) -> None:
        self.raw = raw  # the exact bytes while nothing was merged into the entry
        self.message = message
        # The last frame merged in, as (bytes, parse): merged frames are its bytes with only the
        # merged members replaced (lossless rewriting, ``rawsplice.splice``).
        self.base: tuple[bytes, JsonObject] | None = None
        self.version = version
        self.cls = _Class.UNCLASSIFIED
        self.key: EntityKey | None = None
        self.kind = ""
        self.updates: list[JsonObject] = []  # UPSERT: 1 or more (a clear, then an object)
        self.texts: list[str] = []  # text chunks: the texts to join
        self.pieces: list[bytes] = []  # terminal output chunks: the bytes to join
        self.encoded: list[bytes] | None = None  # cached frames once merged (None: dirty)
        self.nbytes = len(raw) + 1
        self.exact = self.nbytes  # last measured size
        # The shell may hand over several lines as one frame (joined by ``\n``): each counts.
        self.lines = raw.count(b"\n") + 1

    def classify(self, info: _Info | None) -> None:
        if info is None:
            self.cls = _Class.BARRIER
            return
        self.cls, self.key, self.kind, self.message = info.cls, info.key, info.kind, info.message

    def frame_count(self) -> int:
        return len(self.updates) if self.updates else self.lines

    def frames(self) -> list[bytes]:
        """The bytes to write, each ending in ``\\n``."""
        if not (self.updates or self.texts or self.pieces):
            return [self.raw + b"\n"]
        if self.encoded is None:
            self.encoded = self._encode()
        return self.encoded

    def _encode(self) -> list[bytes]:
        message = self.message
        assert message is not None
        if self.updates:
            return [self._splice(_with_update(message, u)) for u in self.updates]
        params = message["params"]
        assert isinstance(params, dict)
        update = params["update"]
        assert isinstance(update, dict)
        if self.cls is _Class.TEXT_CHUNK:
            content = update["content"]
            assert isinstance(content, dict)
            merged: JsonObject = {**update, "content": {**content, "text": "".join(self.texts)}}
        else:
            data = base64.b64encode(b"".join(self.pieces)).decode("ascii")
            merged = {**update, "data": data}
        return [self._splice(_with_update(message, merged))]

    def _splice(self, message: JsonObject) -> bytes:
        """``message`` (a merge) as the bytes of the last frame merged in, with only the members
        that differ from it encoded. Every merged frame passed ``rawscan.reencodes_exactly``, so
        the members encoded from earlier frames keep their values exactly too."""
        raw, base = self.base if self.base is not None else (self.raw, self.message)
        assert base is not None
        envelope = {**base, "params": message["params"]}  # the envelopes are equal
        try:
            return rawsplice.splice(raw, base, envelope) + b"\n"
        except (rawjson.Unencodable, rawjson.Unparseable):  # pragma: no cover - defensive
            return _dumps(message)


class OutboundQueue:
    """A bounded queue of frames toward one peer that coalesces waiting ``session/update``s."""

    __slots__ = (
        "_bytes",
        "_config",
        "_count",
        "_entries",
        "_interval",
        "_last_written",
        "_merge",
        "_prune_at",
        "_tail",
        "stats",
    )

    def __init__(self, config: CoalesceConfig, *, coalesce: bool) -> None:
        self._config = config
        self._merge = coalesce and config.enabled
        self._interval = config.min_interval_ms / 1000.0 if self._merge else 0.0
        self._entries: deque[_Entry] = deque()
        # The tail run: entity -> its last waiting entry after the last barrier.
        self._tail: dict[EntityKey, _Entry] = {}
        self._last_written: dict[EntityKey, float] = {}  # rate limit only
        self._prune_at = 1024
        self._bytes = 0
        self._count = 0
        self.stats = QueueStats()

    @property
    def rate_limited(self) -> bool:
        """True when ``min_interval_ms`` applies: every frame must pass through ``push``."""
        return self._interval != 0.0

    def __len__(self) -> int:
        """Frames waiting (a merged group counts as the frames it will write)."""
        return self._count

    @property
    def pending_bytes(self) -> int:
        """Bytes waiting (for merged groups: an upper estimate, re-measured as it grows)."""
        return self._bytes

    def has_room(self) -> bool:
        """True while below both bounds; the shell stops reading from the producer otherwise."""
        return (
            self._count < self._config.max_queue_messages
            and self._bytes < self._config.max_queue_bytes
        )

    # -- push -----------------------------------------------------------------------------

    def push(self, frame: OutFrame, now: float) -> None:
        """Append ``frame``, or merge it into a waiting frame of the same entity.

        The caller has checked ``has_room`` (or must push regardless, e.g. a reply it owes).
        """
        entry = _Entry(frame.raw, frame.message, frame.version)
        self.stats.pushed += entry.lines
        if not self._merge:
            entry.cls = _Class.BARRIER
            self._append(entry)
            return
        if not self._entries and self._interval == 0.0:
            # Nothing to merge with: do not even parse (the entry is classified if another frame
            # arrives while it still waits).
            self._append(entry)
            return
        if self._entries and self._entries[-1].cls is _Class.UNCLASSIFIED:
            # The only entry, pushed into an empty queue: it opens the tail run if mergeable.
            head = self._entries.pop()
            self._count -= head.lines
            self._bytes -= head.nbytes
            for line in _lines_of(head):
                self._add(line)
        for line in _lines_of(entry):
            self._add(line)

    def _add(self, entry: _Entry) -> None:
        """Classify one single-line entry and merge it into the tail run, or append it."""
        self._classify_entry(entry)
        if entry.cls is _Class.BARRIER:
            self._tail.clear()  # a barrier closes the run: nothing merges across it
            self._append(entry)
            return
        assert entry.key is not None
        target = self._tail.get(entry.key)
        if target is not None and self._merge_into(target, entry):
            self.stats.merged += 1
            return
        self._append(entry)
        self._tail[entry.key] = entry

    def _append(self, entry: _Entry) -> None:
        self._entries.append(entry)
        self._count += entry.lines
        self._bytes += entry.nbytes

    def _classify_entry(self, entry: _Entry) -> None:
        info: _Info | None = None
        message: object = entry.message
        if not rawscan.reencodes_exactly(entry.raw):
            # A number orjson would respell, or a surrogate escape: never merged, so it is
            # written as it came (orjson would change its numbers).
            entry.classify(None)
            return
        if message is None and _NEEDLE in entry.raw:
            try:
                message = orjson.loads(entry.raw)
            except orjson.JSONDecodeError:
                message = None
        if message is not None:
            info = _classify(message, entry.version)
        entry.classify(info)

    # -- merging --------------------------------------------------------------------------

    def _merge_into(self, target: _Entry, new: _Entry) -> bool:
        """Merge ``new`` into ``target`` (the entity's last waiting entry); False: keep both."""
        if target.cls is not new.cls or target.kind != new.kind or target.cls is _Class.OPAQUE:
            return False
        tm, nm = target.message, new.message
        assert tm is not None and nm is not None
        if not _same_envelope(tm, nm):
            return False
        new_update = _update_of(new)
        if target.cls is _Class.TEXT_CHUNK:
            if not self._concat_text(target, new_update):
                return False
        elif target.cls is _Class.B64_CHUNK:
            if not self._concat_bytes(target, new_update):
                return False
        else:
            return self._merge_core(target, new, new_update)
        target.base = (new.raw, nm)
        self._grew(target, new.nbytes)
        return True

    def _merge_core(self, target: _Entry, new: _Entry, new_update: JsonObject) -> bool:
        """Upserts and snapshots: ``updates.merge_updates`` decides (one or two updates)."""
        version = target.version
        assert isinstance(version, int)
        updates = target.updates or [_update_of(target)]
        last = updates[-1]
        result = merge_updates(last, new_update, version)
        if len(result) == 2 and result[0] is last and result[1] is new_update:
            return False  # not combinable: the new frame waits behind it
        if len(updates) == 1 and len(result) == 1 and result[0] is new_update:
            # The later update replaces the earlier whole (a snapshot): keep its exact bytes.
            target.raw, target.message, target.updates, target.encoded = (
                new.raw,
                new.message,
                [],
                None,
            )
            target.base = None
            self._bytes += new.nbytes - target.nbytes
            target.nbytes = target.exact = new.nbytes
            return True
        merged = [*updates[:-1], *result]
        # A clear kept from an earlier merge may now be absorbed by a later clear.
        while len(merged) >= 2:
            combined = merge_updates(merged[-2], merged[-1], version)
            if len(combined) != 1:
                break
            merged[-2:] = list(combined)
        self._count += len(merged) - target.frame_count()
        target.updates = merged
        assert new.message is not None
        target.base = (new.raw, new.message)
        self._grew(target, new.nbytes)
        return True

    def _concat_text(self, target: _Entry, new_update: JsonObject) -> bool:
        text = _plain_text(new_update)
        if text is None or not _equal_except(_update_of(target), new_update, "content"):
            return False
        if not target.texts:
            first = _plain_text(_update_of(target))
            if first is None:
                return False
            target.texts.append(first)
        target.texts.append(text)
        return True

    def _concat_bytes(self, target: _Entry, new_update: JsonObject) -> bool:
        data = _b64_bytes(new_update)
        if data is None or not _equal_except(_update_of(target), new_update, "data"):
            return False
        if not target.pieces:
            first = _b64_bytes(_update_of(target))
            if first is None:
                return False
            target.pieces.append(first)
        target.pieces.append(data)
        return True

    def _grew(self, target: _Entry, added: int) -> None:
        """Account for bytes merged into ``target``; re-measure once the estimate doubles."""
        target.encoded = None
        target.nbytes += added
        self._bytes += added
        if target.nbytes > 2 * target.exact + _SLACK_BYTES:
            exact = sum(len(f) for f in target.frames())
            self._bytes += exact - target.nbytes
            target.nbytes = target.exact = exact

    # -- take -----------------------------------------------------------------------------

    def take(self, now: float) -> tuple[list[bytes], float | None]:
        """Everything ready to write now, each frame ending in ``\\n``, and when to call again.

        The deadline (same clock as ``now``) is set when frames are held back by the rate limit;
        ``None`` means "call again when something is pushed".
        """
        if self._interval == 0.0:
            out: list[bytes] = []
            for entry in self._entries:
                out.extend(self._written(entry))
            self._entries.clear()
            self._tail.clear()
            self.stats.written += self._count
            self._bytes = self._count = 0
            return out, None
        return self._take_limited(now)

    def _written(self, entry: _Entry) -> list[bytes]:
        frames = entry.frames()
        if len(frames) > 1:
            self.stats.split += len(frames) - 1
        return frames

    def _take_limited(self, now: float) -> tuple[list[bytes], float | None]:
        # Entries up to the last barrier are due regardless: a barrier releases what precedes it.
        last_barrier = -1
        for i, entry in enumerate(self._entries):
            if entry.cls is _Class.BARRIER:
                last_barrier = i
        out: list[bytes] = []
        written = 0
        held: deque[_Entry] = deque()
        deadline: float | None = None
        for i, entry in enumerate(self._entries):
            key = entry.key
            if i > last_barrier and key is not None:
                written_at = self._last_written.get(key)
                # Compare with the very deadline returned, so taking at it always releases.
                due = written_at + self._interval if written_at is not None else now
                if now < due:
                    held.append(entry)
                    deadline = due if deadline is None else min(deadline, due)
                    continue
            out.extend(self._written(entry))
            written += entry.frame_count()
            if key is not None:
                self._last_written[key] = now
        self._entries = held
        self._tail = {e.key: e for e in held if e.key is not None}
        self._count = sum(e.frame_count() for e in held)
        self._bytes = sum(e.nbytes for e in held)
        self.stats.written += written
        self._prune(now)
        return out, deadline

    def _prune(self, now: float) -> None:
        """Forget entities written longer than the interval ago (they can no longer be held)."""
        if len(self._last_written) < self._prune_at:
            return
        horizon = now - self._interval
        self._last_written = {k: t for k, t in self._last_written.items() if t > horizon}
        self._prune_at = max(1024, 2 * len(self._last_written))


def _lines_of(entry: _Entry) -> list[_Entry]:
    """``entry`` as single-line entries (the shell may join a run of untouched lines)."""
    if entry.lines == 1:
        return [entry]
    return [_Entry(line, None, entry.version) for line in entry.raw.split(b"\n")]


def _update_of(entry: _Entry) -> JsonObject:
    message = entry.message
    assert message is not None
    params = message["params"]
    assert isinstance(params, dict)
    update = params["update"]
    assert isinstance(update, dict)
    return update
