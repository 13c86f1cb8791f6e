"""Combining two consecutive updates of one entity into as few updates as possible, exactly.

Contract: this module owns when and how two `session/update` ``update`` objects of the same entity
and kind can be replaced by fewer updates with the same effect on every client state. It never
decides *whether* to coalesce (the outbound queue does) and never mutates its arguments: results
are new dicts, or the inputs themselves when nothing is combined. Pure: no I/O.

Precondition for every function: no other message about the same entity travels between the two
updates (a chunk appended in between would change the meaning of a combined ``content``).
"""

from __future__ import annotations

from acp_proxy.base.jsontypes import OMITTED, JsonObject
from acp_proxy.meta.patch import compose
from acp_proxy.meta.registry import SNAPSHOT_KINDS, UPSERT_KINDS, MetaRule, SnapshotKind, UpsertKind

META = "_meta"
KIND = "sessionUpdate"


def _same_upsert_entity(spec: UpsertKind, u1: JsonObject, u2: JsonObject) -> bool:
    if spec.key_field is None:
        return True  # keyed by params.sessionId: the caller compares sessions
    key = u1.get(spec.key_field)
    return isinstance(key, str) and u2.get(spec.key_field) == key


def _only_known_keys(spec: UpsertKind, update: JsonObject) -> bool:
    known = {KIND, META, *spec.fields}
    if spec.key_field is not None:
        known.add(spec.key_field)
    return all(key in known for key in update)


def _merge_v2_upsert(spec: UpsertKind, u1: JsonObject, u2: JsonObject) -> tuple[JsonObject, ...]:
    m1, m2 = u1.get(META, OMITTED), u2.get(META, OMITTED)
    for m in (m1, m2):
        if not (m is OMITTED or m is None or isinstance(m, dict)):
            return (u1, u2)  # a malformed `_meta` is forwarded as sent, never rewritten
    # Every v2 field is three-state: omitted keeps, null clears, a value replaces (for
    # collections `[]` clears like null). So the later update's present fields win as sent.
    merged: JsonObject = {**u1, **u2}
    patches = compose(m1, m2)
    if len(patches) == 1:
        (patch,) = patches
        if isinstance(patch, dict) or patch is None:
            merged[META] = patch
        else:
            merged.pop(META, None)  # both omitted
        return (merged,)
    # RFD "Replay and resynchronization": a clear followed by an object cannot be one update,
    # and dropping the clear would keep stale keys. Send the clear with every field, then the
    # object in an update carrying only the entity key and the schema-required fields
    # (re-sending a required field's final value is idempotent).
    obj = patches[1]
    assert isinstance(obj, dict)  # compose's only two-patch result is (None, object)
    merged[META] = None
    follow: JsonObject = {KIND: spec.kind}
    follow.update({f: merged[f] for f in spec.required if f in merged})
    follow[META] = obj
    return (merged, follow)


def _merge_v1_upsert(spec: UpsertKind, u1: JsonObject, u2: JsonObject) -> tuple[JsonObject, ...]:
    # v1 defines no rule for `_meta` (the RFD's Compatibility section) and for some fields a
    # `null` means "unchanged" (v1 ToolCallUpdate.name) while for others it clears. Merge only
    # when the result is the same under every such reading:
    # - at most one of the two carries `_meta` (then that one `_meta` is sent once, as is);
    # - no field set to null in u2 that u1 set (null-keeps and null-clears would differ).
    if META in u1 and META in u2:
        return (u1, u2)
    for field in spec.fields:
        if u2.get(field, OMITTED) is None and u1.get(field) is not None:
            return (u1, u2)
    return ({**u1, **u2},)


def _merge_snapshot(
    snap: SnapshotKind, u1: JsonObject, u2: JsonObject, version: int
) -> tuple[JsonObject, ...]:
    if snap.key_path is not None:
        k1: object = u1
        k2: object = u2
        for step in snap.key_path:
            k1 = k1.get(step) if isinstance(k1, dict) else None
            k2 = k2.get(step) if isinstance(k2, dict) else None
        if not isinstance(k1, str) or k1 != k2:
            return (u1, u2)
    missing = [f for f in snap.sticky if f in u1 and f not in u2]
    if not missing:
        return (u2,)
    if version == 1:
        return (u1, u2)  # v1 gives omission no meaning: keeping u1's value may be wrong
    # v2 usage_update.cost: "Omitted leaves the last reported cost unchanged".
    merged: JsonObject = dict(u2)
    merged.update({f: u1[f] for f in missing})
    return (merged,)


def merge_updates(u1: JsonObject, u2: JsonObject, version: int) -> tuple[JsonObject, ...]:
    """Updates equivalent to ``u1`` then ``u2`` (two ``params.update`` objects), for every state.

    Returns one update when the pair can be combined exactly, two otherwise. The caller checks
    that both come from the same session (``params.sessionId``): kinds keyed by the session
    (``session_info_update``, per-session snapshots) carry no id inside the update. Rules:

    * different or unknown kinds, different entities, keys the registry does not know for the
      kind, a malformed `_meta`, or an unknown ``version``: ``(u1, u2)`` unchanged;
    * v2 upserts: every field is three-state (omitted keeps u1's, ``null`` clears, a value
      replaces; for collections ``[]`` clears like ``null``), so u2's present fields win; `_meta`
      is ``compose(u1._meta, u2._meta)``. A clear followed by an object stays two updates: u1∘u2's
      fields with ``_meta: null``, then the entity key, the schema-required fields and the object
      (its null keys dropped);
    * whole snapshots (plan_update per plan, state/usage/commands/config per session): ``(u2,)``,
      with v2 ``usage_update.cost`` carried over from u1 when u2 omits it;
    * v1: no patch rule, so only merges that are exact for every v1 reading (see
      ``registry.MetaRule.REPLACE``): at most one of the two carries `_meta`, and u2 sets no field
      to ``null`` that u1 set. v1 ``tool_call`` (creation) is never merged. Otherwise ``(u1, u2)``.
    """
    kind = u1.get(KIND)
    if not isinstance(kind, str) or u2.get(KIND) != kind or version not in UPSERT_KINDS:
        return (u1, u2)
    spec = UPSERT_KINDS[version].get(kind)
    if spec is not None:
        if not (
            _same_upsert_entity(spec, u1, u2)
            and _only_known_keys(spec, u1)
            and _only_known_keys(spec, u2)
        ):
            return (u1, u2)
        if spec.meta_rule is MetaRule.PATCH:
            return _merge_v2_upsert(spec, u1, u2)
        if spec.meta_rule is MetaRule.REPLACE:
            return _merge_v1_upsert(spec, u1, u2)
        return (u1, u2)  # v1 tool_call creates the entity: two creations are not one
    snap = SNAPSHOT_KINDS[version].get(kind)
    if snap is not None:
        return _merge_snapshot(snap, u1, u2, version)
    return (u1, u2)
