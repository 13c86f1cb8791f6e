"""``acp-proxy show``: a record read back as a transcript.

Contract: pure. ``Transcript`` is fed a record's parsed lines one at a time (so ``--follow`` can
feed it as the file grows) and returns ``Row`` values: what each frame was (time, direction,
method, id, update kind, entity), which request a response answers and after how long, what
the proxy changed (the ``_meta`` diff of each changed frame, the frames it inserted, dropped or
generated). ``render`` turns a row into text (colours only when asked), every string taken
from the record made visible (``escape.visible``: a control sequence in an agent's method name
is printed, never executed). ``final_state`` is what a client stores from what it received
(``ClientModel``, fed as the lines come: memory holds the state, not the record; fed each
line's offset, it keeps a reference per chunk and per event instead of its value, 8 bytes
each, ``record.chunkrefs``). A frame nested too deeply to read is summarised, never an error.
No I/O, no clock.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.meta.registry import entity_key, session_update_kind
from acp_proxy.meta.state import ClientModel, MessageTurns
from acp_proxy.record.chunkrefs import EventList, RefList, Where, referenced
from acp_proxy.record.escape import visible
from acp_proxy.record.format import AGENT_TO_CLIENT, CLIENT_TO_AGENT, delivered, frame_bytes

ARROWS = {CLIENT_TO_AGENT: "C→A", AGENT_TO_CLIENT: "A→C"}
# Requests waiting for their response (to join it and give its latency): past this, the oldest
# is forgotten (its response is then shown without a method).
MAX_PENDING = 100_000
# Messages the client received before the protocol version is known (the state model needs
# it): past this, the model starts with version 2, the default.
MAX_BEFORE_VERSION = 1_000
DEEP = "a frame nested too deeply to describe"


@dataclass(frozen=True, slots=True)
class MetaChange:
    """One ``_meta`` key changed by the proxy: ``+`` added, ``~`` changed, ``-`` removed."""

    op: str
    key: str
    path: str = ""  # where the ``_meta`` object is, when not the message's own
    old: JsonValue = None
    new: JsonValue = None
    inserted: bool = False  # in a frame the proxy inserted

    def text(self) -> str:
        where = f" ({self.path})" if self.path else ""
        if self.op == "+":
            body = f"+ {self.key}: {_short(self.new)}{where}"
        elif self.op == "~":
            body = f"~ {self.key}: {_short(self.old)} -> {_short(self.new)}{where}"
        else:
            body = f"- {self.key}{where}"
        return body + (" (inserted)" if self.inserted else "")

    def as_json(self) -> JsonObject:
        out: dict[str, Any] = {"op": self.op, "key": self.key}
        if self.path:
            out["path"] = self.path
        if self.op == "~":
            out["old"] = self.old
        if self.op != "-":
            out["value"] = self.new
        if self.inserted:
            out["inserted"] = True
        return out


@dataclass(frozen=True, slots=True)
class Message:
    """One JSON-RPC message of a frame, described."""

    kind: str  # request, notification, response, error, invalid
    method: str | None = None  # a response: the method of the request it answers
    id: JsonValue = None
    update: str | None = None
    entity: str | None = None
    session: str | None = None
    latency_ms: float | None = None  # a response: time since its request
    error: str | None = None  # an error response's code and message


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the record, described for a reader."""

    t: float
    dir: str | None  # None for events
    messages: tuple[Message, ...] = ()
    event: str | None = None
    detail: str | None = None  # an event's text; a non-message frame's kind
    generated: bool = False
    redacted: bool = False
    changed_by: tuple[str, ...] = ()
    dropped: bool = False
    meta_diff: tuple[MetaChange, ...] = ()
    inserted: tuple[Message, ...] = ()  # frames the proxy sent beyond the frame itself

    def as_json(self) -> JsonObject:
        out: dict[str, Any] = {"t": self.t}
        if self.event is not None:
            out["event"] = self.event
            if self.detail:
                out["detail"] = self.detail
            return out
        out["dir"] = self.dir
        out["messages"] = [_message_json(m) for m in self.messages]
        for name in ("generated", "redacted", "dropped"):
            if getattr(self, name):
                out[name] = True
        if self.changed_by:
            out["changed_by"] = list(self.changed_by)
        if self.meta_diff:
            out["meta_diff"] = [change.as_json() for change in self.meta_diff]
        if self.inserted:
            out["inserted"] = [_message_json(m) for m in self.inserted]
        if self.detail:
            out["kind"] = self.detail
        return out


