"""Writing frames without joining them (``acp_proxy.wire.written``): every operation equals
the same one on the joined bytes, the way the outbox did it before it stopped joining."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.written import (
    after_written,
    frames_size,
    line_end_within,
    parts_of,
)

LINE = st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"x"))


@st.composite
def frames(draw: st.DrawFn) -> list[OutFrame]:
    out = []
    for lines in draw(st.lists(st.lists(LINE, min_size=1, max_size=4), max_size=5)):
        known = draw(st.booleans())
        out.append(OutFrame(b"\n".join(lines), None, 2, len(lines) if known else 0))
    return out


def joined(fs: list[OutFrame]) -> bytes:
    return b"".join(f.raw + b"\n" for f in fs)


@settings(max_examples=300, deadline=None)
@given(frames(), st.data())
def test_parts_and_line_ends_equal_the_joined_bytes(
    fs: list[OutFrame], data: st.DataObject
) -> None:
    stream = joined(fs)
    assert frames_size(fs) == len(stream)
    upto = data.draw(st.integers(0, len(stream)))
    parts = parts_of(fs, upto)
    assert b"".join(bytes(p) for p in parts) == stream[:upto]
    assert len(parts) <= 2 * len(fs)
    # Whole frames go as the very objects they are (no copy).
    whole = [p for p in parts if isinstance(p, bytes) and p != b"\n"]
    assert all(any(p is f.raw for f in fs) for p in whole)
    limit = data.draw(st.integers(0, len(stream) + 2))
    assert line_end_within(fs, limit) == stream.rfind(b"\n", 0, limit) + 1


@settings(max_examples=300, deadline=None)
@given(frames(), st.data())
def test_what_a_partial_write_leaves_is_the_cut_line_then_whole_lines(
    fs: list[OutFrame], data: st.DataObject
) -> None:
    stream = joined(fs)
    written = data.draw(st.integers(0, len(stream)))
    tail, rest = after_written(fs, written)
    cut = written if written == 0 or stream[written - 1] == 10 else stream.find(b"\n", written) + 1
    if written == len(stream):
        cut = written
    # What the outbox did on the joined bytes: the tail is the rest of the cut line, the queue
    # gets every whole line after it, as they came.
    assert b"".join(bytes(p) for p in tail) == stream[written:cut]
    assert joined(rest) == stream[cut:]
    for frame in rest:
        assert frame.lines in (0, frame.raw.count(b"\n") + 1)
        assert frame.version == 2
    untouched = [f for f in rest if any(f is g for g in fs)]
    assert len(untouched) >= len(rest) - 1  # only a frame the write cut inside is new


def test_a_write_cut_just_before_a_frame_s_newline_leaves_only_the_newline() -> None:
    fs = [OutFrame(b"ab\ncd", None, 2, 2), OutFrame(b"ef", None, 2, 1)]
    tail, rest = after_written(fs, 5)
    assert tail == [b"\n"] and rest == [fs[1]] and rest[0] is fs[1]
    tail, rest = after_written(fs, 3)  # at the line boundary inside the first frame
    assert tail == [] and [f.raw for f in rest] == [b"cd", b"ef"] and rest[0].lines == 1
    tail, rest = after_written(fs, 4)
    assert [bytes(p) for p in tail] == [b"d", b"\n"] and rest == [fs[1]]
