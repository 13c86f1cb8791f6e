"""Tests of the coalescer's parse-free paths for streamed text chunks.

Without the C accelerator, a text chunk whose bytes repeat the last line of its message's
waiting group around another text literal merges without a parse (``Group.text_of``, the
template); with it, the bytes path merges chunks from their shapes (``coalesce_bytes``). These
tests hold both to the general path byte for byte (the same stream, every line parsed), to the
unmerged stream's client state, and to the index's rules: a barrier, a written group, another
message, another envelope.
"""

from __future__ import annotations

import json

import orjson
import pytest
from coalesce_harness import reduce
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.config import CoalesceConfig
from acp_proxy.wire.coalesce import merge as coalesce_merge
from acp_proxy.wire.coalesce import queue as coalesce
from acp_proxy.wire.coalesce import shape as coalesce_shape
from acp_proxy.wire.coalesce.queue import OutboundQueue, OutFrame

REQ = b'{"jsonrpc":"2.0","id":7,"method":"session/request_permission","params":{"sessionId":"s1"}}'


def chunk(text: str, mid: str = "m1", kind: str = "agent_message_chunk") -> bytes:
    content: JsonObject = {"type": "text", "text": text}
    update = {"sessionUpdate": kind, "messageId": mid, "content": content}
    return orjson.dumps(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": "s1", "update": update},
        }
    )


def waited(frames: list[bytes]) -> list[bytes]:
    """Push every frame while the writer is busy, then take: the frames written, one each."""
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    for raw in frames:
        queue.push(OutFrame(raw, None, 2), 0.0)
    out, _ = queue.take(0.0)
    return [line for run in out for line in run[:-1].split(b"\n")]


def test_a_streamed_reply_is_parsed_twice_then_only_its_texts(
    parses: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coalesce, "BYTES_PATH", False)  # (without the accelerator)
    texts = ["Hel", "lo, ", 'a "quote"', "\\ and\n", "déjà ✓", "!"]
    frames = [chunk(t) for t in texts]
    assert waited(frames) == [chunk("".join(texts))]
    # The first two lines open the group (each parsed once, the first again to open it); the
    # later ones only have their text literal decoded; the frame is encoded without a parse.
    full = [p for p in parses if p.startswith(b"{")]
    assert full == [frames[0], frames[1], frames[0]]
    assert [p for p in parses if not p.startswith(b"{")] == [orjson.dumps(t) for t in texts[2:]]


def test_a_streamed_reply_on_the_bytes_path_is_scanned_and_never_parsed(
    looks: list[bytes], parses: list[bytes]
) -> None:
    if not coalesce_shape.BYTES_PATH:
        pytest.skip("the bytes path needs the C accelerator")
    texts = ["Hel", "lo, ", 'a "quote"', "\\ and\n", "déjà ✓", "!"]
    frames = [chunk(t) for t in texts]
    assert waited(frames) == [chunk("".join(texts))]
    # Each line scanned once (its shape carries its text), the first again when the group
    # forms; nothing parsed, the frame encoded from the last line's bytes and the joined text.
    assert looks == [frames[0], frames[1], frames[0], *frames[2:]]
    assert [p for p in parses if not p.startswith(b"{")] == []


def test_a_chunk_after_a_barrier_starts_a_new_group() -> None:
    frames = [chunk("a"), chunk("b"), chunk("c"), REQ, chunk("d"), chunk("e")]
    assert waited(frames) == [chunk("abc"), REQ, chunk("de")]


def test_a_written_group_takes_no_more_chunks() -> None:
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    for text in ("a", "b", "c"):
        queue.push(OutFrame(chunk(text), None, 2), 0.0)
    assert queue.take(0.0) == ([chunk("abc") + b"\n"], None)
    for text in ("d", "e", "f"):
        queue.push(OutFrame(chunk(text), None, 2), 0.0)
    assert queue.take(0.0) == ([chunk("def") + b"\n"], None)
    assert queue.stats.merged == 4 and queue.stats.written == 2


def test_a_group_taken_in_pieces_takes_no_more_chunks() -> None:
    queue = OutboundQueue(CoalesceConfig(), coalesce=True)
    for raw in (chunk("a"), chunk("b"), chunk("c"), chunk("x", "m2")):
        queue.push(OutFrame(raw, None, 2), 0.0)
    assert queue.take(0.0, 1) == ([chunk("abc") + b"\n"], None)  # m1's group only
    for raw in (chunk("d"), chunk("e"), chunk("y", "m2")):
        queue.push(OutFrame(raw, None, 2), 0.0)
    out, _ = queue.take(0.0)
    assert out == [b"\n".join([chunk("xy", "m2"), chunk("de")]) + b"\n"]


