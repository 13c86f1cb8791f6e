"""The coalescer's bytes path: merging the kinds that dominate real streams without a parse.

Contract: owns how a ``Group`` merges on its lines' shapes (``coalesce_shape.update_shape``: one
scan of each line, no JSON value built), for bare text chunks of one message, v2 upserts without
``_meta`` (a tool call's status and content updates) and whole snapshots (plans, usage). What
it writes is byte for byte what merging the same lines by parsing (``Group.absorb``) writes;
where it cannot tell, it says so (``None``) and the caller hands the group to that path
(``Group.materialize``, then ``absorb``). Pure: no I/O; never mutates a line.

Rules (each the one ``coalesce_merge`` and ``updates.merge_updates`` apply, on what the shape
shows):

* text chunks: the later line has exactly the members of the group's (the entity key gives the
  kind and message; a v1 stream compares the message id) and a bare text: its text is appended,
  and the frame is the last line with the joined texts as its literal (kept as the literals'
  bytes while they are spelled as orjson spells them, joined then as they are);
* v2 upserts (``Mode.PATCH``): both lines hold only members the kind knows; the later line's
  members win, and each member only earlier lines had is carried, encoded as the parse would
  encode it (``rawjson.encode_value`` of its value: the one small parse, once per member a later
  line drops), and added after the last line's members in the order the merged update met
  them. ``_meta`` (an object or null) is such a member too (``patch.compose`` keeps the one
  patch there is, and a clear wins), except a patch object after another patch: those compose
  key by key, and the parse does that;
* snapshots: the later line replaces the group whole, as it came; a sticky member it omits
  (``usage_update.cost``) is carried on v2 and stops the merge on v1 (the parse path's answer).
"""

from __future__ import annotations

import orjson

from acp_proxy.wire.coalesce.keys import EntityKey, Spec
from acp_proxy.wire.coalesce.merge import (
    FAST_OVERHEAD,
    FRAME_BYTES_OVERHEAD,
    Group,
)
from acp_proxy.wire.coalesce.shape import (
    FIELD_NAMES,
    FIELD_TABLE,
    FIELDS,
    IDENTS,
    FastKind,
    Kinds,
    Mode,
    Shape,
    update_shape,
)
from acp_proxy.wire.raw import rawsplice
from acp_proxy.wire.raw.rawjson import encode_value

_UPDATE = (b"params", b"update")
_TEXT, _PATCH = Mode.TEXT, Mode.PATCH
_META_INDEX = FIELD_NAMES.index("_meta")
_META = 1 << _META_INDEX
_CARRIED_OVERHEAD = 64  # the dict of carried members (beyond each bytes object)


def group_of(
    raw: bytes,
    spec: Spec,
    key: EntityKey,
    kinds: Kinds | None,
    shape: Shape | None = None,
) -> Group:
    """The group of the waiting line ``raw`` (of ``spec`` and ``key``): on the bytes path when
    there is one (``kinds``) and its shape (given, else scanned) allows it."""
    if kinds is not None:
        if shape is None:
            shape = update_shape(raw, FIELDS, IDENTS, FIELD_TABLE, kinds)
        if shape is not None and shape[0].spec is spec:
            group = open_group(raw, shape, key)
            if group is not None:
                return group
    return Group(raw, spec, key)


def open_group(raw: bytes, shape: Shape, key: EntityKey) -> Group | None:
    """The group of the waiting line ``raw`` (shape ``shape``) on the bytes path; ``None`` when
    its merges need the parse (the caller makes it a plain ``Group``)."""
    fast = shape[0]
    mask = shape[3]
    mode = fast.mode
    if mode is not Mode.SNAPSHOT and mask & ~fast.allowed:
        return None
    if mask & _META and not (shape[6] | shape[7]) & _META:
        return None  # a malformed ``_meta``: the parse never merges it
    text = shape[5]
    if mode is Mode.TEXT and text is None:
        return None
    group = Group(raw, fast.spec, key)
    group.fast = fast
    group.state = group.plain = True
    group.mask = mask
    group.parsed = FAST_OVERHEAD
    if mode is Mode.TEXT:
        assert text is not None
        group.texts.append(text)  # type: ignore[arg-type]  # (bytes or str: ``Group.texts``)
        group.parsed += text.__sizeof__() + 8
        group.ident = shape[2]
    else:
        group.order = shape[4] or b""
    group.charge += group.parsed
    return group


