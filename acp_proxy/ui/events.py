"""The observer event stream (version 2): what ``--ui`` and ``acp-proxy ui`` publish.

Contract: owns the shape of one stream event and its derivation from a record line (the record
format of ``acp_proxy.record.format``, already redacted): a frame line gains ``seq`` (its place
in the stream), ``conn`` (which session) and ``info`` (what the frame is: request, response,
notification, error; method, id, update kind, session id; for a response, the ``seq`` of the
request it answers and the latency). It never sees unredacted bytes and never touches the wire.

The stream (documented in docs/live-view.md; change it only with ``STREAM_VERSION``):

- ``{"event": "hello", "stream": "acp-proxy-events", "version": 1, "mode": "live" | "records",
  "head": seq}``: the first event of every subscription;
- ``{"seq", "conn", "event": "session", "header": {...}}``: a session starts (its record header);
- a frame: the record's frame line plus ``seq``, ``conn`` and ``info`` (since version 3, with
  ``truncated``: N when the view kept only the frame's first bytes, N the bytes it left out;
  since version 4, with ``policy``: the permission policy's decisions on it, ``ui_hub``);
- the record's events (``version``, ``end``, ``stopped``, ``lost``) plus ``seq`` and ``conn``;
- ``{"seq", "conn", "t", "event": "stderr", "line"}``: a line of the agent's stderr;
- ``{"seq", "conn", "t", "event": "coalesced", "direction", "update", "entity", "frames",
  "written", "bytes"}`` (since version 2): the outbound queue merged ``frames`` frames the
  session had read (each shown as read) into ``written`` frames of ``bytes`` bytes, because the
  receiver read slowly;
- ``{"event": "truncated", "lost": N}``: the replay asked for events the server no longer
  holds; ``{"event": "cutoff", "reason": ...}``: the server ends this subscription (last event).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

import orjson

from acp_proxy.base.jsontypes import OMITTED, Field, JsonObject, JsonValue
from acp_proxy.record.format import AGENT_TO_CLIENT, CLIENT_TO_AGENT, frame_bytes
from acp_proxy.ui.display import shown
from acp_proxy.wire.connection.observe import passed_kind
from acp_proxy.wire.raw.prefilter import parse_cost

STREAM_NAME: Final = "acp-proxy-events"
STREAM_VERSION: Final = 4  # 2: ``coalesced``; 3: a frame's ``truncated``; 4: its ``policy``
# Requests awaiting their response, per session and direction: past this the oldest is
# forgotten (its response is then shown unjoined), so a peer that never answers costs nothing.
MAX_PENDING: Final = 4096

_OTHER: Final = {CLIENT_TO_AGENT: AGENT_TO_CLIENT, AGENT_TO_CLIENT: CLIENT_TO_AGENT}


def hello(mode: str, head: int) -> JsonObject:
    """The first event of a subscription."""
    return {
        "event": "hello",
        "stream": STREAM_NAME,
        "version": STREAM_VERSION,
        "mode": mode,
        "head": head,
    }


def describe_message(message: JsonValue) -> JsonObject:
    """What one JSON-RPC message is: ``type`` (request, notification, response, error,
    batch, other), ``method``, ``id``, and for a ``session/update`` its ``update`` kind and
    for any ``params.sessionId`` its ``session``."""
    if isinstance(message, list):
        return {"type": "batch", "size": len(message)}
    if not isinstance(message, dict):
        return {"type": "other"}
    info: JsonObject = {}
    method = message.get("method")
    has_id = "id" in message
    if isinstance(method, str):
        info["type"] = "request" if has_id else "notification"
        info["method"] = method
    elif has_id and "error" in message:
        info["type"] = "error"
        error = message.get("error")
        if isinstance(error, dict):
            info["code"] = error.get("code")
            info["message"] = error.get("message")
    elif has_id and "result" in message:
        info["type"] = "response"
    else:
        info["type"] = "other"
    if has_id:
        info["id"] = message.get("id")
    params = message.get("params")
    if isinstance(params, dict):
        session = params.get("sessionId")
        if isinstance(session, str):
            info["session"] = session
        update = params.get("update")
        if method == "session/update" and isinstance(update, dict):
            kind = update.get("sessionUpdate")
            if isinstance(kind, str):
                info["update"] = kind
    return info


def parse_frame(raw: bytes) -> JsonValue:
    """The JSON value of a recorded frame, or ``None`` when it is not JSON."""
    try:
        value: JsonValue = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value


def passed(raw: bytes, max_parse: int) -> tuple[str, Field]:
    """The ``kind`` of a frame that passed as it came (``wire.connection.observe.passed_kind``;
    ``max_parse``: its session's parse budget), and its value when orjson read it (what
    ``parse_frame`` gives; else ``OMITTED``): one parse for its kind and its ``info``."""
    if parse_cost(raw, max_parse) <= max_parse:
        try:
            value: JsonValue = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            return ("batch" if raw.lstrip()[:1] == b"[" else "message"), value
    return passed_kind(raw, max_parse), OMITTED


def _id_key(value: JsonValue) -> object:
    # One key per id: 1 and "1" differ; 1 and 1.0 are one JSON number for a peer (and one key
    # of a dict); other JSON values (true, null, lists: not valid ids) by their encoding.
    kind = type(value)
    if kind is int or kind is str or kind is float:
        return value
    return orjson.dumps(value)


class Joiner:
    """Joins each response to its request within one session (``MAX_PENDING`` per direction)."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        # (direction of the request, id) -> (seq, t, method)
        self._pending: OrderedDict[tuple[str, object], tuple[int, float, str]] = OrderedDict()

    def see(self, direction: str, info: JsonObject, seq: int, t: float) -> None:
        """Record a request, or complete ``info`` of a response with ``reply_to``,
        ``answers`` and ``latency`` (seconds)."""
        kind = info.get("type")
        if "id" not in info or kind not in ("request", "response", "error"):
            return
        key_id = _id_key(info["id"])
        if kind == "request":
            self._pending[(direction, key_id)] = (seq, t, str(info.get("method")))
            if len(self._pending) > 2 * MAX_PENDING:
                self._pending.popitem(last=False)
            return
        found = self._pending.pop((_OTHER.get(direction, ""), key_id), None)
        if found is not None:
            req_seq, req_t, method = found
            info["reply_to"] = req_seq
            info["answers"] = method
            info["latency"] = round(max(t - req_t, 0.0), 6)


