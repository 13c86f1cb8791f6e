"""The chunks of ``show --state``'s client state, left in the record file.

Contract: pure. A long message is many chunks, each appended to the state: ``referenced`` puts a
``ChunkRef`` (where its message is in the record file) in a chunk's place before the state
model appends it, and ``chunk_value`` reads the value back from that line when the state is
printed. The model only appends a chunk's value, never looks into it, so the state it builds is
the same; memory holds a reference per chunk instead of its parsed text. No I/O: reading the
line again is the caller's.
"""

from __future__ import annotations

import json
import struct
from typing import cast

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.meta.registry import CHUNK_KINDS, session_update_kind
from acp_proxy.record.format import delivered, read_line

# Where a received message is: its line's offset in the file, the frame of the line (the
# frames the client received from it) and the message of that frame (a batch).
Where = tuple[int, int, int]
_WHERE = struct.Struct(">QBB")


class ChunkRef(bytes):
    """A chunk's appended value, left in the record file: where the message that carried it
    is (``where``; ``chunk_value`` reads the value back). The client's state keeps one of
    these per chunk instead of the value: 10 bytes (some 45 in memory), so a message of a
    million chunks costs tens of MB, not its text as parsed objects. Bytes, so that no JSON
    encoder takes it for a value: the state's writer must resolve it."""

    __slots__ = ()

    @classmethod
    def at(cls, where: Where) -> ChunkRef | None:
        """The reference to ``where``; None past what it can say (a frame or message index
        above 255: the value is kept as it is)."""
        offset, frame, message = where
        if frame > 0xFF or message > 0xFF or offset < 0:
            return None
        return cls(_WHERE.pack(offset, frame, message))

    @property
    def where(self) -> Where:
        offset, frame, message = _WHERE.unpack(self)
        return offset, frame, message


def chunk_value(line: bytes, ref: ChunkRef, version: int) -> JsonValue:
    """The value ``ref`` stands for, read from its line (``version``: the state's protocol
    version); ``None`` when the line is no longer the one it was read from."""
    _offset, f, m = ref.where
    entry = read_line(line)
    if isinstance(entry, str):
        return None
    frames = delivered(entry)
    if f >= len(frames):
        return None
    try:
        value = json.loads(frames[f])
    except (ValueError, RecursionError):
        return None
    messages = value if isinstance(value, list) else [value]
    message = messages[m] if m < len(messages) else None
    if not isinstance(message, dict):
        return None
    kind = session_update_kind(message)
    chunk = CHUNK_KINDS[version].get(kind) if kind is not None else None
    params = message.get("params")
    update = params.get("update") if isinstance(params, dict) else None
    if chunk is None or not isinstance(update, dict):
        return None
    return update.get(chunk.value_field)


def referenced(message: JsonObject, version: int, where: Where) -> JsonObject:
    """``message`` with its chunk's value replaced by a ``ChunkRef`` to ``where`` (a message
    that is not a chunk, or has no value, as it is). A new object: the message itself is
    never changed."""
    kind = session_update_kind(message)
    chunk = CHUNK_KINDS[version].get(kind) if kind is not None else None
    if chunk is None:
        return message
    params = message["params"]
    assert isinstance(params, dict)
    update = params["update"]
    assert isinstance(update, dict)
    ref = ChunkRef.at(where)
    if chunk.value_field not in update or ref is None:
        return message
    # Not a JSON value: it stands for one (the state's writer reads it back), and the model
    # only appends a chunk's value, never looks into it.
    place = cast(JsonValue, ref)
    return {**message, "params": {**params, "update": {**update, chunk.value_field: place}}}


__all__ = ["ChunkRef", "Where", "chunk_value", "referenced"]
