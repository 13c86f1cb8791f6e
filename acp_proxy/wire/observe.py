"""Observation: the notes that describe a frame and its fate (``FrameInfo``, ``Observed``), for
the debug log and the live views.

Contract: pure functions of a frame and what the connection made of it; they change nothing the
frame became, only describe it (the frame's ``FrameInfo`` notes go into its ``Observed``).
"""

from __future__ import annotations

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.framing import Line, Oversize
from acp_proxy.wire.notes import FrameInfo, NonJson, NotParsed, Observed, Result
from acp_proxy.wire.tracking import is_id


def observed(direction: Direction, event: Line | Oversize, raw: bytes, res: Result) -> Result:
    """``res`` (what ``event``, whose bytes or head are ``raw``, became) plus its ``Observed``
    note, after the others."""
    infos = tuple(n for n in res.notes if type(n) is FrameInfo)
    notes = tuple(n for n in res.notes if type(n) is not FrameInfo)
    if type(event) is Oversize:
        kind = "oversize"
    elif any(type(n) is NotParsed for n in notes):
        kind = "unparsed"
    elif any(type(n) is NonJson for n in notes) and not infos:
        kind = "non-json"
    elif raw.lstrip()[:1] == b"[":
        kind = "batch"
    else:
        kind = "message"
    sent: tuple[bytes, ...] | None = tuple(f.raw for f in res.forward)
    if type(event) is Line and sent == (raw,):
        sent = None  # untouched (the usual case)
    replies = tuple(f.raw for f in res.reply)
    note = Observed(direction, raw, sent, replies, infos, kind)
    return Result(res.forward, res.reply, (*notes, *infos, note))


def frame_info(
    direction: Direction,
    message: JsonObject,
    size: int,
    changed_by: tuple[str, ...],
    answers: dict[JsonValue, str],
    *,
    marks: tuple[object, ...] = (),
) -> FrameInfo:
    """What the debug log and the live views say of a parsed ``message`` (``size`` bytes);
    ``answers``: the methods of the requests the current frame's responses answered."""
    rid = message.get("id")
    rid = rid if is_id(rid) else None
    method = method_of(message)
    answered = None
    if method is None and ("result" in message or "error" in message):
        answered = answers.get(rid)
    return FrameInfo(
        direction, method, rid, update_kind(message), size, changed_by, answered, marks
    )


def method_of(message: JsonObject) -> str | None:
    method = message.get("method")
    return method if isinstance(method, str) else None


def update_kind(message: JsonObject) -> str | None:
    if message.get("method") != "session/update":
        return None
    params = message.get("params")
    update = params.get("update") if isinstance(params, dict) else None
    kind = update.get("sessionUpdate") if isinstance(update, dict) else None
    return kind if isinstance(kind, str) else None
