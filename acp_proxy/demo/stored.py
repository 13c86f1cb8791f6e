"""What the client stores: the metadata per entity after a session, correctly and naively.

Contract: owns reducing a recorded session with the client model (``acp_proxy.meta.state``:
metadata patches, the v2 rule) and with the rule before the v2 Metadata Patches RFD (a ``_meta``
object replaces the stored metadata whole), for the direct and the proxied run. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator

from acp_proxy.base.jsontypes import OMITTED, Field, JsonObject, JsonValue
from acp_proxy.demo.pairing import entity_of, is_follow_up
from acp_proxy.demo.session import SessionRecord
from acp_proxy.meta.registry import EntityKey, UpsertSite, find_upsert
from acp_proxy.meta.state import ClientModel


def _session_messages(record: SessionRecord) -> list[JsonObject]:
    return [f.message for f in record.received if isinstance(f.message, dict)]


def _upserts(record: SessionRecord) -> Iterator[tuple[JsonObject, UpsertSite]]:
    """Each received message that upserts an entity's metadata, with where its `_meta` sits."""
    for message in _session_messages(record):
        site = find_upsert(message, record.negotiated_version)
        if site is not None:
            yield message, site


def final_meta(record: SessionRecord) -> dict[str, JsonValue]:
    """The metadata a v2 client stores per entity after this stream (RFD patch rule).

    Reduces every received message with the client model ``acp_proxy.meta.state.ClientModel``.
    Entities are named as ``entity_of`` names them; ``None`` means no stored metadata (RFD:
    "Stored metadata with no keys is the same as no metadata").
    """
    return _reduce(_session_messages(record), record)


def _reduce(messages: list[JsonObject], record: SessionRecord) -> dict[str, JsonValue]:
    model = ClientModel(record.negotiated_version)
    names: dict[str, EntityKey] = {}
    for message in messages:
        model.apply(message)
        site = find_upsert(message, record.negotiated_version)
        if site is not None:
            names.setdefault(entity_of(site.obj, record.session_id), site.entity)
    return {name: model.meta(key) or None for name, key in names.items()}


def naive_meta(record: SessionRecord) -> dict[str, JsonValue]:
    """What a client stores if a ``_meta`` object replaced the stored object whole.

    That was the rule for v2 upserts before the Metadata Patches RFD (acp-digest §7.1:
    ``if !update.meta.is_undefined() { self.meta = update.meta; }``). Under it, a proxy that adds
    its key to an update sent without ``_meta`` erases the agent's stored keys.
    """
    stored: dict[str, JsonValue] = {}
    for _message, site in _upserts(record):
        name = entity_of(site.obj, record.session_id)
        stored.setdefault(name, None)
        meta: Field = site.obj.get("_meta", OMITTED)
        if meta is not OMITTED:
            stored[name] = meta if isinstance(meta, dict) and meta else None
    return stored


def naive_proxy_meta(record: SessionRecord) -> dict[str, JsonValue]:
    """What the client stores if the proxy had written its keys into the agent's clear.

    Replaces each kept ``_meta: null`` that the proxy followed with its keys by those keys
    alone, as a proxy that "fills in" `_meta` would. The RFD forbids it: "Intermediaries that
    combine updates MUST keep removals and clears"; without the clear, stale keys survive.
    """
    messages: list[JsonObject] = []
    cleared: dict[EntityKey, int] = {}  # entity -> index in messages of its kept clear
    for message in _session_messages(record):
        site = find_upsert(message, record.negotiated_version)
        meta: Field = site.obj.get("_meta", OMITTED) if site is not None else OMITTED
        if site is not None and site.entity in cleared and isinstance(meta, dict):
            index = cleared.pop(site.entity)
            clear = messages[index]
            clear_site = find_upsert(clear, record.negotiated_version)
            if clear_site is not None and is_follow_up(site.obj, clear_site.obj):
                messages[index] = _with_update_meta(clear, meta)
                continue
        if site is not None:
            cleared.pop(site.entity, None)
            if meta is None:
                cleared[site.entity] = len(messages)
        messages.append(message)
    return _reduce(messages, record)


def _with_update_meta(message: JsonObject, meta: JsonObject) -> JsonObject:
    """A copy of a `session/update` message whose ``update._meta`` is ``meta``."""
    params = message["params"]
    assert isinstance(params, dict)
    update = params["update"]
    assert isinstance(update, dict)
    return {**message, "params": {**params, "update": {**update, "_meta": meta}}}
