"""The record format (version 1) and redaction: what one line of a session record holds.

Contract: pure functions from what the proxy observed (``Observed`` notes, generated frames, the
session's end) to the bytes of one record line, and back (``read_line``, which says why a line
cannot be used). Redaction (``acp_proxy.record.redact``, whose names are exported here too)
happens here, before anything leaves the process; the wire is never touched (the proxy
forwards its own copy of each frame, never the record's). The format is documented in
``docs/recording.md`` and in ``config/record.schema.json``; change either only with
``FORMAT_VERSION``.

A line is one JSON object:

- the header (first line): ``{"acp-proxy-record": 1, "started": ISO-8601, "version": ...,
  "agent": argv | null, "connect": address | null, "config": path | null, "rules": [...],
  "rule_keys": {rule: [entity _meta keys it writes]} (when rules write any), "middleware":
  [...], "conn": id | null, "redaction": {...}}``;
- a frame: ``{"t": seconds since start, "dir": "client_to_agent" | "agent_to_client",
  "raw": text}`` (``raw_b64`` instead of ``raw`` when the frame is not UTF-8), plus ``"sent"``
  (the frames the proxy wrote instead; ``[]``: dropped or diverted) and ``"changed_by"`` when
  the proxy did not forward it as it came, ``"kind"`` when it is not one JSON-RPC message,
  ``"generated": true`` for a frame the proxy wrote on its own (an error reply, a -32603 for a
  request left in flight), ``"redacted": true`` when redaction changed it;
- an event: ``{"t": ..., "event": "version", "protocolVersion": N}``,
  ``{"t": ..., "event": "end", "exit": {...} | null, "protocolVersion": N | null,
  "summary": {...}}`` (the trailer), ``{"t": ..., "event": "stopped", "reason": ...}`` (the size
  limit was reached: nothing follows), ``{"t": ..., "event": "lost", "frames": N}`` (the file did
  not take N lines, which were dropped rather than slow the session down).

A file may hold several sessions: each header starts one (``--record`` to the same file again).
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from typing import Final

import orjson

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.record import settings
from acp_proxy.record.redact import (
    DEFAULT_REDACT_KEYS,
    DEFAULT_REDACT_PATTERNS,
    REDACTED,
    UNREADABLE,
    Redactor,
)

FORMAT_VERSION: Final = 1
MAGIC: Final = "acp-proxy-record"
CLIENT_TO_AGENT: Final = "client_to_agent"
AGENT_TO_CLIENT: Final = "agent_to_client"

# Defined with the settings (Config names them without importing this module); their public
# home stays here.
DEFAULT_MAX_BYTES: Final = settings.DEFAULT_MAX_BYTES
RecordConfig = settings.RecordConfig
__all__ = [
    "AGENT_TO_CLIENT",
    "CLIENT_TO_AGENT",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_REDACT_KEYS",
    "DEFAULT_REDACT_PATTERNS",
    "FORMAT_VERSION",
    "MAGIC",
    "REDACTED",
    "UNREADABLE",
    "RecordConfig",
    "RecordError",
    "Redactor",
    "delivered",
    "entry_problem",
    "event_line",
    "frame_bytes",
    "frame_entry",
    "frame_line",
    "header",
    "is_header",
    "parse_header",
    "parse_line",
    "read_line",
    "sent_bytes",
]


def _dumps(obj: Mapping[str, object]) -> bytes:
    return orjson.dumps(obj) + b"\n"


def header(
    *,
    started: str,
    version: str,
    agent: Sequence[str] | None,
    connect: str | None,
    config: str | None,
    rules: Sequence[str],
    middleware: Sequence[str],
    rule_keys: Mapping[str, Sequence[str]] | None = None,
    conn: int | None,
    redactor: Redactor,
    extra_keys: Sequence[str] = (),
    extra_patterns: Sequence[str] = (),
) -> bytes:
    """The first line of a record."""
    return _dumps(
        {
            MAGIC: FORMAT_VERSION,
            "started": started,
            "version": version,
            "agent": list(agent) if agent is not None else None,
            "connect": connect,
            "config": config,
            "rules": list(rules),
            **({"rule_keys": {k: list(v) for k, v in rule_keys.items()}} if rule_keys else {}),
            "middleware": list(middleware),
            "conn": conn,
            "redaction": {
                "keys": sorted(redactor.keys),
                "patterns": len(redactor.patterns),
                "extra_keys": list(extra_keys),
                "extra_patterns": len(extra_patterns),
            },
        }
    )


def _text_or_b64(frame: bytes, redactor: Redactor | None) -> tuple[JsonValue, bool]:
    cleaned, changed = redactor.frame(frame) if redactor is not None else (frame, False)
    try:
        return cleaned.decode("utf-8"), changed
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(cleaned).decode("ascii")}, changed


def frame_line(
    t: float,
    direction: str,
    raw: bytes,
    redactor: Redactor,
    *,
    sent: Sequence[bytes] | None = None,
    changed_by: Sequence[str] = (),
    kind: str = "message",
    generated: bool = False,
) -> bytes:
    """One frame's line (see the module docstring)."""
    obj, _ = frame_entry(
        t,
        direction,
        raw,
        redactor,
        sent=sent,
        changed_by=changed_by,
        kind=kind,
        generated=generated,
    )
    return _dumps(obj)