class StreamBuilder:
    """Turns the record lines of any number of sessions into stream events, numbered in order."""

    __slots__ = ("_joiners", "frame", "head")

    def __init__(self) -> None:
        self.head = 0  # the seq of the last event built
        self._joiners: dict[int, Joiner] = {}
        # The JSON value of the last frame line's frame (``None``: not JSON), parsed once for
        # its ``info`` and handed on to the entity view.
        self.frame: JsonValue = None

    def _next(self) -> int:
        self.head += 1
        return self.head

    def session(self, conn: int, header: JsonObject) -> JsonObject:
        """The event of a session's start (``header``: its record header)."""
        self._joiners[conn] = Joiner()
        return {"seq": self._next(), "conn": conn, "event": "session", "header": header}

    def line(
        self, conn: int, line: JsonObject, raw: bytes | None = None, frame: Field = OMITTED
    ) -> JsonObject:
        """The event of one record line (a frame or an event) of session ``conn`` (``raw``:
        the frame's bytes as the line holds them, when the caller has them; ``frame``: what
        ``parse_frame`` gives of them, when the caller parsed them)."""
        event: JsonObject = {"seq": self._next(), "conn": conn, **line}
        direction = line.get("dir")
        if not isinstance(direction, str):
            if line.get("event") == "end":
                self._joiners.pop(conn, None)
            return event
        kind = line.get("kind", "message")
        if kind in ("message", "batch"):
            if frame is OMITTED:
                frame = parse_frame(raw if raw is not None else frame_bytes(line))
            self.frame = frame
            info = describe_message(frame)
        else:
            self.frame, info = None, {}
        if kind not in ("message", "batch"):
            info["type"] = str(kind)
        t = line.get("t")
        when = float(t) if isinstance(t, int | float) else 0.0
        joiner = self._joiners.get(conn)
        if joiner is None:
            joiner = self._joiners[conn] = Joiner()
        joiner.see(direction, info, self.head, when)
        for name, text in info.items():
            if type(text) is str:
                info[name] = shown(text)  # what the timeline shows: controls visible
        event["info"] = info
        return event


def policy_marks(marks: tuple[object, ...]) -> list[JsonObject]:
    """What a frame's event says of the policy's decisions on it (its ``policy``): the rule
    (``null``: the default), the decision, the option answered, whether the message went on;
    for a tool call that ran without asking, ``"unasked": true`` (and ``"cancelled": true``
    when its session was cancelled)."""
    # (Here: the policy's modules are loaded once a frame it marked is shown, not at start-up.)
    from acp_proxy.policy.policy_link import UNASKED, AuditEntry

    out: list[JsonObject] = []
    for mark in marks:
        if type(mark) is not AuditEntry:
            continue
        shown: JsonObject = {
            "rule": mark.rule,
            "decision": mark.decision,
            "option": mark.option,
            "forwarded": mark.forwarded,
            "mode": mark.mode,
        }
        if mark.method == UNASKED:
            shown["unasked"] = True
            if mark.cancelled:
                shown["cancelled"] = True
        out.append(shown)
    return out
