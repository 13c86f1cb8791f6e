"""Observation: the notes that describe a frame and its fate (``FrameInfo``, ``Observed``,
``Passed``), for the debug log and the live views.

Contract: pure functions of a frame and what the connection made of it; they change nothing the
frame became, only describe it (the frame's ``FrameInfo`` notes go into its ``Observed``).
"""

from __future__ import annotations

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.connection.tracking import is_id
from acp_proxy.wire.framing import Line, Oversize
from acp_proxy.wire.notes import (
    FrameInfo,
    NonJson,
    Note,
    NotParsed,
    Observed,
    Passed,
    PendingFull,
    Result,
)
from acp_proxy.wire.raw import rawjson
from acp_proxy.wire.raw.prefilter import parse_cost


def observed(
    direction: Direction,
    event: Line | Oversize,
    raw: bytes,
    res: Result,
    described: bool = False,
) -> Result:
    """``res`` (what ``event``, whose bytes or head are ``raw``, became) plus its ``Observed``
    note, after the others (``described``: observing would have described a message of it,
    whether or not ``res`` does)."""
    infos = tuple(n for n in res.notes if type(n) is FrameInfo)
    notes = tuple(n for n in res.notes if type(n) is not FrameInfo)
    if type(event) is Oversize:
        kind = "oversize"
    elif any(type(n) is NotParsed for n in notes):
        kind = "unparsed"
    elif any(type(n) is NonJson for n in notes) and not infos and not described:
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


def watched(direction: Direction, event: Line | Oversize, raw: bytes, res: Result) -> Result:
    """``observed`` for a watching connection: a frame that ``passes`` is one ``Passed`` (what
    the fast paths report of their runs, so that a frame reads the same whichever path it
    took); any other keeps its ``Observed`` (``described``)."""
    if passes(event, raw, res):
        return Result(res.forward, (), (Passed(direction, (raw,), 1),))
    return described(direction, event, raw, res)


def passes(event: Line | Oversize, raw: bytes, res: Result) -> bool:
    """Whether ``res`` forwards ``event`` (whose bytes are ``raw``) exactly as it came, with no
    reply and no note."""
    return (
        not res.notes
        and not res.reply
        and len(res.forward) == 1
        and type(event) is Line
        and res.forward[0].raw == raw
    )


def described(direction: Direction, event: Line | Oversize, raw: bytes, res: Result) -> Result:
    """``observed``, for a watching connection (which describes only the messages a middleware
    ran on: what observing would call the frame is found here)."""
    return observed(direction, event, raw, res, _prefixed(raw, res.notes))


def _prefixed(raw: bytes, notes: tuple[Note, ...]) -> bool:
    """Whether observing describes a message of ``raw`` where watching may not: a line whose
    terminal escapes were diverted (a ``NonJson`` note of its first bytes) and whose rest went
    on, an object (unless refused: its request table was full) or an array holding one."""
    for note in notes:
        if type(note) is NonJson and not note.forwarded and note.size < len(raw):
            rest = rawjson.loads(raw[note.size :])  # (it was parsed: it went on)
            if isinstance(rest, dict):
                return not any(type(n) is PendingFull for n in notes)
            return isinstance(rest, list) and any(isinstance(entry, dict) for entry in rest)
    return False


def passed_kind(raw: bytes, max_parse: int) -> str:
    """The ``kind`` ``observed`` gives a frame that a ``Passed`` note reports (``max_parse``:
    the connection's parse budget). Observing parses every frame: one over the budget or that
    neither parser reads is ``"unparsed"`` (a ``NotParsed`` note); any other such frame leaves
    as it came with no note, a ``"batch"`` or a ``"message"`` by its first byte. (A frame the
    fast paths pass starts like JSON, so observing never diverts one.)"""
    if parse_cost(raw, max_parse) > max_parse:
        return "unparsed"
    try:
        rawjson.loads(raw)
    except rawjson.Unparseable:
        return "unparsed"
    return "batch" if raw.lstrip()[:1] == b"[" else "message"


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
