"""How waiting updates of one entity combine: the merged group and its rules.

Contract: owns a ``Group`` (one waiting line, or several lines of one entity merged into one, or
a clear then an object) and the rules for absorbing a later line of the same entity and kind.
A group keeps the bytes of its lines and only what a merge must read again (the parsed updates
of an upsert, the texts or bytes of a chunk stream), and says what it holds in memory
(``charge``) so the queue's byte bound counts it. Merging looks only at the members of the two
updates (``updates.merge_updates``), never at the rest of the queue, and never re-encodes a
member it did not change: the written frame is the last line's bytes with only the merged
members replaced (``rawsplice.splice``). Pure: no I/O; never mutates a parsed message it was given.

Rules (only when the two notifications are equal apart from ``params.update``: same
``sessionId``, same or absent ``params._meta``, which is notification data, not a patch; RFD
"Does this change `params._meta`": no):

* upserts: ``updates.merge_updates``, which may return a clear followed by an object (RFD:
  "Intermediaries that combine updates MUST keep removals and clears. Replacing a clear followed
  by an object with just that object is wrong");
* text chunks: concatenated only where the client cannot tell the difference (plain text blocks
  without ``_meta`` or annotations, equal apart from the text); terminal output bytes decoded,
  joined and re-encoded;
* whole snapshots: the later replaces the earlier and keeps its exact bytes (``usage_update``
  keeps an omitted ``cost``: ``merge_updates`` decides);
* a line whose numbers orjson would respell, or that holds a surrogate escape
  (``rawscan.reencodes_exactly``), never merges: it is written as it came.
"""

from __future__ import annotations

import base64
import binascii
import sys
from collections.abc import Sequence

import orjson

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.meta.updates import merge_updates
from acp_proxy.wire.coalesce.keys import Class, EntityKey, Spec, plain_envelope
from acp_proxy.wire.coalesce.shape import FIELD_MEMBERS, FIELD_NAMES, FastKind, Mode, text_of
from acp_proxy.wire.raw import rawjson, rawscan, rawsplice

# What a group holds beyond its bytes, per parsed update kept: Python objects take several times
# the bytes they were parsed from (``test_coalesce_bound.py`` measures it with tracemalloc).
PARSED_FACTOR = 6
PARSED_BASE = 512
GROUP_OVERHEAD = 320  # the group object, its lists, its slot in the queue
# What a group on the bytes path holds beyond its bytes and texts: its member order, its id.
FAST_OVERHEAD = 192
# Frames encoded ahead of the write: the list, and each bytes object beyond its bytes.
READY_OVERHEAD = 64
FRAME_BYTES_OVERHEAD = 41


def update_of(message: JsonObject) -> JsonObject:
    params = message["params"]
    assert isinstance(params, dict)
    update = params["update"]
    assert isinstance(update, dict)
    return update


def _equal_except(a: JsonObject, b: JsonObject, skip: str) -> bool:
    """``a`` and ``b`` are JSON-equal apart from the key ``skip``."""
    if a.keys() != b.keys():
        return False
    return all(k == skip or rawjson.json_equal(v, b[k]) for k, v in a.items())


def same_envelope(a: JsonObject, b: JsonObject) -> bool:
    """Two notifications equal apart from ``params.update`` (``params._meta`` is kept exactly)."""
    if plain_envelope(a) and plain_envelope(b):
        return True  # classified alike: one session, nothing else in the envelope
    pa, pb = a["params"], b["params"]
    assert isinstance(pa, dict) and isinstance(pb, dict)
    return _equal_except(a, b, "params") and _equal_except(pa, pb, "update")


# A chunk that carries anything else (an unknown field) is never concatenated.
_CHUNK_KEYS = frozenset(
    {"sessionUpdate", "messageId", "compactionId", "terminalId", "content", "data", "_meta"}
)


def plain_text(update: JsonObject) -> str | None:
    """The text of a chunk whose content is exactly ``{"type": "text", "text": ...}``.

    No `_meta` on the chunk ("Omitted and null are equivalent" for chunks) and none (nor
    ``annotations``) on the block: a client may show or keep those per chunk, so only bare text
    is provably the same once joined.
    """
    if not _CHUNK_KEYS.issuperset(update):
        return None
    content = update.get("content")
    if not isinstance(content, dict) or content.keys() != {"type", "text"}:
        return None
    text = content["text"]
    if content["type"] != "text" or not isinstance(text, str) or update.get("_meta") is not None:
        return None
    return text