def frame_entry(
    t: float,
    direction: str,
    raw: bytes,
    redactor: Redactor | None,
    *,
    sent: Sequence[bytes] | None = None,
    changed_by: Sequence[str] = (),
    kind: str = "message",
    generated: bool = False,
) -> tuple[JsonObject, bytes]:
    """The object of one frame's line (what ``frame_line`` encodes) and the frame's bytes as
    recorded (redacted). ``redactor=None``: the caller's screen (``Redactor.clean``) found
    nothing to redact in ``raw`` nor ``sent``."""
    cleaned, redacted = redactor.frame(raw) if redactor is not None else (raw, False)
    obj: JsonObject = {"t": round(t, 6), "dir": direction}
    try:
        obj["raw"] = cleaned.decode("utf-8")
    except UnicodeDecodeError:
        obj["raw_b64"] = base64.b64encode(cleaned).decode("ascii")
    if sent is not None:
        frames: list[JsonValue] = []
        for frame in sent:
            text, changed = _text_or_b64(frame, redactor)
            frames.append(text)
            redacted = redacted or changed
        obj["sent"] = frames
        obj["changed_by"] = list(changed_by)
    if kind != "message":
        obj["kind"] = kind
    if generated:
        obj["generated"] = True
    if redacted:
        obj["redacted"] = True
    return obj, cleaned


def event_line(t: float, event: str, **fields: object) -> bytes:
    """An event line (``version``, ``end``, ``stopped``, ``lost``)."""
    return _dumps({"t": round(t, 6), "event": event, **fields})


# --- reading -------------------------------------------------------------------------------------


class RecordError(ValueError):
    """A file that is not a record (or of a later format version)."""


