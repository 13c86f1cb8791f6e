"""Lossless rewriting: a changed JSON value written into a frame's bytes by splicing.

Contract: ``splice(raw, old, new)`` re-encodes the value ``new`` that a middleware made from
``old`` (the parse of ``raw``) by walking both: a member or element whose value is the same
object (or JSON-equal) keeps its exact bytes, with its key's spelling and the whitespace around
it; only a changed scalar, or a member that is new, is encoded (``rawjson.encode_value``).
Removed members go with their separators; members a middleware added go last. A frame's
untouched numbers, of any size or spelling, and its string escapes therefore survive any
rewrite. ``splice_member`` does the same for one member at a known path, scanning only the
objects on the way (the fused annotation path; in C with the accelerator). Never does I/O;
raises ``rawjson.Unencodable`` for a changed value that is not JSON and ``rawjson.Unparseable``
when ``raw`` is not the parsed frame (a repeated key whose copies differ).
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.wire.raw import block_scan
from acp_proxy.wire.raw.rawjson import Unencodable, Unparseable, encode_value, json_equal
from acp_proxy.wire.raw.rawscan import (
    WS_BYTES,
    key_text,
    object_members,
    string_end,
    value_end,
    ws,
)

_QUOTE, _LBRACE, _RBRACE, _RBRACKET, _COMMA, _COLON = b'"{}],:'

# The C accelerator's functions (``acp_proxy/wire/raw/_scan.c``), ``None`` without it.
_member_span_c: Callable[[bytes, tuple[bytes, ...], bytes], tuple[int, ...] | None] | None
_member_span_c = getattr(block_scan.ACCELERATOR, "member_span", None)
_splice_member_c: Callable[..., bytes | None] | None = getattr(
    block_scan.ACCELERATOR, "splice_member", None
)


def splice(raw: bytes, old: JsonValue, new: JsonValue) -> bytes:
    """``new`` encoded with every part it shares with ``old`` (the parse of ``raw``) kept as
    ``raw``'s exact bytes (rule 2). Raises ``Unencodable`` for a changed value that is not JSON.

    One pass: each byte of ``raw`` is looked at once at most, and the members after the last
    one that changed are copied without a look.
    """
    start = ws(raw, 0)
    splicer = _Splicer(raw)
    end = splicer.value(start, old, new)
    view = memoryview(raw)
    return b"".join((view[:start], *splicer.out, view[end:]))


def member_span_py(
    raw: bytes, path: tuple[bytes, ...], key: bytes
) -> tuple[int, int, int, int, int] | None:
    """Where member ``key`` of the object at ``path`` sits in the parsed frame ``raw``: the
    reference of the C accelerator's ``member_span`` (``acp_proxy/wire/raw/_scan.c``), which must
    answer exactly this (tests/wire/raw/test_rawjson.py compares them).

    ``(start, close, vs, ve, last_end)``: the object's ``{`` and ``}``, the span of ``key``'s
    value (``-1, -1`` when absent) and the end of the object's last member value (``-1`` when
    it is empty). Keys and path steps are compared as raw bytes. ``None`` when an object on the
    way (the top level included) is not there, a key in one of them has an escape, or a step
    or ``key`` occurs twice in its object: ``splice_member`` then takes its full path.
    """
    i = ws(raw, 0)
    want = (*path, key)
    start = close = vs = ve = last = -1
    for depth, name in enumerate(want):
        if i >= len(raw) or raw[i] != _LBRACE:
            return None
        try:
            members, close = object_members(raw, i)
        except Unparseable:
            return None
        start, vs, ve, last = i, -1, -1, -1
        for _key_text, ks, mvs, mve in members:
            kend = string_end(raw, ks)
            body = raw[ks + 1 : kend - 1]
            if b"\\" in body:
                return None
            if body == name:
                if vs >= 0:
                    return None
                vs, ve = mvs, mve
            last = mve
        if depth < len(path):
            if vs < 0:
                return None
            i = vs
    return start, close, vs, ve, last


def member_span(
    raw: bytes, path: tuple[bytes, ...], key: bytes
) -> tuple[int, int, int, int, int] | None:
    """``member_span_py``, in C when the accelerator is there (the proxy-chain envelopes take
    their members apart with it: ``wire.conductor.envelope``)."""
    if _member_span_c is not None:
        return _member_span_c(raw, path, key)  # type: ignore[return-value]
    return member_span_py(raw, path, key)


def splice_member(
    raw: bytes, path: tuple[str, ...], key: str, old: object, new: JsonValue, *, present: bool
) -> bytes:
    """``raw`` with member ``key`` of the object at ``path`` (keys from the top-level object) set
    to ``new``: the bytes ``splice`` gives when that member is the only change.

    ``old`` is the member's parsed value when ``present``; it is spliced like ``splice`` does
    (an object keeps its unchanged members' bytes). An absent member is added last, as
    ``splice`` adds it. Only the objects on ``path`` are scanned, and nothing is built but the
    member's new bytes. Raises ``Unparseable`` when a key on the way, or ``key`` itself, occurs
    more than once (the caller takes the general path) and ``Unencodable`` for a ``new`` that is
    not JSON. With the C accelerator, the objects are located in C (``member_span``) and only
    unusual frames (escaped keys, repeated keys) take the Python block_scan.
    """
    if _member_span_c is not None and _splice_member_c is not None:
        # (The caches' ``get`` first: a C call instead of a Python one per frame.)
        key_bytes, member_key = _KEYS.get(key) or _key_forms(key)
        path_bytes = _PATHS.get(path) or _path_bytes(path)
        # The common cases in one C call: an absent member added, or a present one whose bytes
        # are exactly orjson's for ``old`` and that ``new`` extends (``splice_value``'s
        # shortcut). The C function checks the frame against that and answers None otherwise.
        expect: bytes | None = None
        if present and type(old) is dict and type(new) is dict and appends_only(old, new):
            try:
                expect = orjson.dumps(old)
            except TypeError:  # an integer beyond 64 bits or a lone surrogate
                expect = None
        if not present or expect is not None:
            try:
                value = encode_value(new)
            except Unencodable:  # raised below if it matters (an unchanged NaN member does not)
                value = None
            if value is not None:
                out = _splice_member_c(raw, path_bytes, key_bytes, member_key, value, expect)
                if out is not None:
                    return out
        span = _member_span_c(raw, path_bytes, key_bytes)
        # (A span that disagrees with ``present`` is left to the Python path, which decodes
        # the keys: it raises if the frame really is not the parsed one.)
        if span is not None and (span[2] >= 0) == present:
            start, _close, vs, ve, last_end = span
            if vs >= 0:
                return splice_value(raw, vs, old, new, ve)
            member = member_key + encode_value(new)
            if last_end < 0:
                return joined(raw, start + 1, member, start + 1)
            return joined(raw, last_end, b"," + member, last_end)
    return _splice_member_py(raw, path, key, old, new, present=present)


def splice_value(raw: bytes, vs: int, old: object, new: JsonValue, ve: int = -1) -> bytes:
    """``raw`` with the value at ``raw[vs]`` (parsed: ``old``; ends at ``ve`` when known)
    written as ``new`` by ``_Splicer``, which copies what ``new`` shares with ``old``.

    Shortcut: when ``old`` is an object whose bytes are exactly what orjson writes
    for it and ``new`` keeps its members in their order, adds members only at the end and
    changes no member from one container to another of the same kind (where the splicer would
    recurse and keep the old member order), the splice is ``new`` encoded whole: one C call
    instead of a Python scan of the old object.
    """
    if ve >= 0 and type(old) is dict and type(new) is dict and appends_only(old, new):
        try:
            canonical = orjson.dumps(old) == raw[vs:ve]
        except TypeError:  # an integer beyond 64 bits or a lone surrogate
            canonical = False
        if canonical:
            return joined(raw, vs, encode_value(new), ve)
    splicer = _Splicer(raw)
    end = splicer.value(vs, old, new)
    view = memoryview(raw)
    return b"".join((view[:vs], *splicer.out, view[end:]))


def appends_only(old: JsonObject, new: JsonObject) -> bool:
    """``new`` has ``old``'s keys first, in their order, and no member that went from a
    container to another of its kind (see ``splice_value``)."""
    if len(new) < len(old):
        return False
    for (k_old, v_old), (k_new, v_new) in zip(old.items(), new.items(), strict=False):
        if k_old != k_new:
            return False
        if v_new is not v_old and type(v_new) in _CONTAINERS and type(v_new) is type(v_old):
            return False
    return True


_CONTAINERS = (dict, list)
_PATHS: dict[tuple[str, ...], tuple[bytes, ...]] = {}


def _path_bytes(path: tuple[str, ...]) -> tuple[bytes, ...]:
    got = _PATHS.get(path)
    if got is None:
        got = tuple(step.encode() for step in path)
        if len(_PATHS) < 64:  # the fused path uses two; any other caller stays bounded
            _PATHS[path] = got
    return got


_KEYS: dict[str, tuple[bytes, bytes]] = {}


def _key_forms(key: str) -> tuple[bytes, bytes]:
    """``key`` as raw UTF-8 (what ``member_span`` compares) and as a member's ``"key":``."""
    got = _KEYS.get(key)
    if got is None:
        got = (key.encode("utf-8", "surrogatepass"), encode_value(key) + b":")
        if len(_KEYS) < 64:  # the fused path uses one; any other caller stays bounded
            _KEYS[key] = got
    return got


def _splice_member_py(
    raw: bytes, path: tuple[str, ...], key: str, old: object, new: JsonValue, *, present: bool
) -> bytes:
    """``splice_member`` without the accelerator (and for what ``member_span`` leaves)."""
    s = ws(raw, 0)
    for step in path:  # down to the object holding ``key``, never scanning the way twice
        s = _member_start(raw, s, step)
    if raw[s] != _LBRACE:
        raise Unparseable(f"no object at byte {s}")
    members, close = object_members(raw, s)
    hits = [m for m in members if m[0] == key]
    if len(hits) > 1 or bool(hits) != present:
        raise Unparseable(f"{len(hits)} members {key!r}")
    # A key on the way given twice: the parse kept the last one, which may not be this one.
    end = close + 1
    for step in reversed(path):
        end = _no_more(raw, end, step)
    if hits:
        return splice_value(raw, hits[0][2], old, new)
    member = encode_value(key) + b":" + encode_value(new)
    if not members:
        return joined(raw, s + 1, member, s + 1)
    last_end = members[-1][3]
    return joined(raw, last_end, b"," + member, last_end)


def joined(raw: bytes, cut: int, middle: bytes, resume: int) -> bytes:
    """``raw[:cut] + middle + raw[resume:]`` in one copy: ``a + b + c`` on a 10 MiB frame holds
    two 10 MiB intermediates at once, which showed in the peak RSS of a big annotated frame."""
    view = memoryview(raw)
    return b"".join((view[:cut], middle, view[resume:]))


def _member_start(raw: bytes, s: int, key: str) -> int:
    """Where the value of the first member ``key`` of the object at ``raw[s]`` starts."""
    if raw[s] != _LBRACE:
        raise Unparseable(f"no object at byte {s}")
    j = ws(raw, s + 1)
    while raw[j] == _QUOTE:
        kend = string_end(raw, j)
        c = ws(raw, kend)
        if raw[c] != _COLON:
            raise Unparseable(f"no colon at byte {c}")
        vs = ws(raw, c + 1)
        if key_text(raw, j, kend) == key:
            return vs
        j = ws(raw, value_end(raw, vs))
        if raw[j] == _COMMA:
            j = ws(raw, j + 1)
    raise Unparseable(f"no member {key!r} in the object at byte {s}")


def _no_more(raw: bytes, i: int, key: str) -> int:
    """Past the rest of an object whose member value ended at ``i``: the offset after its
    ``}``. Raises ``Unparseable`` when a later member is ``key`` again."""
    j = ws(raw, i)
    while raw[j] == _COMMA:
        j = ws(raw, j + 1)
        kend = string_end(raw, j)
        if key_text(raw, j, kend) == key:
            raise Unparseable(f"member {key!r} repeated at byte {j}")
        c = ws(raw, kend)
        if raw[c] != _COLON:
            raise Unparseable(f"no colon at byte {c}")
        j = ws(raw, value_end(raw, ws(raw, c + 1)))
    if raw[j] != _RBRACE:
        raise Unparseable(f"unexpected byte at {j}")
    return j + 1


# How deep the splice walks into changed containers; below that, a container is compared whole
# (``json_equal``, iterative) and copied or encoded. A peer's value may be nested 1024 levels
# deep (orjson's limit), past Python's recursion limit.
_MAX_SPLICE_DEPTH = 64


class _Splicer:
    """Writes ``new`` into ``out``, copying from ``raw`` every part ``new`` shares with ``old``."""

    __slots__ = ("depth", "out", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.out: list[bytes] = []
        self.depth = 0

    def value(self, s: int, old: object, new: object) -> int:
        """Write the value at ``raw[s]`` as ``new``; return the offset just past it in ``raw``."""
        raw = self.raw
        if new is not old:
            tn = type(new)
            if self.depth < _MAX_SPLICE_DEPTH:
                self.depth += 1
                try:
                    if tn is dict and type(old) is dict:
                        return self.object(s, old, new)  # type: ignore[arg-type]
                    if tn is list and type(old) is list and len(new) == len(old):  # type: ignore[arg-type]
                        return self.array(s, old, new)  # type: ignore[arg-type]
                finally:
                    self.depth -= 1
            if not json_equal(old, new):
                self.out.append(encode_value(new))
                return value_end(raw, s)
        e = value_end(raw, s)
        self.out.append(raw[s:e])
        return e

    def object(self, s: int, old: JsonObject, new: JsonObject) -> int:
        raw, out = self.raw, self.out
        # Only the members in ``todo`` (changed or removed) are more than copied.
        todo = {k for k, v in new.items() if k in old and old[k] is not v}
        todo.update(k for k in old if k not in new)
        added = [k for k in new if k not in old]
        out.append(b"{")
        j = ws(raw, s + 1)
        if raw[j] == _RBRACE:  # ``{}`` or ``{ }``
            self._add(added, new, first=True)
            out.append(raw[s + 1 : j + 1])
            return j + 1
        lead = raw[s + 1 : j]  # the whitespace after ``{``
        first = True  # no member written yet
        last_written = False  # the member scanned before this one was written
        ve = j
        while True:
            ks = j
            if raw[ks] != _QUOTE:
                raise Unparseable(f"no key at byte {ks}")
            kend = string_end(raw, ks)
            c = kend if raw[kend] == _COLON else ws(raw, kend)
            if raw[c] != _COLON:
                raise Unparseable(f"no colon at byte {c}")
            vs = c + 1
            if raw[vs] in WS_BYTES:
                vs = ws(raw, vs)
            key = key_text(raw, ks, kend) if todo else ""
            if key in todo and key not in new:  # removed, with its separator
                ve = value_end(raw, vs)
                last_written = False
            else:
                if first:
                    out.append(lead)
                elif last_written:
                    out.append(raw[ve:ks])  # the original separator and whitespace
                else:
                    out.append(b",")
                if key in todo:
                    out.append(raw[ks:vs])
                    ve = self.value(vs, old[key], new[key])
                else:
                    ve = string_end(raw, vs) if raw[vs] == _QUOTE else value_end(raw, vs)
                    out.append(raw[ks:ve])
                first = False
                last_written = True
            j = ve if raw[ve] not in WS_BYTES else ws(raw, ve)
            if raw[j] == _COMMA:
                j += 1
                if raw[j] in WS_BYTES:
                    j = ws(raw, j)
                continue
            if raw[j] != _RBRACE:
                raise Unparseable(f"unexpected byte at {j}")
            self._add(added, new, first=first)
            out.append(raw[ve : j + 1])  # the whitespace before ``}``, and the brace
            return j + 1

    def _add(self, added: list[str], new: JsonObject, *, first: bool) -> None:
        out = self.out
        for key in added:
            if not first:
                out.append(b",")
            out.append(encode_value(key))
            out.append(b":")
            out.append(encode_value(new[key]))
            first = False

    def array(self, s: int, old: list[JsonValue], new: list[JsonValue]) -> int:
        raw, out = self.raw, self.out
        j = ws(raw, s + 1)
        if raw[j] == _RBRACKET:
            out.append(raw[s : j + 1])
            return j + 1
        out.append(raw[s:j])
        n = 0
        while True:
            if n >= len(old):  # only with a repeated key whose copies differ
                raise Unparseable(f"array at byte {s} is not the parsed one")
            e = self.value(j, old[n], new[n])
            n += 1
            k = ws(raw, e)
            if raw[k] == _COMMA:
                j = ws(raw, k + 1)
                out.append(raw[e:j])
                continue
            if raw[k] != _RBRACKET:
                raise Unparseable(f"unexpected byte at {k}")
            out.append(raw[e : k + 1])
            return k + 1
