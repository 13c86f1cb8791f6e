"""The entity panel's model: every tool call, message, terminal and plan of a session as its
client stores it, with the history of its ``_meta`` key by key.

Contract: owns the per-session view the page's entity panel shows. It feeds what the client
received (a frame's ``sent`` frames, else the frame itself) to the project's ``ClientModel``
(``acp_proxy.meta.state``, the statement of a receiver's rules), so the state shown is exactly
the state a client holds; beside it, it keeps each entity's metadata updates in order: a key set,
a key removed (RFD v2 Metadata Patches: "a key set to null is removed"), a clear (``_meta:
null``: "clears all stored metadata"), and which of them the proxy wrote rather than the agent
(a key the agent's frame did not carry with that value, or a follow-up frame the proxy
inserted), credited to the rule that writes that key: the session header's ``rule_keys`` (the
keys each rule writes) picks, among the rules that changed the frame, those that write it; a key
no such rule writes goes to the other middleware that changed the frame. Without ``rule_keys``
(a record written before it) every rule and middleware that changed the frame is named. Pure;
bounded: ``MAX_ENTITIES`` entities per session and ``MAX_HISTORY`` updates per entity (older
updates are counted, not kept), and in
bytes: ``held`` counts what the parsed values it keeps may cost (``PARSED_FACTOR`` times the
bytes of each message that can change the state: Python's objects for JSON take about eight
times its text); the hub stops feeding a view past its share (``stop``), and the snapshot says
so (``"truncated": true``, ``"stopped_at"``: the first frame not applied).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from acp_proxy.base.jsontypes import OMITTED, Field, JsonObject, JsonValue, get_field
from acp_proxy.meta.registry import EntityKey, find_upsert
from acp_proxy.meta.state import ClientModel, MessageTurns
from acp_proxy.record.format import AGENT_TO_CLIENT, frame_bytes, sent_bytes
from acp_proxy.ui.events import parse_frame

MAX_ENTITIES: Final = 5000
MAX_HISTORY: Final = 200
PARSED_FACTOR: Final = 10  # bytes a kept parsed JSON value may cost per byte of its text
DEFAULT_VERSION: Final = 2
# Stands for "the proxy wrote all of it" where the agent's own patch would be.
_PROXY: Final = object()


@dataclass(slots=True)
class _Tracked:
    kind: str
    session: str | None
    ident: str | None
    first_seq: int
    last_seq: int = 0
    history: deque[JsonObject] = field(default_factory=lambda: deque(maxlen=MAX_HISTORY))
    dropped: int = 0  # updates older than the history kept
    injected: dict[str, list[str]] = field(default_factory=dict)  # key -> rules, as stored now


def _messages(value: JsonValue) -> list[JsonObject]:
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list):
        return [m for m in value if isinstance(m, dict)]
    return []


def _agent_patches(raw: JsonValue, version: int) -> dict[EntityKey, Field]:
    """The `_meta` update the agent's own frame carried for each entity it upserts."""
    out: dict[EntityKey, Field] = {}
    for message in _messages(raw):
        site = find_upsert(message, version)
        if site is not None and site.entity not in out:
            out[site.entity] = get_field(site.obj, "_meta")
    return out


