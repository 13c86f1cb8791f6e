"""Tests for acp_proxy.wire.framing: newline framing with a bounded line size, and head id reading."""

# ruff: noqa: E501 - wire bytes and their tables read best on one line each

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.wire.framing import (
    HEAD_BYTES,
    Block,
    HeadInfo,
    Line,
    LineSplitter,
    Oversize,
    read_request_id,
    read_response_id,
    scan_head,
)

Event = Line | Oversize


def run(chunks: list[bytes], limit: int = 64) -> list[Event]:
    splitter = LineSplitter(limit)
    out: list[Event] = []
    for chunk in chunks:
        out.extend(splitter.feed(chunk))
    out.extend(splitter.end())
    return out


def reference(stream: bytes, limit: int) -> list[Event]:
    """The obvious (unbounded) model of the splitter's output."""
    out: list[Event] = []
    for line in stream.split(b"\n"):
        if len(line) > limit:
            out.append(Oversize(len(line), line[:HEAD_BYTES], limit))
        elif line.strip(b" \t\r\n\x0b\x0c"):
            out.append(Line(line))
    return out


# --- table: (chunks, limit, expected events) --------------------------------------------------

L = Line
CASES: list[tuple[str, list[bytes], int, list[Event]]] = [
    ("one line", [b'{"a":1}\n'], 64, [L(b'{"a":1}')]),
    ("two lines one chunk", [b"a\nb\n"], 64, [L(b"a"), L(b"b")]),
    ("CRLF kept", [b'{"a":1}\r\n{"b":2}\r\n'], 64, [L(b'{"a":1}\r'), L(b'{"b":2}\r')]),
    ("empty lines dropped", [b"\n\n\na\n\n"], 64, [L(b"a")]),
    ("whitespace lines dropped", [b"  \n\t\r\n \x0b\x0c\na\n"], 64, [L(b"a")]),
    ("inner whitespace kept", [b" a b \n"], 64, [L(b" a b ")]),
    ("EOF without newline", [b"a\nlast"], 64, [L(b"a"), L(b"last")]),
    ("EOF whitespace tail dropped", [b"a\n  "], 64, [L(b"a")]),
    ("split across chunks", [b'{"a"', b":", b'1}\n{"b', b'":2}'], 64, [L(b'{"a":1}'), L(b'{"b":2}')]),
    ("newline alone chunk", [b"ab", b"\n", b"cd", b"\n"], 64, [L(b"ab"), L(b"cd")]),
    ("just under limit", [b"x" * 9 + b"\n"], 10, [L(b"x" * 9)]),
    ("at limit", [b"x" * 10 + b"\n"], 10, [L(b"x" * 10)]),
    ("over limit", [b"x" * 11 + b"\ny\n"], 10, [Oversize(11, b"x" * 11, 10), L(b"y")]),
    ("at limit, CR counts", [b"x" * 9 + b"\r\n"], 10, [L(b"x" * 9 + b"\r")]),
    ("over limit by CR", [b"x" * 10 + b"\r\n"], 10, [Oversize(11, b"x" * 10 + b"\r", 10)]),
    ("at limit across chunks", [b"x" * 6, b"x" * 4, b"\n"], 10, [L(b"x" * 10)]),
    ("over limit across chunks", [b"x" * 6, b"x" * 5, b"\ny"], 10, [Oversize(11, b"x" * 11, 10), L(b"y")]),
    ("oversize then more chunks", [b"x" * 8, b"x" * 8, b"x" * 8, b"\nz\n"], 10, [Oversize(24, b"x" * 24, 10), L(b"z")]),
    ("oversize at EOF", [b"a\n", b"x" * 30], 10, [L(b"a"), Oversize(30, b"x" * 30, 10)]),
    ("big chunk with many lines", [b"ab\n" + b"y" * 25 + b"\ncd\n"], 10, [L(b"ab"), Oversize(25, b"y" * 25, 10), L(b"cd")]),
    ("invalid utf-8 kept", [b"\xff\xfe{\n"], 64, [L(b"\xff\xfe{")]),
    ("nul bytes kept", [b"a\x00b\n"], 64, [L(b"a\x00b")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("chunks", "limit", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_split_table(chunks: list[bytes], limit: int, expected: list[Event]) -> None:
    assert run(chunks, limit) == expected


def test_feed_returns_only_completed_lines() -> None:
    splitter = LineSplitter(64)
    assert splitter.feed(b'{"a"') == []
    assert splitter.feed(b":1}") == []
    assert splitter.feed(b"\n") == [Line(b'{"a":1}')]
    assert splitter.feed(b"") == []
    assert splitter.end() == []


def test_end_resets_state() -> None:
    splitter = LineSplitter(4)
    assert splitter.feed(b"xxxxxxx") == []
    assert splitter.end() == [Oversize(7, b"xxxxxxx", 4)]
    assert splitter.feed(b"ab\n") == [Line(b"ab")]
    assert splitter.buffered == 0


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_frame_bytes must be positive"):
        LineSplitter(0)


def test_oversize_head_is_capped() -> None:
    limit = 10_000
    line = bytes(range(11, 256)) * 100  # 24_500 bytes, no newline
    events = run([line[:5000], line[5000:12000], line[12000:], b"\nok\n"], limit)
    assert events == [Oversize(len(line), line[:HEAD_BYTES], limit), Line(b"ok")]


@pytest.mark.parametrize("chunk_size", [1, 7, 1000, 4096, 65536])
def test_memory_bounded(chunk_size: int) -> None:
    """The pending line never holds more than max(limit, HEAD_BYTES) bytes, whatever the chunks."""
    limit = 5000
    line = b'{"jsonrpc":"2.0","id":1,"method":"m","params":"' + b"z" * 200_000 + b'"}'
    stream = line + b"\n" + b"x" * (limit - 1) + b"\n"
    splitter = LineSplitter(limit)
    events: list[Event] = []
    peak = 0
    for i in range(0, len(stream), chunk_size):
        events.extend(splitter.feed(stream[i : i + chunk_size]))
        peak = max(peak, splitter.buffered)
        assert splitter.buffered <= max(limit, HEAD_BYTES)
    events.extend(splitter.end())
    assert events == [Oversize(len(line), line[:HEAD_BYTES], limit), Line(b"x" * (limit - 1))]
    assert peak > 0


def test_partial_lines_are_kept_as_parts() -> None:
    """Feeding a line byte by byte stays linear: the parts are joined once."""
    splitter = LineSplitter(1 << 20)
    line = b"a" * 20_000
    for i in range(len(line)):
        assert splitter.feed(line[i : i + 1]) == []
    assert splitter.buffered == len(line)
    assert splitter.feed(b"\n") == [Line(line)]
    assert splitter.buffered == 0


_bytes_alphabet = st.sampled_from([b"\n", b"\r", b" ", b"{", b"}", b"a", b"\xff", b"\n\n"])
_streams = st.lists(_bytes_alphabet, max_size=120).map(b"".join) | st.binary(max_size=300)


@settings(max_examples=300, deadline=None)
@given(
    stream=_streams,
    cuts=st.lists(st.integers(min_value=0, max_value=300)),
    limit=st.integers(1, 40),
)
def test_any_chunking_gives_the_same_events(stream: bytes, cuts: list[int], limit: int) -> None:
    points = sorted({c for c in cuts if c <= len(stream)} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]
    expected = reference(stream, limit)
    assert run(chunks, limit) == expected
    assert run([stream], limit) == expected


def reference_text(stream: bytes, limit: int, head: int) -> list[Event]:
    """The model of a splitter with ``blank_lines`` and ``head_bytes``: every line counts, even
    an empty one; only the empty rest after the last newline is no line."""
    pieces = stream.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    return [
        Oversize(len(line), line[:head], limit) if len(line) > limit else Line(line)
        for line in pieces
    ]


@settings(max_examples=300, deadline=None)
@given(
    stream=_streams,
    cuts=st.lists(st.integers(min_value=0, max_value=300)),
    limit=st.integers(1, 40),
    head=st.integers(1, 50),
    blocks=st.booleans(),
)
def test_blank_lines_and_a_longer_head_under_any_chunking(
    stream: bytes, cuts: list[int], limit: int, head: int, blocks: bool
) -> None:
    """For text that is not a protocol stream (a record file, a stderr): blank lines are lines,
    an oversize line keeps ``head_bytes`` of its start, and ``feed_blocks`` gives what ``feed``
    gives."""
    points = sorted({c for c in cuts if c <= len(stream)} | {0, len(stream)})
    splitter = LineSplitter(limit, blank_lines=True, head_bytes=head)
    got: list[object] = []
    for a, b in itertools.pairwise(points):
        got.extend((splitter.feed_blocks if blocks else splitter.feed)(stream[a:b]))
        assert splitter.buffered <= max(limit, head)
    got.extend(splitter.end())
    assert got == reference_text(stream, limit, head)


def test_blank_lines_table() -> None:
    splitter = LineSplitter(4, blank_lines=True, head_bytes=6)
    assert splitter.feed(b"\n \r\nab\n") == [Line(b""), Line(b" \r"), Line(b"ab")]
    assert splitter.feed(b"abcdefgh") == []
    assert splitter.feed(b"ij\n  ") == [Oversize(10, b"abcdef", 4)]
    assert splitter.end() == [Line(b"  ")]


# --- reading the id of a truncated request ------------------------------------------------------

ID_CASES: list[tuple[str, bytes, tuple[bool, JsonValue]]] = [
    ("id before method", b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"prompt":[{"text":"aaa', (True, 7)),
    ("id after method", b'{"jsonrpc":"2.0","method":"session/prompt","id":"r-1","params":{"x', (True, "r-1")),
    ("id after params", b'{"jsonrpc":"2.0","method":"fs/write","params":{"a":[1,{"b":"}"}]},"id":3,"x":"', (True, 3)),
    ("null id", b'{"id":null,"method":"m","params":"', (True, None)),
    ("big integer id kept exact", b'{"id":123456789012345678901234567890,"method":"m","params":"', (True, 123456789012345678901234567890)),
    ("whitespace", b' \r\n{ "id" : 5 ,\n "method" : "m", "params": {"', (True, 5)),
    ("escaped key", b'{"\\u0069d":9,"method":"m","params":"', (True, 9)),
    ("notification", b'{"jsonrpc":"2.0","method":"session/update","params":{"id":4,"x":"', (False, None)),
    ("id not yet read", b'{"jsonrpc":"2.0","method":"m","params":{"a":"', (False, None)),
    ("id cut", b'{"method":"m","id":"abc', (False, None)),
    ("number id may be cut", b'{"method":"m","id":12', (False, None)),
    ("method after the cut", b'{"jsonrpc":"2.0","id":1,"params":{"a":"', (False, None)),
    ("response", b'{"jsonrpc":"2.0","id":1,"result":{"content":"', (False, None)),
    ("array", b'[{"id":1,"method":"m"', (False, None)),
    ("not json", b"hello world", (False, None)),
    ("empty", b"", (False, None)),
    ("object id is not an id", b'{"id":{"a":1},"method":"m","params":"', (False, None)),
    ("bool id is not an id", b'{"id":true,"method":"m","params":"', (False, None)),
    ("cut inside utf-8", '{"id":"é","method":"m","params":"日本'.encode()[:-1], (True, "é")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("head", "expected"), [c[1:] for c in ID_CASES], ids=[c[0] for c in ID_CASES]
)
def test_read_request_id(head: bytes, expected: tuple[bool, JsonValue]) -> None:
    assert read_request_id(head) == expected


RESPONSE_CASES: list[tuple[str, bytes, tuple[bool, JsonValue]]] = [
    ("result after id", b'{"jsonrpc":"2.0","id":4,"result":{"content":"aaaa', (True, 4)),
    ("error", b'{"jsonrpc":"2.0","id":"x","error":{"code":-1,"message":"aaa', (True, "x")),
    ("id after result is cut", b'{"jsonrpc":"2.0","result":{"content":"aaaa', (False, None)),
    ("request is not a response", b'{"id":4,"method":"m","result":{"a":"', (False, None)),
    ("no result key yet", b'{"jsonrpc":"2.0","id":4', (False, None)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("head", "expected"), [c[1:] for c in RESPONSE_CASES], ids=[c[0] for c in RESPONSE_CASES]
)
def test_read_response_id(head: bytes, expected: tuple[bool, JsonValue]) -> None:
    assert read_response_id(head) == expected


def test_scan_head_reports_keys_seen() -> None:
    info = scan_head(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"')
    assert info == HeadInfo(frozenset({"jsonrpc", "id", "method", "params"}), True, 1, b"1", "m")
    assert scan_head(b"[1,2]") == HeadInfo(frozenset(), False, None)


def test_scan_head_keeps_the_id_bytes_exactly() -> None:
    # Error replies echo the request id's original bytes (2**64 + 1 is no float).
    for spelled in (b"18446744073709551617", b"-0", b"1E2", b'"\\u00e9"', b"null"):
        info = scan_head(b'{"id":' + spelled + b',"method":"session/prompt","params":{')
        assert info.has_id and info.id_bytes == spelled
        assert info.method == "session/prompt"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_read_request_id_never_raises(head: bytes) -> None:
    found, rid = read_request_id(head)
    assert found or rid is None


def test_scan_head_survives_a_deeply_nested_head() -> None:
    # A hostile head nested deeper than the standard decoder goes used to raise RecursionError
    # out of the pipeline and take the whole proxy down (found by the fault tests).
    head = b'{"jsonrpc":"2.0","result":' + b"[" * 2000
    assert scan_head(head).keys == frozenset({"jsonrpc", "result"})
    assert read_response_id(head) == (False, None)


@pytest.mark.parametrize(
    ("pending", "data", "expected"),
    [
        (b"", b'{"a":1}\n', b'{"a":1}'),
        (b"", b' {"a":1}\n', b' {"a":1}'),  # the per-line path diverts or forwards it
        (b"", b"\n", None),  # blank: nothing to handle
        (b"", b"  \n", None),
        (b"", b'{"a":1}', None),  # not complete
        (b"", b'{"a":1}\n{"b":2}\n', None),  # two lines: a block
        (b'{"a":', b"1}\n", None),  # completes a pending line
        (b"", b"x" * 20 + b"\n", None),  # over the limit (16 here)
    ],
)
def test_single_line_is_one_complete_line_and_nothing_pending(
    pending: bytes, data: bytes, expected: bytes | None
) -> None:
    splitter = LineSplitter(max_frame_bytes=16)
    splitter.feed(pending)
    before = splitter.buffered
    assert splitter.single_line(data) == expected
    assert splitter.buffered == before  # nothing consumed either way


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(
        st.sampled_from(
            [
                b'{"a":1}\n',
                b"\n",
                b" \n",
                b'{"b"',
                b":2}\n",
                b"x" * 30 + b"\n",
                b'{"c":3}\n{"d":4}\n',
            ]
        ),
        max_size=12,
    )
)
def test_single_line_then_feed_blocks_gives_feeds_events(chunks: list[bytes]) -> None:
    """The runtime's read loop: ``single_line`` first, ``feed_blocks`` when it declines; the
    lines are those ``feed`` gives for the same chunks."""
    fast, slow = LineSplitter(max_frame_bytes=24), LineSplitter(max_frame_bytes=24)
    got: list[object] = []
    want: list[object] = []
    for chunk in chunks:
        line = fast.single_line(chunk)
        if line is not None:
            got.append(Line(line))
        else:
            for event in fast.feed_blocks(chunk):
                got.extend(event.lines() if isinstance(event, Block) else [event])
        want.extend(slow.feed(chunk))
    got.extend(fast.end())
    want.extend(slow.end())
    assert got == want
