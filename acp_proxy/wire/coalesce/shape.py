"""What a waiting line is to the coalescer's bytes path, from one scan and no parse.

Contract: owns ``update_shape(raw, FIELDS, IDENTS, FIELD_TABLE, kinds)``, the shape of a
plain ``session/update`` line of a kind the bytes path merges (its kind, entity key, which
update members it has and in which order, the text of a bare text chunk), with two
implementations of one contract: the C accelerator's (``_scan.update_shape``, used when it is
built) and ``update_shape_py`` here, its reference (the tests hold the C one to it; without the
accelerator nothing uses the bytes path, whose point is to cost less than the parse it
replaces). It also owns ``FastKind``, what the bytes path does with each kind of each version,
built from the same registry tables as ``coalesce_keys`` (so a line gets the same entity key
from its shape as from ``classify``), and ``split_lines`` (a frame's lines, in C when it can).
Pure: no I/O; builds no JSON value but the few strings of the result.

``update_shape`` answers ``None`` unless ``raw`` is one valid JSON object (what orjson accepts)
that the coalescer may merge at all (``rawscan.reencodes_exactly``) and that is exactly
``{"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": S, "update": {...}}}``
(members in any order, whitespace anywhere JSON allows it), with no key spelled with an escape or
given twice in the envelope or the update, at most ``MAX_MEMBERS`` members in each, nesting at
most ``MAX_DEPTH`` deep, ``S`` a string, and the update's ``sessionUpdate`` a string spelled
(without escapes) as the kind of one entry of ``kinds`` (``KIND_TABLES[version]``: ``(kind as
bytes, FastKind, entity, id bit, ordered)`` each). Otherwise it answers ``(fast, key, ident,
mask, order, text, nulls, objects)``:

* ``fast``: that entry's ``FastKind``;
* ``mask``: bit ``i`` set when the update has member ``FIELDS[i]``; bit ``OTHER_BIT`` when it
  has a member that is not in ``FIELDS``; ``order`` (for an ``ordered`` entry, else ``None``):
  the indexes of its members in ``FIELDS``, in the order they come (the others left out);
* ``ident``: when exactly one of the first ``IDENTS`` fields is there, its string value (for a
  ``(key, inner)`` field, the string ``inner`` of the object ``key``, if that object has no
  escaped or repeated key); else ``None``;
* ``key``: the entity key ``classify`` gives the line: ``(entity, S)`` for an entry whose id bit
  is 0 (the session is the entity), ``(entity, S, ident)`` when the line has the member of the
  entry's id bit and ``ident`` is its string; else ``None`` (the caller parses the line);
* ``text``: when the update's ``content`` is an object whose members are exactly ``"type":
  "text"`` (those bytes) and ``"text"``, a string (no escaped or repeated key, at most
  ``MAX_MEMBERS``): its literal's bytes between the quotes when the literal is spelled as orjson
  spells its text (no escape but ``\\" \\\\ \\b \\f \\n \\r \\t``: ``spelled_as_orjson``), else the
  string decoded; else ``None``;
* ``nulls``, ``objects``: bit ``i`` set when member ``FIELDS[i]``'s value is ``null``, an object.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import Final

import orjson

from acp_proxy.base.values import value
from acp_proxy.meta.registry import (
    CHUNK_KINDS,
    SNAPSHOT_KINDS,
    SUPPORTED_VERSIONS,
    UPSERT_KINDS,
    MetaRule,
)
from acp_proxy.wire.coalesce.keys import (
    V1_STREAM,
    V1_STREAM_KINDS,
    Class,
    EntityKey,
    Spec,
    table_of,
)
from acp_proxy.wire.raw import block_scan as scan
from acp_proxy.wire.raw import rawscan
from acp_proxy.wire.raw.rawjson import Unparseable

MAX_DEPTH: Final = 256
MAX_MEMBERS: Final = 63
OTHER_BIT: Final = 62

# fast, key, ident, mask, order, text, nulls, objects
Shape = tuple[
    "FastKind", "EntityKey | None", str | None, int, bytes | None, bytes | str | None, int, int
]
# kind as bytes, FastKind, entity, id bit, ordered
KindEntry = tuple[bytes, "FastKind", str, int, bool]
Field = bytes | tuple[bytes, bytes]


def _fields() -> tuple[tuple[Field, ...], int]:
    """The update members the bytes path knows: the entity ids first (``IDENTS`` of them), then
    every other member a mergeable kind of the registry names."""
    ids: list[Field] = []
    names: list[bytes] = [b"sessionUpdate", b"_meta"]

    def add(into: list[Field] | list[bytes], name: Field) -> None:
        if name not in ids and name not in names:
            into.append(name)  # type: ignore[arg-type]

    for version in SUPPORTED_VERSIONS:
        for upsert in UPSERT_KINDS[version].values():
            if upsert.key_field is not None:
                add(ids, upsert.key_field.encode())
        for chunk in CHUNK_KINDS[version].values():
            add(ids, chunk.key_field.encode())
        for snapshot in SNAPSHOT_KINDS[version].values():
            if snapshot.key_path is not None:
                outer, inner = snapshot.key_path  # (one level down: plan.planId)
                add(ids, (outer.encode(), inner.encode()))
    for version in SUPPORTED_VERSIONS:
        for upsert in UPSERT_KINDS[version].values():
            for name in upsert.fields:
                add(names, name.encode())
        for chunk in CHUNK_KINDS[version].values():
            add(names, chunk.value_field.encode())
        for snapshot in SNAPSHOT_KINDS[version].values():
            for name in snapshot.sticky:
                add(names, name.encode())
    fields = (*ids, *names)
    assert len(fields) <= OTHER_BIT
    return fields, len(ids)


FIELDS, IDENTS = _fields()


def field_table(fields: tuple[Field, ...]) -> bytes:
    """``fields`` by name, for the C scan: 64 little-endian 16-bit offsets (where the entries of
    each name length start; the 64th: where they end), then the entries, by length: the field's
    index (one byte), then its name."""
    names = [f if isinstance(f, bytes) else f[0] for f in fields]
    entries = bytearray()
    starts = []
    for length in range(64):
        starts.append(128 + len(entries))
        for i, name in enumerate(names):
            if len(name) == length:
                entries += bytes([i]) + name
    return b"".join(start.to_bytes(2, "little") for start in starts) + bytes(entries)


FIELD_TABLE: Final = field_table(FIELDS)
# Each field's name as a str, and as the bytes that start its member (``,"name":``).
FIELD_NAMES: Final = tuple((f if isinstance(f, bytes) else f[0]).decode() for f in FIELDS)
FIELD_MEMBERS: Final = tuple(b',"' + name.encode() + b'":' for name in FIELD_NAMES)


def bit(name: str) -> int:
    return 1 << FIELD_NAMES.index(name)


# -- what the bytes path does with each kind ----------------------------------------------------


class Mode(enum.Enum):
    TEXT = "text"  # bare text chunks of one message: their texts joined
    PATCH = "patch"  # v2 upserts without ``_meta``: the later members win, the others carried
    SNAPSHOT = "snapshot"  # whole snapshots: the later replaces the earlier (sticky carried)


@value
class FastKind:
    """One kind of one version the bytes path merges (one shared instance per kind)."""

    spec: Spec  # the same instance as ``classify`` gives (compared by identity)
    entity: str
    id_bit: int  # the member that names the entity (0: the session does)
    mode: Mode
    allowed: int  # TEXT, PATCH: the members a line may have to merge here (a patch's _meta
    # only as an object or null, and never two objects: those compose, which the parse does)
    sticky: int  # SNAPSHOT: members an omission keeps
    carry: bool  # SNAPSHOT: whether an omitted sticky member is carried (v2) or stops (v1)


def _id_bit(name: str | None) -> int:
    return 0 if name is None else bit(name)


def _fast_table(version: int) -> dict[str, FastKind]:
    """kind -> FastKind, for the kinds whose merge the bytes path knows (the others parse)."""
    table = table_of(version)
    assert table is not None
    sessionupdate = bit("sessionUpdate")
    out: dict[str, FastKind] = {}
    for kind, upsert in UPSERT_KINDS[version].items():
        spec = table[kind][0]
        if upsert.meta_rule is not MetaRule.PATCH or spec.cls is not Class.UPSERT:
            continue  # v1 upserts take the path that parses (their null rules)
        id_bit = _id_bit(upsert.key_field)
        allowed = sessionupdate | id_bit | bit("_meta")
        for name in upsert.fields:
            allowed |= bit(name)
        out[kind] = FastKind(spec, upsert.entity, id_bit, Mode.PATCH, allowed, 0, False)
    for kind, chunk in CHUNK_KINDS[version].items():
        spec = table[kind][0]
        if spec.cls is not Class.TEXT_CHUNK or kind in out:
            continue
        if version == 1 and kind in V1_STREAM_KINDS:
            entity, id_bit = V1_STREAM, 0  # one stream per session; the group compares ids
        else:
            entity, id_bit = chunk.entity, bit(chunk.key_field)
        allowed = sessionupdate | bit(chunk.key_field) | bit(chunk.value_field)
        out[kind] = FastKind(spec, entity, id_bit, Mode.TEXT, allowed, 0, False)
    for kind, snapshot in SNAPSHOT_KINDS[version].items():
        spec = table[kind][0]
        if kind in out:
            continue
        path = snapshot.key_path
        id_bit = 0 if path is None else bit(path[0])
        sticky = 0
        for name in snapshot.sticky:
            sticky |= bit(name)
        fast = FastKind(spec, snapshot.entity, id_bit, Mode.SNAPSHOT, 0, sticky, version != 1)
        out[kind] = fast
    return out


# The kinds of one version the bytes path merges: kind -> FastKind.
Fasts = dict[str, FastKind]
FAST_TABLES: Final[dict[int | None, Fasts]] = {v: _fast_table(v) for v in SUPPORTED_VERSIONS}


def _kinds(version: int) -> tuple[KindEntry, ...]:
    """The kinds of ``version`` as ``update_shape`` is given them."""
    return tuple(
        (kind.encode(), fast, fast.entity, fast.id_bit, fast.mode is Mode.PATCH)
        for kind, fast in FAST_TABLES[version].items()
    )


# The kinds of a version as the bytes path looks them up.
Kinds = tuple[KindEntry, ...]
KIND_TABLES: Final[dict[int | None, Kinds]] = {v: _kinds(v) for v in SUPPORTED_VERSIONS}


# -- the reference ------------------------------------------------------------------------------

_STRUCTURAL = re.compile(rb'["{}\[\]]')


def _depth(raw: bytes) -> int:
    """How deep containers nest in ``raw`` (valid JSON)."""
    deepest = depth = pos = 0
    while (m := _STRUCTURAL.search(raw, pos)) is not None:
        c = raw[m.start()]
        if c == 0x22:
            pos = rawscan.string_end(raw, m.start())
            continue
        pos = m.end()
        depth += 1 if c in b"{[" else -1
        deepest = max(deepest, depth)
    return deepest


# An object's plain members: raw key (without quotes), value start, value end.
_Members = list[tuple[bytes, int, int]]


def _plain(raw: bytes, start: int) -> tuple[_Members, int] | None:
    """The members of the object at ``raw[start]`` and where its last value ends, or ``None``
    when a key holds an escape or comes twice, or there are more than ``MAX_MEMBERS``."""
    if raw[start] != 0x7B:
        return None
    found, _close = rawscan.object_members(raw, start)
    members = [(raw[k + 1 : rawscan.string_end(raw, k) - 1], vs, ve) for _, k, vs, ve in found]
    keys = [key for key, _, _ in members]
    if any(b"\\" in key for key in keys) or len(set(keys)) != len(keys):
        return None
    if len(members) > MAX_MEMBERS:
        return None
    return members, members[-1][2] if members else -1


def _string(raw: bytes, vs: int, ve: int) -> str | None:
    if raw[vs] != 0x22:
        return None
    text = orjson.loads(raw[vs:ve])
    assert isinstance(text, str)
    return text


def update_shape_py(
    raw: bytes,
    fields: tuple[Field, ...],
    idents: int,
    table: bytes,
    kinds: tuple[KindEntry, ...],
) -> Shape | None:
    """The reference of ``update_shape`` (the module docstring): a parse, then scans. (``table``
    is ``field_table(fields)``, the C scan's lookup; the reference looks the names up itself.)"""
    if rawscan.surrogate_escape(raw) or rawscan.risky_numbers_py(raw):
        return None
    try:
        orjson.loads(raw)
        if _depth(raw) > MAX_DEPTH:
            return None
        return _shape(raw, fields, idents, kinds)
    except (orjson.JSONDecodeError, Unparseable):
        return None


def _shape(
    raw: bytes, fields: tuple[Field, ...], idents: int, kinds: tuple[KindEntry, ...]
) -> Shape | None:
    top = _plain(raw, rawscan.ws(raw, 0))
    if top is None or sorted(k for k, _, _ in top[0]) != [b"jsonrpc", b"method", b"params"]:
        return None
    at = {k: (vs, ve) for k, vs, ve in top[0]}
    if raw[slice(*at[b"jsonrpc"])] != b'"2.0"' or raw[slice(*at[b"method"])] != (
        b'"session/update"'
    ):
        return None
    params = _plain(raw, at[b"params"][0])
    if params is None or sorted(k for k, _, _ in params[0]) != [b"sessionId", b"update"]:
        return None
    at = {k: (vs, ve) for k, vs, ve in params[0]}
    session = _string(raw, *at[b"sessionId"])
    update = _plain(raw, at[b"update"][0])
    if session is None or update is None:
        return None
    names = [f if isinstance(f, bytes) else f[0] for f in fields]
    kind: bytes | None = None
    mask = nulls = objects = 0
    order, ids = bytearray(), []
    text: bytes | str | None = None
    for key, vs, ve in update[0]:
        if key not in names:
            mask |= 1 << OTHER_BIT
            continue
        index = names.index(key)
        mask |= 1 << index
        order.append(index)
        if raw[vs] == 0x6E:  # n
            nulls |= 1 << index
        elif raw[vs] == 0x7B:
            objects |= 1 << index
        if index < idents:
            ids.append(_ident(raw, fields[index], vs, ve))
        elif key == b"sessionUpdate":
            kind = raw[vs + 1 : ve - 1] if raw[vs] == 0x22 else None
        elif key == b"content" and raw[vs] == 0x7B:
            text = _text(raw, vs)
    entry = next((e for e in kinds if e[0] == kind), None)
    if kind is None or entry is None:  # (a kind spelled with an escape is never an entry's)
        return None
    _kind, fast, entity, id_bit, ordered = entry
    ident = ids[0] if len(ids) == 1 else None
    entity_key: EntityKey | None = None
    if not id_bit:
        entity_key = (entity, session)
    elif ident is not None and mask & id_bit:
        entity_key = (entity, session, ident)
    spelled = bytes(order) if ordered else None
    return (fast, entity_key, ident, mask, spelled, text, nulls, objects)


def _ident(raw: bytes, field: Field, vs: int, ve: int) -> str | None:
    if isinstance(field, bytes):
        return _string(raw, vs, ve)
    inner = _plain(raw, vs) if raw[vs] == 0x7B else None
    for key, ivs, ive in inner[0] if inner is not None else ():
        if key == field[1]:
            return _string(raw, ivs, ive)
    return None


def _text(raw: bytes, vs: int) -> bytes | str | None:
    content = _plain(raw, vs)
    if content is None or sorted(k for k, _, _ in content[0]) != [b"text", b"type"]:
        return None
    at = {k: (s, e) for k, s, e in content[0]}
    text = _string(raw, *at[b"text"])
    if raw[slice(*at[b"type"])] != b'"text"' or text is None:
        return None
    literal = raw[slice(*at[b"text"])]
    return literal[1:-1] if spelled_as_orjson(literal) else text


_ESCAPE = re.compile(rb"\\(.)", re.DOTALL)


def spelled_as_orjson(literal: bytes) -> bool:
    """Whether the valid string literal ``literal`` is spelled as orjson spells its text: no
    escape but the short ones orjson writes (``\\"``, ``\\\\``, ``\\b``, ``\\f``, ``\\n``,
    ``\\r``, ``\\t``), so that literals joined are orjson's spelling of their texts joined.
    (Conservative: orjson spells other control characters ``\\u00xx``, refused here too.)"""
    return all(m.group(1) in b'"\\bfnrt' for m in _ESCAPE.finditer(literal))


def text_of(text: bytes | str) -> str:
    """A kept text as a str (``update_shape`` keeps a literal's bytes when it can)."""
    if type(text) is str:
        return text
    decoded = orjson.loads(b'"' + text + b'"')  # type: ignore[operator]
    assert isinstance(decoded, str)
    return decoded


ShapeOf = Callable[[bytes, tuple[Field, ...], int, bytes, tuple[KindEntry, ...]], Shape | None]


def _no_shape(
    raw: bytes, fields: tuple[Field, ...], idents: int, table: bytes, kinds: tuple[KindEntry, ...]
) -> Shape | None:
    return None


_ACCELERATED: ShapeOf | None = getattr(scan.ACCELERATOR, "update_shape", None)
# The C one when the accelerator is built; without it the bytes path is off (``BYTES_PATH``).
update_shape: ShapeOf = _ACCELERATED or _no_shape
BYTES_PATH: Final = _ACCELERATED is not None


def _split_py(raw: bytes) -> list[bytes]:
    return raw.split(b"\n")


# ``raw.split(b"\n")``: in C with the accelerator (memchr finds the newlines; CPython's split
# looks at each byte, a third of a merge pass over the lines of a frame).
split_lines: Callable[[bytes], list[bytes]] = getattr(scan.ACCELERATOR, "split_lines", _split_py)