def _message_json(m: Message) -> JsonObject:
    return {
        k: v
        for k, v in (
            ("kind", m.kind),
            ("method", m.method),
            ("id", m.id),
            ("update", m.update),
            ("entity", m.entity),
            ("sessionId", m.session),
            ("latency_ms", m.latency_ms),
            ("error", m.error),
        )
        if v is not None
    }


@dataclass(frozen=True, slots=True)
class Filters:
    """``show``'s filters; a row is shown when one of its messages passes all of them."""

    method: str | None = None  # a glob; a response matches by the method it answers
    session: str | None = None
    dir: str | None = None
    entity: str | None = None  # a glob on "kind:key" (tool_call:t1)

    def passes(self, row: Row) -> bool:
        if self.dir is not None and row.dir != self.dir:
            return False
        if row.event is not None:
            return self.method is None and self.session is None and self.entity is None
        if self.method is None and self.session is None and self.entity is None:
            return True
        return any(self._message(m) for m in (*row.messages, *row.inserted))

    def _message(self, m: Message) -> bool:
        if self.method is not None and not fnmatch.fnmatchcase(m.method or "", self.method):
            return False
        if self.session is not None and m.session != self.session:
            return False
        return self.entity is None or fnmatch.fnmatchcase(m.entity or "", self.entity)


def _loads(raw: bytes) -> JsonValue | None:
    # The stdlib, not orjson: ids and values beyond 64 bits must read back exactly.
    try:
        return json.loads(raw)  # type: ignore[no-any-return]
    except (ValueError, RecursionError):
        return None


def _id_key(value: JsonValue) -> str:
    if isinstance(value, int):
        return str(value)
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # nested deeper than orjson writes
        return repr(value)


def _session_of(message: JsonObject) -> str | None:
    for holder in (message.get("params"), message.get("result")):
        if isinstance(holder, dict) and isinstance(holder.get("sessionId"), str):
            return str(holder["sessionId"])
    return None


