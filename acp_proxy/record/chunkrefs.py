"""The chunks and events of ``show --state``'s client state, left in the record file.

Contract: pure. A long message is many chunks, each appended to the state: ``referenced`` puts a
``ChunkRef`` (where its message is in the record file) in a chunk's place before the state
model appends it, and ``chunk_value`` reads the value back from that line when the state is
printed. The model only appends a chunk's value, never looks into it, so the state it builds is
the same. The lists the model appends to are ``RefList``s (the model's ``chunk_list`` and
``events``), which keep each reference as 8 bytes in an array, not as an object: a message of
a million chunks costs 8 MB, and a million events (notices, unknown kinds: the model keeps each
whole) as much, not their parsed text (``EventList``, ``event_value``). No I/O: reading the line
again is the caller's.
"""

from __future__ import annotations

import json
import struct
from array import array
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, TypeAlias, cast

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
        above 255, an offset from 256 TiB on: the value is kept as it is)."""
        offset, frame, message = where
        if frame > 0xFF or message > 0xFF or not 0 <= offset < 1 << 48:
            return None
        return cls(_WHERE.pack(offset, frame, message))

    @property
    def where(self) -> Where:
        offset, frame, message = _WHERE.unpack(self)
        return offset, frame, message

    @property
    def packed(self) -> int:
        """The reference as one integer (what a ``RefList`` keeps): offset, frame, message."""
        offset, frame, message = self.where
        return offset << 16 | frame << 8 | message

    @classmethod
    def unpacked(cls, packed: int) -> ChunkRef:
        return cls(_WHERE.pack(packed >> 16, packed >> 8 & 0xFF, packed & 0xFF))


class EventRef(ChunkRef):
    """An event of the client's state (a notice, an unknown or malformed kind, kept whole by
    the model), left in the record file: where its message is (``event_value`` reads it back)."""

    __slots__ = ()


# A segment: plain values, or packed references in an array('Q').
_Segment: TypeAlias = "list[Any] | array[int]"


class _Unreadable:
    """What a ``RefList``'s own list storage holds: no JSON value."""

    __slots__ = ()


_UNREADABLE = _Unreadable()


class RefList(list[Any]):
    """A list of the client's state that keeps each reference (``ref_type``) as 8 bytes in an
    array instead of an object; any other value as it is, in order. To the state model and to
    a JSON encoder it is a list: ``append``, ``len``, iteration (which yields the references
    as objects again, made as they are read). Its elements live in its segments; the list
    object's own storage holds one ``_Unreadable``, so that an encoder reading that storage
    directly (orjson does, for a list subclass) fails instead of writing ``[]``; the stdlib's
    ``json`` iterates the list, as ``show`` does."""

    __slots__ = ("_length", "_segments")
    ref_type: ClassVar[type[ChunkRef]] = ChunkRef

    def __init__(self, values: Iterable[Any] = ()) -> None:
        super().__init__()
        super().append(_UNREADABLE)
        self._segments: list[_Segment] = []
        self._length = 0
        for value in values:
            self.append(value)

    def append(self, value: Any) -> None:
        last = self._segments[-1] if self._segments else None
        if type(value) is self.ref_type:
            if not isinstance(last, array):
                last = array("Q")
                self._segments.append(last)
            last.append(value.packed)
        else:
            if not isinstance(last, list):
                last = []
                self._segments.append(last)
            last.append(value)
        self._length += 1

    def extend(self, values: Iterable[Any]) -> None:
        for value in values:
            self.append(value)

    def __iter__(self) -> Iterator[Any]:
        make = self.ref_type.unpacked
        for segment in self._segments:
            if isinstance(segment, array):
                for packed in segment:
                    yield make(packed)
            else:
                yield from segment

    def __len__(self) -> int:
        return self._length

    def __bool__(self) -> bool:
        return self._length > 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, list) and len(other) == self._length and list(self) == list(other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (list(self),))

    @classmethod
    def of(cls, base: list[Any], value: Any) -> RefList:
        """A new chunk list: ``base`` (a concrete array the chunks continue), then ``value``."""
        out = cls(base)
        out.append(value)
        return out


class EventList(RefList):
    """The model's event list for ``show --state``: an event appended while ``place`` is set
    is kept as an ``EventRef`` to it (the caller sets ``place`` around each message it hands
    to the model); without one, the event itself."""

    __slots__ = ("place",)
    ref_type: ClassVar[type[ChunkRef]] = EventRef

    def __init__(self, values: Iterable[Any] = ()) -> None:
        self.place: Where | None = None
        super().__init__(values)

    def append(self, value: Any) -> None:
        ref = EventRef.at(self.place) if self.place is not None else None
        super().append(value if ref is None else ref)


def _message(line: bytes, ref: ChunkRef) -> JsonObject | None:
    """The message ``ref`` points at in its ``line``; ``None`` when there is none."""
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
    return message if isinstance(message, dict) else None


def event_value(line: bytes, ref: EventRef) -> JsonValue:
    """The event ``ref`` stands for, as the model keeps one (``sessionId`` and ``update``),
    read from its line; ``None`` when the line is no longer the one it was read from."""
    message = _message(line, ref)
    params = message.get("params") if message is not None else None
    if not isinstance(params, dict) or not isinstance(params.get("update"), dict):
        return None
    return {"sessionId": params.get("sessionId"), "update": params["update"]}


def chunk_value(line: bytes, ref: ChunkRef, version: int) -> JsonValue:
    """The value ``ref`` stands for, read from its line (``version``: the state's protocol
    version); ``None`` when the line is no longer the one it was read from."""
    message = _message(line, ref)
    if message is None:
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


__all__ = [
    "ChunkRef",
    "EventList",
    "EventRef",
    "RefList",
    "Where",
    "chunk_value",
    "event_value",
    "referenced",
]