def parse_header(line: bytes | str) -> JsonObject:
    """The header's object; ``RecordError`` when ``line`` is not a version-1 header."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"not a record: the first line is not JSON ({exc})") from None
    if not isinstance(obj, dict) or MAGIC not in obj:
        raise RecordError(f'not a record: the first line has no "{MAGIC}" key')
    if obj[MAGIC] != FORMAT_VERSION:
        raise RecordError(
            f"record format version {obj[MAGIC]!r}; this acp-proxy reads version {FORMAT_VERSION}"
        )
    return obj


def is_header(entry: Mapping[str, JsonValue]) -> bool:
    """Whether a parsed line is a header (it starts a session of the file)."""
    return MAGIC in entry


def _b64_ok(text: JsonValue) -> bool:
    if not isinstance(text, str):
        return False
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _number(value: JsonValue) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def entry_problem(entry: Mapping[str, JsonValue]) -> str | None:
    """Why a parsed frame or event line cannot be used (``None``: it can).

    A frame needs a finite number ``t`` (not negative), a known ``dir``, exactly one of ``raw``
    (a string) and ``raw_b64`` (valid base64); ``sent``, when present, a list of strings and
    ``{"b64": ...}``; ``changed_by`` a list of strings; ``kind`` a string; ``generated`` and
    ``redacted`` true or false. An event needs ``t`` and a string ``event``.
    """
    t = entry.get("t")
    if not _number(t):
        return '"t" is not a number'
    assert isinstance(t, int | float)
    if t < 0:
        return '"t" is negative'
    if "event" in entry:
        return None if isinstance(entry["event"], str) else '"event" is not a string'
    direction = entry.get("dir")
    if direction not in (CLIENT_TO_AGENT, AGENT_TO_CLIENT):
        return 'neither a frame (no known "dir") nor an event'
    if "raw" in entry and "raw_b64" in entry:
        return 'a frame with both "raw" and "raw_b64"'
    if "kind" in entry and not isinstance(entry["kind"], str):
        return '"kind" is not a string'
    for flag in ("generated", "redacted"):
        if flag in entry and not isinstance(entry[flag], bool):
            return f'"{flag}" is not true or false'
    if "raw" in entry:
        if not isinstance(entry["raw"], str):
            return '"raw" is not a string'
    elif "raw_b64" in entry:
        if not _b64_ok(entry["raw_b64"]):
            return '"raw_b64" is not valid base64'
    else:
        return 'a frame with neither "raw" nor "raw_b64"'
    sent = entry.get("sent")
    if sent is not None:
        if not isinstance(sent, list):
            return '"sent" is not a list'
        for item in sent:
            if not isinstance(item, str) and not (
                isinstance(item, dict) and _b64_ok(item.get("b64"))
            ):
                return '"sent" holds an item that is neither a string nor valid {"b64": ...}'
    changed_by = entry.get("changed_by")
    if changed_by is not None and not (
        isinstance(changed_by, list) and all(isinstance(c, str) for c in changed_by)
    ):
        return '"changed_by" is not a list of strings'
    return None


def read_line(line: bytes) -> JsonObject | str:
    """A frame or event line's object, or why it cannot be used (not JSON, not an object, a
    field of the wrong type: see ``entry_problem``). A header is returned as it is.
    ``MemoryError`` when the line does not fit in memory."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        _out_of_memory(exc)
        if not line.strip():
            return "an empty line"
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return "not UTF-8 text"
        return f"not JSON ({exc.msg})"
    if not isinstance(obj, dict):
        return "not a JSON object"
    if MAGIC in obj:
        return obj
    problem = entry_problem(obj)
    return obj if problem is None else problem


def parse_line(line: bytes | str) -> JsonObject | None:
    """A frame or event line's object; ``None`` for a torn last line (a crash mid-write)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        _out_of_memory(exc)
        return None
    return obj if isinstance(obj, dict) else None


def _out_of_memory(exc: orjson.JSONDecodeError) -> None:
    """Raise ``MemoryError`` for the parser's failure to allocate: a line that did not fit in
    memory is no malformed line (orjson says so only in its message)."""
    if "memory" in exc.msg.lower():
        raise MemoryError(exc.msg) from None


def frame_bytes(entry: Mapping[str, JsonValue]) -> bytes:
    """The frame a frame line holds (as recorded, i.e. after redaction); never raises (a field
    of the wrong type or invalid base64 gives ``b""``: use ``read_line`` to be told)."""
    raw = entry.get("raw")
    if isinstance(raw, str):
        return raw.encode("utf-8", "surrogatepass")
    return _b64(entry.get("raw_b64"))


def _b64(text: JsonValue) -> bytes:
    """The bytes of a base64 field; ``b""`` when it is not valid (``entry_problem`` says so)."""
    if not isinstance(text, str):
        return b""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return b""


def sent_bytes(item: JsonValue) -> bytes:
    """One entry of a frame line's ``sent`` list."""
    if isinstance(item, str):
        return item.encode("utf-8", "surrogatepass")
    if isinstance(item, dict):
        return _b64(item.get("b64"))
    return b""


def delivered(entry: Mapping[str, JsonValue]) -> list[bytes]:
    """What the receiver of a frame line got: ``sent`` when present, else the frame itself."""
    sent = entry.get("sent")
    if isinstance(sent, list):
        return [sent_bytes(s) for s in sent]
    return [frame_bytes(entry)]