def b64_bytes(update: JsonObject) -> bytes | None:
    """The decoded bytes of a terminal output chunk, ``None`` unless strictly valid base64."""
    data = update.get("data")
    if not _CHUNK_KEYS.issuperset(update) or not isinstance(data, str):
        return None
    if update.get("_meta") is not None:
        return None
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


class Group:
    """One waiting line of a mergeable kind and what was merged into it (owned by the queue)."""

    __slots__ = (
        "base",
        "carried",
        "charge",
        "fast",
        "first",
        "head",
        "ident",
        "kept",
        "key",
        "last",
        "lines",
        "mask",
        "merged",
        "order",
        "parsed",
        "pieces",
        "plain",
        "ready",
        "sizes",
        "spec",
        "state",
        "texts",
        "tpl",
        "updates",
    )

    def __init__(self, raw: bytes, spec: Spec, key: EntityKey) -> None:
        self.spec = spec
        self.key = key
        self.first = raw  # the exact bytes while nothing was merged in
        # The last line merged in: merged frames are its bytes with only the merged members
        # replaced. ``None``: nothing merged, ``first`` is written as it came.
        self.last: bytes | None = None
        self.head: JsonObject | None = None  # chunks: the first line's update (the template)
        self.updates: list[JsonObject] = []  # upserts: 1 or 2 (a clear, then an object)
        # Upserts: the parse of ``last``. The merged update shares its unchanged members with
        # it, so the splice sees them as unchanged by identity and copies their bytes.
        self.base: JsonObject | None = None
        # Upserts: the encoded size of each member of the last update (a merge measures only
        # the members it takes from the new line, so its work follows the changed members).
        self.sizes: dict[str, int] = {}
        # Text chunks: the texts to join (on the bytes path, a text may be kept as its literal's
        # bytes: ``coalesce_shape.update_shape``; the merge by parsing holds only str).
        self.texts: list[str] = []
        # Text chunks: the last line's bytes before and after its text (the literal), when it
        # is known: a later line with exactly these bytes around a text merges without a parse
        # (``text_of``, ``add_text``), and the frame is encoded from them. Its two slices count
        # in ``charge``.
        self.tpl: tuple[bytes, bytes] | None = None
        self.pieces: list[bytes] = []  # terminal output chunks: the bytes to join
        self.lines = 1  # frames it will write
        self.merged = 0  # later lines merged into it (the queue counts them)
        # None: not looked at yet; False: never merges (numbers, malformed); True: merging.
        self.state: bool | None = None
        self.plain = False  # the envelope is exactly jsonrpc, method, params{sessionId, update}
        self.parsed = 0  # what the parsed objects it keeps take (an upper estimate)
        # Its frames encoded ahead of time (``prepare``); dropped when a later line merges in.
        self.ready: list[bytes] | None = None
        self.charge = len(raw) + 1 + GROUP_OVERHEAD
        # The bytes path (``coalesce_bytes``): what it merged from the lines' shapes, without
        # a parse. ``fast`` None: the group is merged by parsing (``absorb``), as above.
        self.fast: FastKind | None = None
        self.mask = 0  # the members of the current line (``last``, else ``first``): bits
        self.order = b""  # upserts: every member met, in the merged update's order
        self.ident: str | None = None  # text chunks: the message id (v1 streams compare it)
        # Members of earlier lines the current one lacks, encoded: FIELDS index -> bytes.
        self.carried: dict[int, bytes] | None = None
        self.kept = 0  # which: bits

    def recharge(self) -> int:
        """Recompute ``charge`` (what the group holds changed); returns its change."""
        return self._recharge()

    def _recharge(self) -> int:
        """Recompute ``charge``; returns its change."""
        before = self.charge
        held = len(self.first) + (len(self.last) if self.last is not None else 0) + 1
        ready = self.ready
        if ready is not None:
            held += READY_OVERHEAD + sum(len(f) + FRAME_BYTES_OVERHEAD for f in ready)
        tpl = self.tpl
        if tpl is not None:
            held += len(tpl[0]) + len(tpl[1]) + 2 * FRAME_BYTES_OVERHEAD
        self.charge = GROUP_OVERHEAD + held + self.parsed
        return self.charge - before

    # -- merging --------------------------------------------------------------------------

    def absorb(self, raw: bytes, message: JsonObject) -> int | None:
        """Merge the later line ``raw`` (parsed: ``message``, same entity and kind) into this
        group. Returns the change of ``charge`` (``lines`` may change too), or ``None`` when
        the two must stay apart (the caller queues ``raw`` behind this group)."""
        if self.fast is not None:
            self.materialize()
        if self.state is None:
            self.state = self._open()
        if not self.state or not rawscan.reencodes_exactly(raw):
            return None
        if not (self.plain and plain_envelope(message)):
            written = self.last if self.last is not None else self.first
            if not same_envelope(orjson.loads(written), message):
                return None
        update = update_of(message)
        cls = self.spec.cls
        if cls is Class.TEXT_CHUNK:
            text = plain_text(update)
            assert self.head is not None
            if text is None or not _equal_except(self.head, update, "content"):
                return None
            self.texts.append(text)
            self.parsed += sys.getsizeof(text) + 8
            self.tpl = _template(raw)
        elif cls is Class.B64_CHUNK:
            data = b64_bytes(update)
            assert self.head is not None
            if data is None or not _equal_except(self.head, update, "data"):
                return None
            self.pieces.append(data)
            self.parsed += len(data) + 41
        elif not self._merge_upsert(raw, message):
            return None
        else:
            self.ready = None  # what was encoded ahead no longer holds
            return self._recharge()
        if self.last is None:
            self.first = b""  # the chunk's first text or bytes are kept, its line is not
        self.last = raw
        self.ready = None
        return self._recharge()

    def materialize(self) -> None:
        """Leave the bytes path: parse what the merge by parsing needs of what it merged (the
        state ``absorb`` would have reached merging the same lines)."""
        fast = self.fast
        assert fast is not None
        self.fast = None
        last = self.last
        if fast.mode is Mode.TEXT:
            raw = last if last is not None else self.first
            self.head = update_of(orjson.loads(raw))
            self.texts = [text_of(t) for t in self.texts]
            parsed = sum(sys.getsizeof(t) + 8 for t in self.texts)
            self.parsed = parsed + PARSED_FACTOR * len(raw) + PARSED_BASE
            if last is not None:
                span = rawsplice.member_span(last, _TEXT_PATH, b"text")
                assert span is not None  # the shape found the literal: so does this scan
                self.tpl = (last[: span[2]], last[span[3] :])
        elif last is None:  # one line as it came (or a snapshot that replaced it): not opened
            self.state, self.parsed, self.carried, self.kept = None, 0, None, 0
        else:
            message = orjson.loads(last)
            update = update_of(message)
            carried = self.carried or {}
            merged: JsonObject
            if fast.mode is Mode.PATCH:  # every member met, in the order the merge met them
                merged = {}
                for i in self.order:
                    name = FIELD_NAMES[i]
                    merged[name] = orjson.loads(carried[i]) if i in carried else update[name]
            else:  # the later snapshot, then the sticky members it omitted
                merged = dict(update)
                for i in sorted(carried):
                    merged[FIELD_NAMES[i]] = orjson.loads(carried[i])
            self.updates, self.base = [merged], message
            self.sizes = _sizes(merged)
            self.parsed = _parsed_charge(self.sizes)
            self.carried, self.kept = None, 0
        self._recharge()

    def text_of(self, line: bytes) -> str | None:
        """The text of ``line`` when it is the last merged line with another text literal, byte
        for byte (``tpl``): a chunk of the same message with the same envelope, so only its
        text needs decoding (``add_text`` merges it). ``None``: ``absorb`` judges it."""
        tpl = self.tpl
        if tpl is None:
            return None
        head, tail = tpl
        cut, end = len(head), len(line) - len(tail)
        if end - cut < 2 or not line.startswith(head) or not line.endswith(tail):
            return None
        literal = line[cut:end]
        # A ``\u`` escape may be a surrogate (``rawscan.reencodes_exactly``): ``absorb`` judges.
        if literal[0] != 0x22 or literal[-1] != 0x22 or b"\\u" in literal:
            return None
        try:
            text = orjson.loads(literal)
        except orjson.JSONDecodeError:
            return None
        return text if type(text) is str else None

    def add_text(self, line: bytes, text: str) -> int:
        """Merge ``line``, whose text ``text_of`` gave; returns the change of ``charge``."""
        self.texts.append(text)
        self.parsed += sys.getsizeof(text) + 8
        self.last = line
        self.ready = None
        return self._recharge()

    def _open(self) -> bool:
        """Parse the first line before the first merge: False when it never merges."""
        if self.spec.cls is Class.OPAQUE or not rawscan.reencodes_exactly(self.first):
            return False
        message = orjson.loads(self.first)
        self.plain = plain_envelope(message)
        update = update_of(message)
        cls = self.spec.cls
        if cls is Class.TEXT_CHUNK:
            text = plain_text(update)
            if text is None:
                return False
            self.texts.append(text)
            self.parsed += sys.getsizeof(text) + 8
        elif cls is Class.B64_CHUNK:
            data = b64_bytes(update)
            if data is None:
                return False
            self.pieces.append(data)
            self.parsed += len(data) + 41
        else:
            self.updates.append(update)
            self.sizes = _sizes(update)
            self.parsed = _parsed_charge(self.sizes)
            self._recharge()
            return True
        self.head = update
        self.parsed += PARSED_FACTOR * len(self.first) + PARSED_BASE
        self._recharge()
        return True

    def _merge_upsert(self, raw: bytes, message: JsonObject) -> bool:
        """Upserts and snapshots: ``updates.merge_updates`` decides (one or two updates)."""
        update = update_of(message)
        version = self.spec.version
        updates = self.updates
        last = updates[-1]
        result = merge_updates(last, update, version)
        if len(result) == 2 and result[0] is last and result[1] is update:
            return False  # not combinable: the new line waits behind this group
        if len(updates) == 1 and len(result) == 1 and result[0] is update:
            # The later update replaces the earlier whole (a snapshot): keep its exact bytes.
            self.first, self.last, self.base = raw, None, None
            updates[0] = update
            self.sizes = _sizes(update)
            self.parsed = _parsed_charge(self.sizes)
            return True
        merged = [*updates[:-1], *result]
        # A clear kept from an earlier merge may now be absorbed by a later clear.
        while len(merged) >= 2:
            combined = merge_updates(merged[-2], merged[-1], version)
            if len(combined) != 1:
                break
            merged[-2:] = list(combined)
        if len(merged) == 1:
            self.sizes = _merged_sizes(merged[0], last, self.sizes, update)
            self.parsed = _parsed_charge(self.sizes)
        else:  # a clear then an object (rare): measured whole
            self.sizes = _sizes(merged[-1])
            self.parsed = sum(_parsed_charge(_sizes(u)) for u in merged)
        self.updates = merged
        self.lines = len(merged)
        self.first, self.last, self.base = b"", raw, message
        return True

    # -- writing --------------------------------------------------------------------------

    def prepare(self) -> int:
        """Encode the frames now, ahead of the write (a paused peer's queue, while the writer
        waits anyway). Returns the change of ``charge``: the encoded bytes count too."""
        if self.ready is None and self.last is not None:
            self.ready = self._encode()
            return self._recharge()
        return 0

    def frames(self) -> list[bytes]:
        """The frames to write, without their newlines."""
        ready = self.ready
        return ready if ready is not None else self._encode()

    def _encode(self) -> list[bytes]:
        last = self.last
        if last is None:
            return [self.first]
        fast = self.fast
        if fast is not None:
            if fast.mode is Mode.TEXT:
                literal = _joined(self.texts)
                if literal is None:  # the earlier texts were empty: as it came
                    return [last]
                span = rawsplice.member_span(last, _TEXT_PATH, b"text")
                assert span is not None  # the shape found the literal: so does this scan
                return [b"".join((last[: span[2]], literal, last[span[3] :]))]
            carried = self.carried
            if not carried:
                return [last]
            span = rawsplice.member_span(last, _UPDATE_PATH, b"sessionUpdate")
            assert span is not None  # the shape found the update: so does this scan
            cut = span[4]  # after the update's last member
            order = self.order if fast.mode is Mode.PATCH else sorted(carried)
            added = [FIELD_MEMBERS[i] + carried[i] for i in order if i in carried]
            return [b"".join((last[:cut], *added, last[cut:]))]
        tpl = self.tpl
        if tpl is not None:  # the bytes ``_splice`` gives, without parsing ``last``
            joined = "".join(self.texts)
            if joined == self.texts[-1]:  # the earlier texts were empty: ``last`` as it came
                return [last]
            return [b"".join((tpl[0], orjson.dumps(joined), tpl[1]))]
        if self.updates:
            parsed = self.base
            assert parsed is not None  # set with ``last``
            return [_splice(last, parsed, u) for u in self.updates]
        base = orjson.loads(last)
        head = self.head
        assert head is not None
        if self.spec.cls is Class.TEXT_CHUNK:
            content = head["content"]
            assert isinstance(content, dict)
            merged: JsonObject = {**head, "content": {**content, "text": "".join(self.texts)}}
        else:
            data = base64.b64encode(b"".join(self.pieces)).decode("ascii")
            merged = {**head, "data": data}
        return [_splice(last, base, merged)]


