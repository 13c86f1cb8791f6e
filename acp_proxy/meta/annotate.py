"""Stateless annotation of ACP upserts: set and remove namespaced `_meta` keys on entities.

Contract: owns how the proxy adds or removes keys of an entity's metadata without knowing what
the client holds (RFD Metadata Patches, "Shiny future": proxies annotate without tracking entity
state), and the v1 policy where no patch rule exists. Pure: no I/O, no logging; never mutates a
message or the annotation (results are new dicts that may share nested values with them).

The annotation law (v2): for every stored state and every upsert, applying the annotated
message(s) leaves every key the annotation does not name exactly as applying the original would,
the ``set`` keys holding their values (or the update's own value for a key the update itself
carries, unless ``overwrite``) and the ``remove`` keys gone. All other entity fields end as the
original leaves them. Never a new top-level key other than `_meta` (the official SDKs silently
drop unknown keys), never a JSON-RPC batch (the TypeScript SDK rejects batches; the Python SDK
drops its connection on one): a follow-up is a separate message, sent right after.

v1 (no patch rule; registry ``MetaRule``): ``V1Mode.SAFE`` annotates only an update that already
carries a `_meta` object (the receiver replaces its metadata with that object anyway) or creates
the entity (v1 ``tool_call``), and reports the rest ``SKIPPED_V1_UNSAFE``. ``V1Mode.STATEFUL``
keeps each entity's metadata as the client holds it in a bounded ``V1MetaStore`` and sends the
complete merged object (RFD Compatibility: "A stateful adapter can keep the merged metadata for
each entity and send the complete merged object"); entities it does not know (never seen or
evicted) are skipped like in safe mode. ``V1Mode.OFF`` never annotates v1.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from acp_proxy.base.jsontypes import OMITTED, Field, JsonObject, JsonValue, Omitted
from acp_proxy.meta import registry
from acp_proxy.meta.patch import as_patch
from acp_proxy.meta.registry import (
    REQUEST_PERMISSION,
    SESSION_UPDATE,
    SUPPORTED_VERSIONS,
    UPSERT_KINDS,
    EntityKey,
    MetaRule,
    UpsertSite,
    find_upsert,
)

# Defined with the registry (Config names its default without importing this module); its
# public home stays here.
V1Mode = registry.V1Mode

META = "_meta"


@dataclass(frozen=True, slots=True)
class Annotation:
    """Keys to hold on an entity's metadata (``set``) and keys to remove (``remove``).

    A ``set`` value of ``None`` is a removal (``null`` is the removal signal, RFD: "A key set to
    null never holds stored data"); a key both set and removed is removed.
    """

    set: Mapping[str, JsonValue] = field(default_factory=dict)
    remove: tuple[str, ...] = ()
    # When the update itself already sets a key of ``set``: keep the update's value (False) or
    # replace it with the rule's value (True). Removals always apply.
    overwrite: bool = False
    # ``(keys to set, keys to remove)`` normalized once (``_split``): annotations are built once
    # per rule and applied per message. An Annotation is a value: do not mutate ``set`` later.
    split: tuple[JsonObject, tuple[str, ...]] = field(
        init=False, repr=False, compare=False, default=({}, ())
    )

    def __post_init__(self) -> None:
        sets, removes = _split(self.set, self.remove)
        object.__setattr__(self, "split", (sets, tuple(removes)))


class AnnotateStatus(enum.StrEnum):
    APPLIED = "applied"  # messages differ from the input
    UNCHANGED = "unchanged"  # an upsert, but the annotation was already satisfied by the update
    NOT_UPSERT = "not_upsert"  # the message carries no patch `_meta` (left as is)
    SKIPPED_V1_UNSAFE = "skipped_v1_unsafe"  # v1: annotating would erase agent metadata
    UNKNOWN_VERSION = "unknown_version"  # the protocol version is not known yet
    V1_OFF = "v1_off"  # a v1 upsert, but v1 annotation is turned off (V1Mode.OFF)


@dataclass(frozen=True, slots=True)
class AnnotateResult:
    """The messages to send in place of the input (``(message,)`` when nothing changed)."""

    messages: tuple[JsonObject, ...]
    status: AnnotateStatus


class V1MetaStore:
    """Bounded LRU of each v1 entity's metadata as the client holds it, for ``V1Mode.STATEFUL``.

    It follows the v1 receiver model of ``acp_proxy.meta.registry`` (object replaces whole, ``null``
    clears, omission keeps; ``tool_call`` creates). ``annotate_message`` in stateful mode records
    every v1 upsert it is given (its output, annotated or not). A caller must also ``observe``
    every other v1 message it forwards to the client (for example upserts no rule matched), or
    the store goes stale. ``observe`` is idempotent, so observing a message twice is harmless.
    When more than ``max_entities`` entities are known, the least recently used is forgotten;
    a forgotten entity is unknown again and is then skipped rather than guessed.
    """

    __slots__ = ("_entries", "max_entities")

    def __init__(self, max_entities: int = 10_000) -> None:
        if max_entities < 1:
            raise ValueError(f"max_entities must be at least 1, got {max_entities}")
        self.max_entities = max_entities
        self._entries: OrderedDict[EntityKey, JsonObject | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: EntityKey) -> JsonObject | Omitted | None:
        """The client's metadata for ``key`` (``None``: none), or ``OMITTED`` when unknown."""
        if key not in self._entries:
            return OMITTED
        self._entries.move_to_end(key)
        return self._entries[key]

    def record(self, key: EntityKey, meta: JsonObject | None) -> None:
        """Remember that the client holds ``meta`` for ``key`` (most recently used)."""
        self._entries[key] = meta
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entities:
            self._entries.popitem(last=False)

    def observe(self, message: JsonObject) -> None:
        """Update the store from one v1 message forwarded to the client (non-upserts: no-op)."""
        site = find_upsert(message, 1)
        if site is None:
            return
        raw = site.obj.get(META, OMITTED)
        if site.meta_rule is MetaRule.CREATE:
            self.record(site.entity, dict(raw) or None if isinstance(raw, dict) else None)
        elif isinstance(raw, dict):
            self.record(site.entity, dict(raw) or None)
        elif raw is None:
            self.record(site.entity, None)
        elif site.entity in self._entries:
            self._entries.move_to_end(site.entity)


def _same(a: JsonValue, b: JsonValue) -> bool:
    """JSON equality that tells ``1``, ``1.0`` and ``True`` apart (they differ on the wire)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _split(set_: Mapping[str, JsonValue], remove: Iterable[str]) -> tuple[JsonObject, list[str]]:
    """Normalize an annotation: ``(keys to set, keys to remove)``; removal wins over set."""
    removes = list(dict.fromkeys([*remove, *(k for k, v in set_.items() if v is None)]))
    sets: JsonObject = {k: v for k, v in set_.items() if v is not None and k not in removes}
    return sets, removes


def followup_fields(kind: str) -> tuple[str, ...]:
    """The fields a follow-up update of v2 upsert ``kind`` copies: sessionUpdate + required."""
    return ("sessionUpdate", *UPSERT_KINDS[2][kind].required)


def annotate(
    update: JsonObject,
    *,
    set: Mapping[str, JsonValue] | None = None,
    remove: Iterable[str] = (),
    overwrite: bool = False,
    carry: Sequence[str] | None = None,
) -> tuple[JsonObject, ...]:
    """The v2 upsert(s) to send instead of ``update`` so the client holds the annotation.

    Rules (``update`` is the object whose top-level `_meta` is the patch):

    * `_meta` omitted (or not an object/null, which SDKs read as omitted): one update with
      ``_meta = {set..., removed: null}``;
    * an object: the ``set`` keys added (a key the object already carries is kept unless
      ``overwrite``), the ``remove`` keys set to ``null``;
    * ``null``: the clear must survive (never turned into an object), so ``(update, follow_up)``
      where the follow-up carries only ``carry`` fields copied from ``update`` and
      ``_meta = {set...}`` (after a clear, removals are already satisfied and dropped). ``carry``
      defaults to ``followup_fields(update["sessionUpdate"])``: sessionUpdate, the entity key and
      the schema-required fields, re-sent with the same values (idempotent).

    Returns ``(update,)`` itself when nothing needs to change. Raises ``ValueError`` when a
    follow-up is needed, ``carry`` is ``None`` and the update is no known v2 upsert kind.
    """
    sets, removes = _split(set or {}, remove)
    return _annotate_split(update, sets, removes, overwrite, carry)


def _annotate_split(
    update: JsonObject,
    sets: JsonObject,
    removes: Sequence[str],
    overwrite: bool,
    carry: Sequence[str] | None,
) -> tuple[JsonObject, ...]:
    """``annotate`` with the annotation already normalized by ``_split``."""
    patch = as_patch(update.get(META, OMITTED))
    if patch is None:
        if not sets:
            return (update,)  # the clear already removes every key
        if carry is None:
            kind = update.get("sessionUpdate")
            if not isinstance(kind, str) or kind not in UPSERT_KINDS[2]:
                raise ValueError(f"no follow-up fields known for update kind {kind!r}")
            carry = followup_fields(kind)
        follow: JsonObject = {f: update[f] for f in carry if f in update}
        follow[META] = dict(sets)  # a fresh object per message: sets is shared by the rule
        return (update, follow)
    if not sets and not removes:
        return (update,)
    if patch is OMITTED:
        # RFD "Status quo": adding a key to an update without `_meta` must not turn "unchanged"
        # into "replace"; under the patch rule the added keys touch nothing else.
        meta: JsonObject = {**sets, **dict.fromkeys(removes)}
        return ({**update, META: meta},)
    new = dict(patch)
    changed = False
    for key, value in sets.items():
        if key not in patch or (overwrite and not _same(patch[key], value)):
            new[key] = value
            changed = True
    for key in removes:
        if key not in patch or patch[key] is not None:
            new[key] = None
            changed = True
    return ({**update, META: new},) if changed else (update,)


def _replace_at(message: JsonObject, path: tuple[str, ...], obj: JsonObject) -> JsonObject:
    """A copy of ``message`` with the object at ``path`` replaced (only that path is copied)."""
    if not path:
        return obj
    child = message[path[0]]
    assert isinstance(child, dict)
    return {**message, path[0]: _replace_at(child, path[1:], obj)}


def _annotate_v2(message: JsonObject, site: UpsertSite, annotation: Annotation) -> AnnotateResult:
    if site.method == REQUEST_PERMISSION:
        carry: tuple[str, ...] = site.spec.required  # ("toolCallId",)
    else:
        carry = followup_fields(site.kind)
    sets, removes = annotation.split
    outs = _annotate_split(site.obj, sets, removes, annotation.overwrite, carry)
    if len(outs) == 1 and outs[0] is site.obj:
        return AnnotateResult((message,), AnnotateStatus.UNCHANGED)
    first = message if outs[0] is site.obj else _replace_at(message, site.path, outs[0])
    if len(outs) == 1:
        return AnnotateResult((first,), AnnotateStatus.APPLIED)
    follow_update = outs[1]
    if site.method == REQUEST_PERMISSION:
        # The toolCall of a permission request is applied "exactly like a tool_call_update";
        # its follow-up is one, for the same session and toolCallId, sent after the request.
        follow_update = {"sessionUpdate": "tool_call_update", **follow_update}
    follow: JsonObject = {
        "jsonrpc": "2.0",
        "method": SESSION_UPDATE,
        "params": {"sessionId": site.session_id, "update": follow_update},
    }
    return AnnotateResult((first, follow), AnnotateStatus.APPLIED)


def _v1_target(
    base: JsonObject | None,
    own: JsonObject | None,
    sets: JsonObject,
    removes: Sequence[str],
    *,
    ow: bool,
) -> JsonObject:
    """The whole v1 `_meta` object to send: ``base`` plus the annotation."""
    target = dict(base or {})
    for key, value in sets.items():
        if ow or own is None or key not in own:
            target[key] = value
    for key in removes:
        target.pop(key, None)
    return target


def _annotate_v1(
    message: JsonObject,
    site: UpsertSite,
    annotation: Annotation,
    mode: V1Mode,
    store: V1MetaStore | None,
) -> AnnotateResult:
    if mode is V1Mode.OFF:
        return AnnotateResult((message,), AnnotateStatus.V1_OFF)
    if mode is V1Mode.STATEFUL and store is None:
        raise ValueError("V1Mode.STATEFUL needs a V1MetaStore (v1_store=...)")
    result = _annotate_v1_pure(
        message, site, annotation, store if mode is V1Mode.STATEFUL else None
    )
    if store is not None and mode is V1Mode.STATEFUL:
        for out in result.messages:
            store.observe(out)
    return result


def _annotate_v1_pure(
    message: JsonObject, site: UpsertSite, annotation: Annotation, store: V1MetaStore | None
) -> AnnotateResult:
    sets, removes = annotation.split
    raw = site.obj.get(META, OMITTED)
    own = raw if isinstance(raw, dict) else None
    # What the v1 client holds after the original update (registry v1 model), when known.
    base: JsonObject | None
    if own is not None:
        base = own  # v1: a `_meta` object replaces the whole stored object
    elif site.meta_rule is MetaRule.CREATE or (raw is None and store is not None):
        base = None  # creation, or (stateful) an explicit clear
    elif store is not None and (held := store.get(site.entity)) is not OMITTED:
        base = held
    elif not sets and not removes:
        return AnnotateResult((message,), AnnotateStatus.UNCHANGED)
    else:
        # RFD "Status quo": injecting a key into a v1 update without `_meta` turns "unchanged"
        # into "replace" and erases the agent's metadata on the client.
        return AnnotateResult((message,), AnnotateStatus.SKIPPED_V1_UNSAFE)
    target = _v1_target(base, own, sets, removes, ow=annotation.overwrite)
    if _same(target, base or {}):  # base is ``own`` when the update carries an object
        return AnnotateResult((message,), AnnotateStatus.UNCHANGED)
    new_obj = {**site.obj, META: target}
    return AnnotateResult((_replace_at(message, site.path, new_obj),), AnnotateStatus.APPLIED)


def annotate_message(
    message: JsonObject,
    version: int | None,
    annotation: Annotation,
    *,
    v1_mode: V1Mode = V1Mode.SAFE,
    v1_store: V1MetaStore | None = None,
) -> AnnotateResult:
    """Annotate the entity `_meta` of ``message`` if it is an upsert (see the registry).

    Returns ``UNKNOWN_VERSION`` before the version is known (``None`` or not 1/2),
    ``NOT_UPSERT`` for any message without an entity `_meta` (chunks, plan updates, responses...),
    otherwise v2: ``annotate`` on the upsert object (``APPLIED`` with one message, or two when the
    update clears `_meta`: the original, then a `session/update` follow-up; ``UNCHANGED`` when
    the update already satisfies the annotation). v1: see the module docstring; ``V1_OFF`` in
    ``V1Mode.OFF``. Raises ``ValueError`` for ``V1Mode.STATEFUL`` without ``v1_store``.
    """
    if version is None or version not in SUPPORTED_VERSIONS:
        return AnnotateResult((message,), AnnotateStatus.UNKNOWN_VERSION)
    site = find_upsert(message, version)
    if site is None:
        return AnnotateResult((message,), AnnotateStatus.NOT_UPSERT)
    if version == 2:
        return _annotate_v2(message, site, annotation)
    return _annotate_v1(message, site, annotation, v1_mode, v1_store)


# --- The fused v2 path ----------------------------------------------------------------------------

# ``v2_meta_after``'s answer when an annotation would split the update (a clear followed by the
# annotation): the general path (``annotate_message``) must handle it.
NEEDS_SPLIT: Final = "needs-split"


def v2_meta_after(
    update: JsonObject, annotations: Sequence[Annotation]
) -> JsonValue | Omitted | str:
    """The v2 upsert ``update``'s `_meta` after ``annotations`` applied in order, built alone.

    The fused form of ``_annotate_split`` applied by several rules, each to the previous one's
    output (what ``RulesMiddleware`` does on a v2 upsert): it computes only the new `_meta` value,
    never a copy of the message or of the update. Returns ``OMITTED`` when no annotation changes
    anything (the update goes on as it is), ``NEEDS_SPLIT`` when one would have to split the
    update (its `_meta` is ``null`` and the annotation sets keys: the general path builds the
    follow-up), otherwise the new `_meta` object (a fresh dict; the update is not touched).
    Same rules as ``annotate`` exactly; tests/meta/test_annotate.py checks both against each other.
    """
    current: Field = update.get(META, OMITTED)
    changed = False
    for annotation in annotations:
        sets, removes = annotation.split
        # ``as_patch(current)``, inline (one call less per annotated frame).
        patch = (
            current
            if current is OMITTED or current is None or type(current) is dict
            else (as_patch(current))
        )
        if patch is None:
            if sets:
                return NEEDS_SPLIT
            continue  # the clear already removes every key
        if not sets and not removes:
            continue
        if patch is OMITTED:
            current = {**sets, **dict.fromkeys(removes)}
            changed = True
            continue
        new: JsonObject | None = None
        overwrite = annotation.overwrite
        for key, value in sets.items():
            if key not in patch or (overwrite and not _same(patch[key], value)):
                if new is None:
                    new = dict(patch)
                new[key] = value
        for key in removes:
            if key not in patch or patch[key] is not None:
                if new is None:
                    new = dict(patch)
                new[key] = None
        if new is not None:
            current = new
            changed = True
    return current if changed else OMITTED