def merge(group: Group, fast: FastKind, raw: bytes, shape: Shape) -> int | None:
    """Merge the later line ``raw`` of shape ``shape`` (same entity and kind) into ``group``
    (on the bytes path: ``fast`` is its ``fast``). Returns the change of its ``charge``, or
    ``None`` when the parse must judge (the group has not changed)."""
    mask = shape[3]
    if fast.mode is _TEXT:  # (the most frequent: a streamed reply's chunks, in few steps)
        text = shape[5]
        if text is None or mask != group.mask or shape[2] != group.ident:
            return None
        size = text.__sizeof__() + 8
        group.texts.append(text)  # type: ignore[arg-type]  # (bytes or str: ``Group.texts``)
        group.parsed += size
        last = group.last
        if last is None:
            change = size + len(raw) - len(group.first)
            group.first = b""
        else:
            change = size + len(raw) - len(last)
        group.last = raw
        if group.ready is None:
            group.charge += change
            return change
        group.ready = None  # what was encoded ahead no longer holds
        return group.recharge()
    last = group.last
    before = len(group.first) + (len(last) if last is not None else 0) + group.parsed
    if fast.mode is _PATCH:
        if mask & ~fast.allowed:
            return None
        if mask & _META and not shape[6] & _META:
            if not shape[7] & _META:
                return None  # a malformed ``_meta``: the parse never merges it
            if (group.mask | group.kept) & _META:
                return None  # two patches: they compose (``patch.compose``), which parses
        seen = group.mask | group.kept
        if group.mask & ~mask or mask & group.kept:
            _carry(group, group.mask & ~mask, mask)
        if mask & ~seen:  # members no earlier line had: last in the merged update's order
            known = group.order
            group.order = known + bytes(i for i in shape[4] or b"" if i not in known)
        group.mask = mask
        group.first, group.last = b"", raw
    else:
        gone = group.mask & fast.sticky & ~mask
        if gone and not fast.carry:
            return None
        if gone or mask & group.kept:
            _carry(group, gone, mask)
        group.mask = mask
        if group.kept:
            group.first, group.last = b"", raw
        else:  # the later snapshot whole, as it came
            group.first, group.last = raw, None
    if group.ready is not None:  # what was encoded ahead no longer holds
        group.ready = None
        return group.recharge()
    last = group.last
    change = len(group.first) + (len(last) if last is not None else 0) + group.parsed - before
    group.charge += change
    return change


def _carry(group: Group, gone: int, mask: int) -> None:
    """Carry the members ``gone`` of the group's current line (the later line lacks them),
    encoded; drop the carried members the later line has (``mask``)."""
    carried = group.carried
    if carried is None:
        carried = group.carried = {}
        group.parsed += _CARRIED_OVERHEAD
    back = mask & group.kept
    if back:
        for i in [i for i in carried if back >> i & 1]:
            group.parsed -= len(carried.pop(i)) + FRAME_BYTES_OVERHEAD
    if gone:
        current = group.last if group.last is not None else group.first
        for i, field in enumerate(FIELDS):
            if gone >> i & 1:
                name = field if isinstance(field, bytes) else field[0]
                span = rawsplice.member_span(current, _UPDATE, name)
                assert span is not None and span[2] >= 0  # the shape said it is there, once
                # (copied to its size: orjson's output keeps a 4 KiB block however short)
                encoded = bytes(memoryview(encode_value(orjson.loads(current[span[2] : span[3]]))))
                carried[i] = encoded
                group.parsed += len(encoded) + FRAME_BYTES_OVERHEAD
    group.kept = (group.kept & ~back) | gone
    if not carried:
        group.carried = None
        group.parsed -= _CARRIED_OVERHEAD