_TEXT_PATH = (b"params", b"update", b"content")


def _joined(texts: Sequence[bytes | str]) -> bytes | None:
    """The literal of the texts joined, as orjson spells it (``None``: all but the last are
    empty, so the last line is written as it came). Literals' bytes kept as orjson spells them
    (``coalesce_shape.spelled_as_orjson``) join as they are."""
    if all(type(t) is bytes for t in texts):
        if sum(map(len, texts)) == len(texts[-1]):
            return None
        return b"".join((b'"', *texts, b'"'))  # type: ignore[arg-type]
    strs = [text_of(t) for t in texts]
    joined = "".join(strs)
    return None if joined == strs[-1] else orjson.dumps(joined)


_UPDATE_PATH = (b"params", b"update")


def _template(line: bytes) -> tuple[bytes, bytes] | None:
    """``line``'s bytes before and after the literal of ``params.update.content.text``."""
    span = rawsplice.member_span(line, _TEXT_PATH, b"text")
    if span is None or span[2] < 0:
        return None
    return line[: span[2]], line[span[3] :]


def encode_ahead(entries: Sequence[object], start: int, budget: int) -> tuple[int, int]:
    """Encode the groups among ``entries`` from ``start``, about ``budget`` of them, ahead of
    the write (``Group.prepare``). Returns the position walked to and the change of their
    charge."""
    i, end, charge = start, len(entries), 0
    while i < end and budget > 0:
        entry = entries[i]
        i += 1
        if isinstance(entry, Group):
            charge += entry.prepare()
            budget -= 1
    return i, charge


