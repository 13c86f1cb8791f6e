"""The metadata-patch algebra of ACP v2 upserts: applying and composing top-level `_meta` patches.

Contract: this module owns the RFD "v2 Metadata Patches" rule for the *top-level* `_meta` of a v2
upsert, and nothing else: which messages carry such a patch is the registry's business
(``acp_proxy.meta.registry``). Pure: no I/O, never mutates its arguments. Results may share nested
values with the inputs (values below the top level are opaque data and never modified).

The rule (RFD "What we propose to do about it"):

* omitted `_meta` leaves the stored metadata unchanged;
* `_meta: null` clears all stored metadata;
* a `_meta` object patches by top-level key: an omitted key is unchanged (so ``{}`` changes
  nothing), a key set to ``null`` is removed (removing an absent key does nothing), any other
  value replaces the stored value whole (no nested merge; a nested ``null`` is ordinary data);
* a key set to ``null`` never holds stored data, also on an entity's first update;
* stored metadata with no keys is the same as no metadata.

Stored metadata is represented as ``JsonObject | None`` where ``None`` is "no metadata"; results
are normalized: never ``{}`` and never a key holding ``null``.
"""

from __future__ import annotations

from typing import TypeAlias

from acp_proxy.base.jsontypes import OMITTED, Field, JsonObject, Omitted

# A top-level `_meta` patch: omitted, null (clear), or an object (key-wise patch).
MetaPatch: TypeAlias = Omitted | JsonObject | None


def as_patch(value: Field) -> MetaPatch:
    """Read a raw `_meta` field value as a patch.

    Rule: ``OMITTED`` stays omitted, ``None`` is a clear, an object is a key-wise patch, and any
    other JSON value (string, number, boolean, array) is treated as omitted, as the official
    SDKs do (they deserialize `_meta` with default-on-error: ``x-deserialize-default-on-error``).
    """
    if value is OMITTED or value is None or isinstance(value, dict):
        return value
    return OMITTED


def normalize_stored(stored: JsonObject | None) -> JsonObject | None:
    """Normalize stored metadata: drop keys holding ``null`` and map ``{}`` to ``None``.

    RFD: "A key set to `null` never holds stored data" and "Stored metadata with no keys is the
    same as no metadata". Always returns a new top-level dict (or ``None``).
    """
    if stored is None:
        return None
    kept: JsonObject = {k: v for k, v in stored.items() if v is not None}
    return kept or None


def apply_meta_update(stored: JsonObject | None, update: Field) -> JsonObject | None:
    """Apply one top-level `_meta` patch to an entity's stored metadata (the RFD rule exactly).

    ``stored`` is ``None`` for "no metadata". ``update`` is the raw `_meta` field of the upsert
    (``OMITTED`` when absent); a non-object, non-null value counts as omitted (``as_patch``).
    Omitted leaves ``stored`` unchanged, ``None`` clears it, an object patches it key by key.
    The result is normalized (never ``{}``, never a ``null``-valued key) and never aliases
    ``stored``'s top-level dict.
    """
    patch = as_patch(update)
    if patch is OMITTED:
        return normalize_stored(stored)
    if patch is None:
        return None
    result: JsonObject = dict(stored) if stored is not None else {}
    for key, value in patch.items():
        if value is None:
            # RFD: "A key set to null is removed. Removing a key that is not stored does nothing."
            result.pop(key, None)
        else:
            # RFD: "Any other value replaces that key's stored value whole. Clients MUST NOT merge
            # nested objects, and a null nested inside the value is ordinary data."
            result[key] = value
    return normalize_stored(result)


def apply_meta_patches(stored: JsonObject | None, patches: tuple[Field, ...]) -> JsonObject | None:
    """Apply ``patches`` in order (``apply_meta_update`` folded left)."""
    result = normalize_stored(stored)
    for patch in patches:
        result = apply_meta_update(result, patch)
    return result


def compose(a: Field, b: Field) -> tuple[MetaPatch, ...]:
    """The shortest patch sequence equal to applying ``a`` then ``b``, for every stored state.

    Rules (RFD "Replay and resynchronization": intermediaries that combine updates MUST keep
    removals and clears):

    * ``b`` omitted: ``(a,)``; ``a`` omitted: ``(b,)``;
    * ``b`` null: ``(None,)`` (anything followed by a clear is a clear);
    * both objects: one object, key-wise, the later value winning and **its nulls kept** (they
      remove keys ``a`` did not mention but the client may hold);
    * ``a`` null, ``b`` an object: cannot be one patch, so ``(None, b')`` where ``b'`` is ``b``
      without its null keys (after a clear they remove nothing); just ``(None,)`` when ``b'`` is
      empty.

    Non-object, non-null inputs count as omitted (``as_patch``). Inputs are never mutated.
    """
    pa, pb = as_patch(a), as_patch(b)
    if pb is OMITTED:
        return (pa,)
    if pb is None:
        return (None,)
    if pa is OMITTED:
        return (pb,)
    if pa is None:
        # RFD: "Replacing a clear followed by an object with just that object is wrong when
        # earlier metadata may exist."
        rest: JsonObject = {k: v for k, v in pb.items() if v is not None}
        return (None, rest) if rest else (None,)
    return ({**pa, **pb},)