class EntityView:
    """One session's entities (see the module docstring)."""

    __slots__ = (
        "_model",
        "_order",
        "_rule_keys",
        "_tracked",
        "_turns",
        "held",
        "stopped_at",
        "version",
    )

    def __init__(self, rule_keys: Mapping[str, frozenset[str]] | None = None) -> None:
        self.held = 0  # what the kept values may cost, in bytes (see the module docstring)
        self.stopped_at: int | None = None  # the seq of the first frame not applied
        self.version = DEFAULT_VERSION
        # "rules:NAME" -> the entity keys rule NAME writes; None: not known.
        self._rule_keys = rule_keys
        self._model: ClientModel | None = None
        self._tracked: dict[EntityKey, _Tracked] = {}
        self._order: deque[EntityKey] = deque()
        self._turns = MessageTurns()  # shared with the model: v1 messages without an id

    @classmethod
    def for_header(cls, header: Mapping[str, JsonValue]) -> EntityView:
        """The view of a session whose header (a record's first line, or the live session's)
        may name the keys each rule writes (``rule_keys``); one that does not, or names them
        in another shape, leaves every changer of a frame named."""
        given = header.get("rule_keys")
        if not isinstance(given, dict):
            return cls()
        keys: dict[str, frozenset[str]] = {}
        for name, written in given.items():
            if not isinstance(written, list) or not all(isinstance(k, str) for k in written):
                return cls()
            keys[f"rules:{name}"] = frozenset(k for k in written if isinstance(k, str))
        return cls(keys)

    def credited(self, rules: list[str], key: str) -> list[str]:
        """Who wrote ``key``, of the rules and middleware ``rules`` that changed its frame."""
        if self._rule_keys is None:
            return rules
        writers = [r for r in rules if key in self._rule_keys.get(r, ())]
        if writers:
            return writers
        others = [r for r in rules if not r.startswith("rules:")]
        return others or rules

    def set_version(self, version: object) -> None:
        """The negotiated protocol version (a ``version`` event); only 1 and 2 are modelled."""
        if version in (1, 2) and self._model is None:
            assert isinstance(version, int)
            self.version = version

    def stop(self, seq: int) -> None:
        """Apply nothing from event ``seq`` on (the hub's byte bound was reached)."""
        if self.stopped_at is None:
            self.stopped_at = seq

    def cost(self, event: JsonObject) -> int:
        """What applying ``event`` may add to ``held`` (0: it changes no state)."""
        if event.get("dir") != AGENT_TO_CLIENT or event.get("kind", "message") != "message":
            return 0
        if event.get("truncated"):
            return 0  # only its first bytes are held: not JSON, it changes no state
        sent = event.get("sent")
        if isinstance(sent, list):
            size = sum(len(s) for s in sent if isinstance(s, str))
        else:
            raw = event.get("raw")
            size = len(raw) if isinstance(raw, str) else 0
        return PARSED_FACTOR * size

    def feed(self, event: JsonObject, frame: Field = OMITTED) -> None:
        """Apply one stream event (frames toward the client change the client's state);
        ``frame``: the JSON value of its frame when the caller parsed it already."""
        if self.stopped_at is not None:
            return
        if event.get("event") == "version":
            self.set_version(event.get("protocolVersion"))
            return
        if event.get("kind", "message") != "message":
            return
        if event.get("dir") != AGENT_TO_CLIENT:
            # A prompt toward the agent starts a turn: v1 chunks without an id start a new
            # message then (``MessageTurns``). Only what the agent got counts.
            self._see_turns(event, frame)
            return
        seq = event.get("seq")
        seq = seq if isinstance(seq, int) else 0
        sent = event.get("sent")
        raw = parse_frame(frame_bytes(event)) if frame is OMITTED else frame
        delivered = [parse_frame(sent_bytes(s)) for s in sent] if isinstance(sent, list) else [raw]
        generated = event.get("generated") is True
        names = event.get("changed_by")
        changed_by = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
        if self._model is None:
            self._model = ClientModel(self.version, self._turns)
        self.held += self.cost(event)
        for value in delivered:
            for message in _messages(value):
                self._turns.see(AGENT_TO_CLIENT, message)
        originals = {} if generated else _agent_patches(raw, self.version)
        for value in delivered:
            for message in _messages(value):
                self._apply(message, seq, originals, changed_by, proxy_wrote=generated)

    def _see_turns(self, event: JsonObject, frame: Field) -> None:
        if b"session/prompt" not in frame_bytes(event) and frame is OMITTED:
            return  # parsed only when it can be a prompt request
        sent = event.get("sent")
        raw = parse_frame(frame_bytes(event)) if frame is OMITTED else frame
        delivered = [parse_frame(sent_bytes(s)) for s in sent] if isinstance(sent, list) else [raw]
        for value in delivered:
            for message in _messages(value):
                self._turns.see(str(event.get("dir")), message)

    def _apply(
        self,
        message: JsonObject,
        seq: int,
        originals: dict[EntityKey, Field],
        rules: list[str],
        *,
        proxy_wrote: bool,
    ) -> None:
        assert self._model is not None
        try:
            key = self._model.apply(message)
        except (TypeError, ValueError, KeyError, AssertionError):  # a malformed message
            return
        if key is None:
            return
        tracked = self._track(key, seq)
        if tracked is None:
            return
        site = find_upsert(message, self.version)
        if site is None:
            return
        meta = get_field(site.obj, "_meta")
        # The first update of an entity the agent's frame upserted is compared with the
        # agent's patch: what differs is the proxy's. Any other update in what the client got
        # (a follow-up the proxy inserted, a frame the proxy generated) is the proxy's whole.
        original = originals.pop(site.entity, _PROXY) if not proxy_wrote else _PROXY
        self._history(tracked, seq, meta, original, rules)

    def _track(self, key: EntityKey, seq: int) -> _Tracked | None:
        tracked = self._tracked.get(key)
        if tracked is None:
            if len(self._tracked) >= MAX_ENTITIES:
                return None
            ident = key[-1] if len(key) > 2 else None  # "#N": a v1 message without an id
            tracked = _Tracked(str(key[0]), key[1], ident, seq)
            self._tracked[key] = tracked
            self._order.append(key)
        tracked.last_seq = seq
        return tracked

    def _history(
        self,
        tracked: _Tracked,
        seq: int,
        meta: Field,
        original: object,
        rules: list[str],
    ) -> None:
        def add(entry: JsonObject) -> None:
            if len(tracked.history) == MAX_HISTORY:
                tracked.dropped += 1
            tracked.history.append(entry)

        if meta is OMITTED:
            return
        if meta is None:
            proxy = original is not None
            entry: JsonObject = {"seq": seq, "op": "clear", "by": "proxy" if proxy else "agent"}
            entry["rules"] = list[JsonValue](rules) if proxy else []
            add(entry)
            tracked.injected.clear()
            return
        if not isinstance(meta, dict):
            return
        agent_keys = original if isinstance(original, dict) else None
        for name, item in meta.items():
            proxy = agent_keys is None or name not in agent_keys or agent_keys[name] != item
            op = "remove" if item is None and self.version == 2 else "set"
            credited = self.credited(rules, name) if proxy else []
            add(
                {
                    "seq": seq,
                    "op": op,
                    "key": name,
                    "value": item,
                    "by": "proxy" if proxy else "agent",
                    "rules": list[JsonValue](credited),
                }
            )
            if proxy and op == "set":
                tracked.injected[name] = credited
            else:
                tracked.injected.pop(name, None)
        if self.version == 1:
            # v1: a `_meta` object replaces the stored metadata whole.
            for name in [k for k in tracked.injected if k not in meta]:
                tracked.injected.pop(name)

    def snapshot(self) -> JsonObject:
        """The panel's data: each entity's stored fields and `_meta` as the client holds them,
        the keys the proxy injected, and the update history, in first-seen order. It shares
        the values the view holds (a copy would recurse through a deep frame and double the
        memory): encode it before the view is fed again."""
        model = self._model
        state = model.snapshot(copied=False) if model is not None else {"entities": {}}
        stored = state["entities"]
        snapshots = state.get("snapshots", {})
        out: list[JsonValue] = []
        for key in self._order:
            tracked = self._tracked[key]
            held = stored.get(key) or {}
            fields = held.get("fields") or snapshots.get(key) or {}
            out.append(
                {
                    "kind": tracked.kind,
                    "session": tracked.session,
                    "id": tracked.ident,
                    "first_seq": tracked.first_seq,
                    "last_seq": tracked.last_seq,
                    "fields": fields,
                    "appended": held.get("appended") or {},
                    "meta": held.get("meta"),
                    "injected": {k: list(v) for k, v in tracked.injected.items()},
                    "history": list(tracked.history),
                    "history_dropped": tracked.dropped,
                }
            )
        return {
            "version": self.version,
            "entities": out,
            "truncated": len(self._tracked) >= MAX_ENTITIES or self.stopped_at is not None,
            "stopped_at": self.stopped_at,
        }