def test_interleaved_messages_each_merge_into_their_own() -> None:
    frames = []
    for i in range(6):
        frames += [chunk(f"m{i} ", "m1"), chunk(f"t{i} ", "t1", "agent_thought_chunk")]
    out = waited(frames)
    assert out == [
        chunk("".join(f"m{i} " for i in range(6)), "m1"),
        chunk("".join(f"t{i} " for i in range(6)), "t1", "agent_thought_chunk"),
    ]


def test_other_bytes_around_the_text_take_the_general_path() -> None:
    spaced = chunk("b").replace(b'"text":"b"', b'"text": "b"')
    escaped = json.dumps(json.loads(chunk("ç")), separators=(",", ":")).encode()  # \u00e7
    assert escaped != chunk("ç") and b"\\u00e7" in escaped
    frames = [chunk("a"), chunk("x"), spaced, escaped, chunk("d")]
    # All one message with one envelope: one frame, whatever spelled each line.
    assert waited(frames) == [chunk("axbçd")]


def test_a_surrogate_escape_or_a_non_string_never_merges() -> None:
    pair = chunk("😀").replace("😀".encode(), b"\\ud83d\\ude00")
    number = chunk("b").replace(b'"text":"b"', b'"text":5')
    frames = [chunk("a"), chunk("b"), pair, number, chunk("c")]
    # The pair is written as it came (orjson would spell it otherwise); the number is no text
    # chunk; each stays where it was and what follows merges behind it, per entity in order.
    assert waited(frames) == [chunk("ab"), pair, number, chunk("c")]


# -- the template against the general path ---------------------------------------------------

# Texts with what JSON escapes (quotes, backslashes, controls) and what it may not (non-ASCII).
TEXT = st.text(alphabet=st.sampled_from(list('ab "\\\n\t\x01é✓😀')), max_size=6)


def _spelled(text: str, mid: str, how: int) -> bytes:
    raw = chunk(text, mid)
    if how == 1:  # another spelling: escaped non-ASCII (a ``\u`` escape)
        return json.dumps(json.loads(raw), separators=(",", ":")).encode()
    if how == 2:  # another envelope: spaces after the separators
        return json.dumps(json.loads(raw), ensure_ascii=False).encode()
    return raw


STREAM = st.lists(
    st.one_of(
        st.tuples(TEXT, st.sampled_from(["m1", "m2"]), st.sampled_from([0, 0, 0, 1, 2])),
        st.just(None),  # a barrier
    ),
    max_size=30,
)


def _frames(stream: list[tuple[str, str, int] | None]) -> list[bytes]:
    return [REQ if item is None else _spelled(*item) for item in stream]


def general(frames: list[bytes]) -> list[bytes]:
    """``waited`` on the general path: every line parsed, no template (nor the bytes path)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(coalesce_merge, "_template", lambda line: None)
        patch.setattr(coalesce, "BYTES_PATH", False)
        return waited(frames)


def fast(frames: list[bytes], bytes_path: bool) -> list[bytes]:
    """``waited`` on the template path (no accelerator), or on the bytes path."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(coalesce, "BYTES_PATH", bytes_path and coalesce_shape.BYTES_PATH)
        return waited(frames)


@settings(max_examples=300, deadline=None)
@given(STREAM, st.booleans())
def test_the_template_and_the_bytes_path_write_what_the_general_path_writes(
    stream: list[tuple[str, str, int] | None], bytes_path: bool
) -> None:
    frames = _frames(stream)
    got = fast(frames, bytes_path)
    assert got == general(frames)
    assert reduce(got, 2) == reduce(frames, 2)


def test_a_text_joined_to_empty_ones_keeps_its_line_as_it_came() -> None:
    escaped = json.dumps(json.loads(chunk("é")), separators=(",", ":")).encode()
    # The joined text equals the last one: the general path keeps that line's bytes (nothing
    # changed); the template path must too, not respell its escape.
    assert waited([chunk(""), chunk(""), escaped]) == [escaped]


@pytest.mark.parametrize(
    "literal",
    [
        b'"x\\"',  # an escaped quote where the literal should end: not JSON
        b'"a\x01b"',  # a raw control character: not JSON
        b'"\xff\xfe"',  # not UTF-8
        b'"a","text":"b"',  # a second text member: JSON, the last one wins
        b'"a"  ',  # whitespace after the literal
        b"null",  # not a string
    ],
)
@pytest.mark.parametrize("bytes_path", [False, True])
def test_a_hostile_line_around_the_template_is_judged_by_the_general_path(
    literal: bytes, bytes_path: bool
) -> None:
    line = chunk("b")
    cut = line.index(b'"text":"b"') + len(b'"text":')
    hostile = line[:cut] + literal + line[cut + len(b'"b"') :]
    frames = [chunk("a"), chunk("b"), hostile, chunk("c")]
    got = fast(frames, bytes_path)
    assert got == general(frames)
    try:
        orjson.loads(hostile)
    except orjson.JSONDecodeError:
        # Not JSON: a barrier, written as it came, between the merges around it.
        assert got == [chunk("ab"), hostile, chunk("c")]
