"""Exports of stream events: back to a record file, or to the JSON of Zed's "Copy All Messages".

Contract: pure functions from stream events (``acp_proxy.ui.events``) to bytes. The page does
the same in JavaScript for the rows a person selected; these serve ``/export`` and are the
reference its tests compare with. Both show what the client and agent received (a frame's
``sent`` frames when the proxy changed it), already redacted.

Zed's ACP log panel ("dev: open acp logs", its "Copy All Messages" button) copies a pretty
JSON array seen from the client: one object per message, ``{"_direction": "incoming" |
"outgoing", "_type": "request" | "response" | "notification", "id": id | null, "method": name,
"params": params | result | error}``; a response carries the method of its request, or
``"[unrecognized response]"``.

Both are also written piece by piece (``RecordWriter``, ``ZedWriter``: events in, the next
bytes of the body out), so that a long session is served in bounded pieces rather than built
whole; a frame of any depth is written (``acp_proxy.ui.deepjson``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Final

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.record.format import AGENT_TO_CLIENT, MAGIC, delivered
from acp_proxy.ui import deepjson
from acp_proxy.ui.events import parse_frame

# The fields a stream event adds to a record line.
STREAM_FIELDS: Final = ("seq", "conn", "info")
UNRECOGNIZED: Final = "[unrecognized response]"


def record_lines(events: Iterable[JsonObject], header: JsonObject | None) -> bytes:
    """A record file (JSON Lines) of ``events``: ``header`` first, then each frame or record
    event line as the recorder wrote it."""
    writer = RecordWriter(header)
    return writer.feed(events)


class RecordWriter:
    """``record_lines`` piece by piece: each ``feed`` returns the lines of its events (the
    header before the first of them)."""

    __slots__ = ("_header",)

    def __init__(self, header: JsonObject | None) -> None:
        self._header = header

    def feed(self, events: Iterable[JsonObject]) -> bytes:
        out = []
        if self._header is not None:
            out.append(_line(self._header))
            self._header = None
        for event in events:
            if event.get("event") in ("session", "hello", "truncated", "cutoff"):
                continue
            out.append(_line({k: v for k, v in event.items() if k not in STREAM_FIELDS}))
        return ("\n".join(out) + "\n").encode("utf-8") if out else b""


def _line(obj: JsonObject) -> str:
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        return deepjson.encode(obj, None, deepjson._pretty_leaf).decode("utf-8")


def is_header(obj: JsonObject) -> bool:
    return MAGIC in obj


def zed_messages(events: Iterable[JsonObject]) -> list[JsonValue]:
    """The messages of ``events`` as Zed's "Copy All Messages" lists them."""
    return ZedWriter().messages(events)


class ZedWriter:
    """``zed_json`` piece by piece: ``feed`` returns the array's elements for its events (the
    opening bracket before the first), ``close`` what ends the array. A response is joined to
    its request across pieces."""

    __slots__ = ("_methods", "_started")

    def __init__(self) -> None:
        self._methods: dict[tuple[str, str], str] = {}  # (direction of the request, id) -> method
        self._started = False

    def messages(self, events: Iterable[JsonObject]) -> list[JsonValue]:
        """The Zed messages of ``events`` (requests remembered for the responses after)."""
        methods = self._methods
        out: list[JsonValue] = []
        for event in events:
            direction = event.get("dir")
            if not isinstance(direction, str) or event.get("kind", "message") != "message":
                continue
            incoming = direction == AGENT_TO_CLIENT
            for frame in delivered(event):
                message = parse_frame(frame)
                if not isinstance(message, dict):
                    continue
                method = message.get("method")
                key_id = json.dumps(message.get("id"))
                if isinstance(method, str):
                    kind = "request" if "id" in message else "notification"
                    if kind == "request":
                        methods[(direction, key_id)] = method
                    body = message.get("params")
                elif "id" in message and ("result" in message or "error" in message):
                    kind = "response"
                    other = "client_to_agent" if incoming else AGENT_TO_CLIENT
                    method = methods.pop((other, key_id), UNRECOGNIZED)
                    body = message["error"] if "error" in message else message.get("result")
                else:
                    continue
                out.append(
                    {
                        "_direction": "incoming" if incoming else "outgoing",
                        "_type": kind,
                        "id": message.get("id"),
                        "method": method,
                        "params": body,
                    }
                )
        return out

    def feed(self, events: Iterable[JsonObject]) -> bytes:
        """The next elements of the array, as ``json.dumps(..., indent=2)`` lays them out."""
        out = []
        for message in self.messages(events):
            text = deepjson.pretty(message, 2).replace(b"\n", b"\n  ")
            out.append((b",\n  " if self._started else b"[\n  ") + text)
            self._started = True
        return b"".join(out)

    def close(self) -> bytes:
        return b"\n]" if self._started else b"[]"


def zed_json(events: Iterable[JsonObject]) -> bytes:
    """``zed_messages`` as the pretty JSON Zed copies (two-space indent)."""
    writer = ZedWriter()
    return writer.feed(events) + writer.close()