def _metas(value: JsonValue) -> dict[str, JsonObject]:
    """Every ``_meta`` object of a message, by its JSON path (walked without recursion)."""
    found: dict[str, JsonObject] = {}
    stack: list[tuple[JsonValue, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            for key, sub in reversed(item.items()):
                where = f"{path}.{key}" if path else key
                if key == "_meta" and isinstance(sub, dict):
                    found[where] = sub
                else:
                    stack.append((sub, where))
        elif isinstance(item, list):
            stack.extend((sub, f"{path}[{i}]") for i, sub in reversed(list(enumerate(item))))
    return found


def _short(value: JsonValue, limit: int = 60) -> str:
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # an integer beyond 64 bits, a value nested beyond orjson's depth
        text = str(value) if isinstance(value, int) else f"({type(value).__name__})"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def meta_changes(
    before: JsonValue, after: JsonValue, *, inserted: bool = False
) -> list[MetaChange]:
    """The ``_meta`` changes between two versions of a message: added, changed, removed
    (absent, or ``null``: RFD Metadata Patches, a key set to null holds no data)."""
    old, new = _metas(before), _metas(after)
    out: list[MetaChange] = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path, {}), new.get(path, {})
        where = "" if path in ("_meta", "params._meta") else path
        for key in sorted(set(a) | set(b)):
            if key not in a:
                if b[key] is None:
                    out.append(MetaChange("-", key, where, inserted=inserted))
                else:
                    out.append(MetaChange("+", key, where, new=b[key], inserted=inserted))
            elif key not in b or (a[key] != b[key] and b[key] is None):
                out.append(MetaChange("-", key, where, old=a[key], inserted=inserted))
            elif a[key] != b[key]:
                out.append(MetaChange("~", key, where, a[key], b[key], inserted=inserted))
    return out


def meta_diff(before: JsonValue, after: JsonValue) -> list[str]:
    """``meta_changes`` as text: ``+ k: v`` added, ``~ k: a -> b`` changed, ``- k`` removed."""
    return [change.text() for change in meta_changes(before, after)]


@dataclass(slots=True)
class Transcript:
    """Rows from record lines, with the request table that joins responses to requests."""

    version: int | None = None
    header: JsonObject | None = None
    keep_state: bool = True  # keep what the client stores, for ``final_state``
    # (direction of the request, id) -> (method, t); at most MAX_PENDING, oldest dropped
    _pending: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    _model: ClientModel | None = None  # the client's state, once the version is known
    # Received before the version, each with where its line is (-1: not known).
    _early: list[tuple[JsonObject, Where | None]] = field(default_factory=list)
    _offset: int = -1  # where the line being fed starts in its file (-1: not known)
    # Which message a v1 chunk without an id belongs to (shared with the model): one per turn.
    _turns: MessageTurns = field(default_factory=MessageTurns)
    _events: EventList = field(default_factory=EventList)  # the model's events

    def feed(self, entry: Mapping[str, JsonValue], offset: int = -1) -> Row | None:
        """The row for one record line (``None`` for the header); the line was checked by
        ``format.read_line``. A frame too deeply nested to walk gives a summary row. With
        the line's ``offset`` in a seekable file, the state keeps a ``ChunkRef`` for each
        chunk's value instead of the value (``final_state``'s reader reads them back)."""
        self._offset = offset
        if "acp-proxy-record" in entry:
            self.header = dict(entry)
            return None
        raw_t = entry.get("t")
        t = float(raw_t) if isinstance(raw_t, int | float) else 0.0
        event = entry.get("event")
        if isinstance(event, str):
            return self._event(t, event, entry)
        direction = str(entry.get("dir"))
        try:
            return self._frame(t, direction, entry)
        except RecursionError:
            return Row(t, direction, detail=DEEP, generated=bool(entry.get("generated")))

    def _frame(self, t: float, direction: str, entry: Mapping[str, JsonValue]) -> Row:
        raw = frame_bytes(entry)
        value = _loads(raw)
        kind = entry.get("kind")
        sent = entry.get("sent")
        generated = bool(entry.get("generated"))
        for message in value if isinstance(value, list) else [value]:
            if isinstance(message, dict):
                self._turns.see(direction, message)
        messages = self._messages(direction, value, t)
        changed_by = tuple(str(c) for c in entry.get("changed_by") or ())  # type: ignore[union-attr]
        dropped = isinstance(sent, list) and not sent
        diff: list[MetaChange] = []
        inserted: list[Message] = []
        if isinstance(sent, list) and sent:
            outs = [_loads(f) for f in delivered(entry)]
            diff = meta_changes(value, outs[0])
            for extra in outs[1:]:
                inserted.extend(self._describe(extra))
                diff.extend(meta_changes(None, extra, inserted=True))
        if direction == AGENT_TO_CLIENT and self.keep_state:
            for f, frame in enumerate(delivered(entry)):
                got = _loads(frame)
                for m, message in enumerate(got if isinstance(got, list) else [got]):
                    if isinstance(message, dict):
                        place = (self._offset, f, m) if self._offset >= 0 else None
                        self._receive(message, place)
        detail = str(kind) if isinstance(kind, str) else None
        if value is None and raw.strip()[:1] in (b"{", b"[") and _too_deep(raw):
            detail = DEEP
        return Row(
            t=t,
            dir=direction,
            messages=tuple(messages),
            detail=detail,
            generated=generated,
            redacted=bool(entry.get("redacted")),
            changed_by=changed_by,
            dropped=dropped,
            meta_diff=tuple(diff),
            inserted=tuple(inserted),
        )

    def _receive(self, message: JsonObject, place: Where | None = None) -> None:
        if self._model is None:
            if self.version is None and len(self._early) < MAX_BEFORE_VERSION:
                self._early.append((message, place))
                return
            self._start_model()
        assert self._model is not None
        self._apply(message, place)

    def _apply(self, message: JsonObject, place: Where | None) -> None:
        assert self._model is not None
        if place is not None:
            message = referenced(message, self._model.version, place)
        self._events.place = place
        try:
            self._model.apply(message)
        finally:
            self._events.place = None

    def _start_model(self) -> None:
        # Chunks and events as 8-byte references where the line's offset is known.
        self._model = ClientModel(
            self.version if self.version in (1, 2) else 2,
            self._turns,
            chunk_list=RefList.of,
            events=self._events,
        )
        early, self._early = self._early, []
        for message, place in early:
            self._apply(message, place)

    def _event(self, t: float, event: str, entry: Mapping[str, JsonValue]) -> Row:
        if event == "version":
            v = entry.get("protocolVersion")
            self.version = v if isinstance(v, int) and not isinstance(v, bool) else None
            return Row(t, None, event=event, detail=f"protocol version {v}")
        if event == "end":
            exit_ = entry.get("exit")
            status = exit_.get("status") if isinstance(exit_, dict) else None
            return Row(t, None, event=event, detail=f"session ended: {status or 'exit unknown'}")
        if event == "stopped":
            return Row(t, None, event=event, detail=f"recording stopped: {entry.get('reason')}")
        if event == "lost":
            return Row(
                t,
                None,
                event=event,
                detail=f"{entry.get('frames')} lines lost (the record file did not take them)",
            )
        return Row(t, None, event=event)

    def _describe(self, value: JsonValue) -> list[Message]:
        return [self._one(m) for m in (value if isinstance(value, list) else [value])]

    def _one(self, m: JsonValue) -> Message:
        if not isinstance(m, dict):
            return Message("invalid")
        method = m.get("method")
        session = _session_of(m)
        if isinstance(method, str):
            update = session_update_kind(m)
            key = entity_key(m, self.version or 2) if update is not None else None
            key = self._turns.key(key) if key is not None else None
            entity = f"{key[0]}:{key[-1]}" if key else None
            kind = "request" if "id" in m else "notification"
            return Message(kind, method, m.get("id"), update, entity, session)
        if "result" in m or "error" in m:
            error = None
            err = m.get("error")
            if isinstance(err, dict):
                error = f"{err.get('code')} {err.get('message')}"
            return Message(
                "error" if err is not None else "response",
                None,
                m.get("id"),
                session=session,
                error=error,
            )
        return Message("invalid")

    def _messages(self, direction: str, value: JsonValue, t: float) -> list[Message]:
        if value is None:
            return []
        out = []
        for described in self._describe(value):
            message = described
            if message.kind == "request" and message.method is not None:
                self._pending[(direction, _id_key(message.id))] = (message.method, t)
                if len(self._pending) > MAX_PENDING:
                    del self._pending[next(iter(self._pending))]
            elif message.kind in ("response", "error"):
                other = CLIENT_TO_AGENT if direction == AGENT_TO_CLIENT else AGENT_TO_CLIENT
                asked = self._pending.pop((other, _id_key(message.id)), None)
                if asked is not None:
                    message = Message(
                        message.kind,
                        asked[0],
                        message.id,
                        session=message.session,
                        latency_ms=round((t - asked[1]) * 1000, 1),
                        error=message.error,
                    )
            out.append(message)
        return out

    def state_version(self) -> int:
        """The protocol version the client's state was built for."""
        if self._model is None:
            self._start_model()
        assert self._model is not None
        return self._model.version

    def final_state(self) -> dict[str, Any]:
        """What a client stores from everything it received (``ClientModel.snapshot``: the
        model's own values, not a copy; read only)."""
        if self._model is None:
            self._start_model()
        assert self._model is not None
        return self._model.snapshot(copied=False)


def _too_deep(raw: bytes) -> bool:
    """Whether ``raw`` is JSON the stdlib parser gives up on for its depth (not malformed)."""
    try:
        json.loads(raw)
    except RecursionError:
        return True
    except ValueError:
        return False
    return False


# --- text --------------------------------------------------------------------------------------

_COLOURS = {
    "time": "2",
    CLIENT_TO_AGENT: "36",
    AGENT_TO_CLIENT: "35",
    "method": "1",
    "+": "32",
    "~": "33",
    "-": "31",
    "event": "34",
    "error": "31",
    "generated": "33",
}


def _paint(text: str, what: str, colour: bool) -> str:
    return f"\x1b[{_COLOURS[what]}m{text}\x1b[0m" if colour else text


def _describe_text(m: Message) -> str:
    return visible(_describe_raw(m))


def _describe_raw(m: Message) -> str:
    parts: list[str] = []
    if m.kind in ("response", "error"):
        parts.append(("error" if m.kind == "error" else "response") + f" #{_short(m.id)}")
        parts.append(f"to {m.method}" if m.method else "(no request waiting)")
        if m.latency_ms is not None:
            parts.append(f"after {m.latency_ms:g} ms")
        if m.error:
            parts.append(m.error)
    elif m.kind == "invalid":
        parts.append("(not a JSON-RPC message)")
    else:
        parts.append(m.method or "?")
        if m.kind == "request":
            parts.append(f"#{_short(m.id)}")
        if m.update:
            parts.append(m.update)
        if m.entity:
            parts.append(m.entity)
    return " ".join(parts)


def render(row: Row, *, colour: bool = False) -> list[str]:
    """The text lines of one row."""
    stamp = _paint(f"{row.t:10.3f}", "time", colour)
    if row.event is not None:
        return [f"{stamp}  {_paint('---', 'event', colour)} {visible(row.detail or row.event)}"]
    assert row.dir is not None
    arrow = _paint(ARROWS.get(row.dir, visible(row.dir)), row.dir, colour)
    what = "; ".join(_describe_text(m) for m in row.messages) or visible(
        f"({row.detail or 'frame'})"
    )
    if len(row.messages) > 1:
        what = f"batch [{what}]"
    flags = []
    if row.generated:
        flags.append(_paint("[generated by the proxy]", "generated", colour))
    if row.redacted:
        flags.append("[redacted]")
    if row.dropped:
        flags.append(visible(f"[dropped by {', '.join(row.changed_by) or 'the proxy'}]"))
    elif row.changed_by:
        flags.append(visible(f"[changed by {', '.join(row.changed_by)}]"))
    if row.detail and row.messages:
        flags.append(visible(f"[{row.detail}]"))
    lines = [f"{stamp}  {arrow} {what}" + (" " + " ".join(flags) if flags else "")]
    for change in row.meta_diff:
        lines.append(" " * 18 + _paint(visible(change.text()), change.op, colour))
    for m in row.inserted:
        lines.append(" " * 18 + _paint("+ inserted: ", "+", colour) + _describe_text(m))
    return lines


def rows(entries: Iterable[Mapping[str, JsonValue]], transcript: Transcript) -> Iterable[Row]:
    """``transcript.feed`` over ``entries``, headers skipped."""
    for entry in entries:
        row = transcript.feed(entry)
        if row is not None:
            yield row
