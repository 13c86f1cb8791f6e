"""Stateless annotation of ACP upserts: set and remove namespaced `_meta` keys on entities.

Contract: owns how the proxy adds or removes keys of an entity's metadata without knowing what
the client holds (RFD Metadata Patches, "Shiny future": proxies annotate without tracking entity
state), and the v1 policy where no patch rule exists. Pure: no I/O, no logging.

STUB: the signatures below are the contract used by rules.py; bodies are implemented with the
patch core (issue 2).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from acp_proxy.jsontypes import JsonObject, JsonValue


class V1Mode(enum.StrEnum):
    """How `_meta` annotations are applied on a v1 connection (v1 has no patch rule)."""

    SAFE = "safe"  # annotate only where it cannot erase agent metadata; report the rest skipped
    STATEFUL = "stateful"  # keep merged metadata per entity (bounded LRU), send the whole object
    OFF = "off"  # never annotate v1 entities


@dataclass(frozen=True, slots=True)
class Annotation:
    """Keys to hold on an entity's metadata (``set``) and keys to remove (``remove``)."""

    set: Mapping[str, JsonValue] = field(default_factory=dict)
    remove: tuple[str, ...] = ()
    # When the update itself already sets a key of ``set``: keep the update's value (False) or
    # replace it with the rule's value (True).
    overwrite: bool = False


class AnnotateStatus(enum.StrEnum):
    APPLIED = "applied"  # messages differ from the input
    UNCHANGED = "unchanged"  # an upsert, but the annotation was already satisfied by the update
    NOT_UPSERT = "not_upsert"  # the message carries no patch `_meta` (left as is)
    SKIPPED_V1_UNSAFE = "skipped_v1_unsafe"  # v1 safe mode: annotating would erase agent metadata
    UNKNOWN_VERSION = "unknown_version"  # the protocol version is not known yet


@dataclass(frozen=True, slots=True)
class AnnotateResult:
    """The messages to send in place of the input (``(message,)`` when nothing changed)."""

    messages: tuple[JsonObject, ...]
    status: AnnotateStatus


class V1MetaStore:
    """Bounded LRU of each v1 entity's merged metadata, for ``V1Mode.STATEFUL``."""

    def __init__(self, max_entities: int = 10_000) -> None:
        raise NotImplementedError


def annotate_message(
    message: JsonObject,
    version: int | None,
    annotation: Annotation,
    *,
    v1_mode: V1Mode = V1Mode.SAFE,
    v1_store: V1MetaStore | None = None,
) -> AnnotateResult:
    """Annotate the entity `_meta` of ``message`` if it is an upsert (see the registry)."""
    raise NotImplementedError