def _sizes(update: JsonObject) -> dict[str, int]:
    """The encoded size of each member of ``update``."""
    dumps = orjson.dumps
    return {k: len(k) + 4 + len(dumps(v)) for k, v in update.items()}


def _merged_sizes(
    merged: JsonObject, last: JsonObject, sizes: dict[str, int], update: JsonObject
) -> dict[str, int]:
    """The member sizes of ``merged`` (``last`` then ``update``): members taken whole from
    ``update`` or kept from ``last`` are not measured again; only the changed ones are."""
    dumps = orjson.dumps
    out: dict[str, int] = {}
    for k, v in merged.items():
        if update.get(k, update) is v:
            out[k] = len(k) + 4 + len(dumps(v))
        elif last.get(k, last) is v and k in sizes:
            out[k] = sizes[k]
        else:  # composed (`_meta`, a sticky field)
            out[k] = len(k) + 4 + len(dumps(v))
    return out


def _parsed_charge(sizes: dict[str, int]) -> int:
    return PARSED_FACTOR * sum(sizes.values()) + PARSED_BASE


def _splice(raw: bytes, base: JsonObject, update: JsonObject) -> bytes:
    """``base`` (the parse of ``raw``) with ``update`` as its ``params.update``, as ``raw``'s bytes
    with only the members that differ encoded. Every merged line passed
    ``rawscan.reencodes_exactly``, so members encoded from earlier lines keep their values too."""
    params = base["params"]
    assert isinstance(params, dict)
    message = {**base, "params": {**params, "update": update}}
    try:
        return rawsplice.splice(raw, base, message)
    except (rawjson.Unencodable, rawjson.Unparseable):  # pragma: no cover - defensive
        return orjson.dumps(message)
