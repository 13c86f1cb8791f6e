"""Watching (``Connection(watch=True)``, what the live view asks for) against observing
(``observe=True``): for any stream, any chunking and any chain, the frames a watcher is told
about read exactly as an observer is told about them (each frame's bytes, what was sent instead,
the replies, who changed it, its kind, in order), and the wire is exactly what an unobserved
connection writes (watching keeps every fast path; it only reports)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from line_fixtures import AGENT_LINES, LINES, USER_LINES, TagToolCalls

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.config import NonJsonPolicy, parse_config
from acp_proxy.wire.chain import (
    FORWARD,
    Chain,
    Concerns,
    Direction,
    Link,
    MessageContext,
    Verdict,
)
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.observe import passed_kind
from acp_proxy.wire.connection.pipeline import AS_CAME, Connection, Result
from acp_proxy.wire.framing import LineSplitter
from acp_proxy.wire.notes import FrameInfo, Observed, Passed, VersionNegotiated

A2C = Direction.AGENT_TO_CLIENT
C2A = Direction.CLIENT_TO_AGENT
BUDGET = 100_000  # small enough that a frame of many commas is over it

RULES = """
rules:
  - name: edge-route
    match: {direction: agent_to_client, update: [tool_call_update]}
    set_meta: {example.dev/route: edge}
    remove_meta: [zed.dev/debugMode]
"""


class MarkingTag(TagToolCalls):
    """Tags tool call updates and marks them, and marks the permission requests it lets pass
    (as the policy marks its decisions for the observers)."""

    needles = (b'"tool_call_update"', b'"session/request_permission"')

    def __init__(self) -> None:
        self.marks: list[object] = []

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        if message.get("method") == "session/request_permission":
            self.marks.append(("asked", message.get("id")))
            return FORWARD
        verdict = super().__call__(message, ctx)
        if verdict is not FORWARD:
            self.marks.append("tagged")
        return verdict


class Reader:
    """Reads tool call updates and marks them, changing nothing (``concerns``: as the policy
    does): a block's such notifications take the read lane."""

    name = "reader"
    needles = (b'"tool_call_update"',)
    concerns = Concerns()

    def __init__(self) -> None:
        self.marks: list[object] = []

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        self.marks.append("read")
        return FORWARD


def chain_of(name: str) -> Chain:
    if name == "read":
        return Chain([Link(Reader())])
    if name == "rules":
        return parse_config(RULES, "rules.yaml", {}).build_chain()
    if name == "mark":
        return Chain([Link(MarkingTag())])
    return Chain([Link(TagToolCalls())] if name == "tag" else [])


@dataclass
class Seen:
    wire: bytes
    replies: bytes
    frames: list[tuple[object, ...]]
    versions: list[int]
    stats: dict[str, int]


def drive(
    chunks: list[tuple[Direction, bytes]], chain: str, non_json: NonJsonPolicy, mode: str
) -> Seen:
    """The stream through one connection as the shell's reader feeds it (a one-line chunk by
    ``handle_line``, others as blocks), and what it reported of each frame."""
    conn = Connection(
        chain_of(chain),
        non_json=non_json,
        max_parse_bytes=BUDGET,
        observe=mode == "observe",
        watch=mode == "watch",
    )
    splitters = {A2C: LineSplitter(1 << 20), C2A: LineSplitter(1 << 20)}
    wire: list[bytes] = []
    replies: list[bytes] = []
    frames: list[tuple[object, ...]] = []
    versions: list[int] = []

    def take(res: Result) -> None:
        wire.extend(f.raw + b"\n" for f in res.forward)
        replies.extend(f.raw + b"\n" for f in res.reply)
        for note in res.notes:
            if type(note) is Observed:
                changed: list[str] = []
                marks: list[object] = []
                for info in note.messages:
                    changed.extend(n for n in info.changed_by if n not in changed)
                    marks.extend(info.marks)
                frames.append(
                    (note.direction, note.raw, note.sent, note.replies, changed, marks, note.kind)
                )
            elif type(note) is Passed:
                parts = b"\n".join(note.parts).split(b"\n")
                assert len(parts) == note.count
                for raw in parts:
                    kind = passed_kind(raw, BUDGET)
                    frames.append((note.direction, raw, None, (), [], [], kind))
            elif type(note) is VersionNegotiated:
                versions.append(note.version)

    for direction, chunk in chunks:
        splitter = splitters[direction]
        line = splitter.single_line(chunk)
        if line is not None:
            got = conn.handle_line(direction, line)
            take(Result((OutFrame(line, None, None),)) if got is AS_CAME else got)
        else:
            take(conn.handle_many(direction, splitter.feed_blocks(chunk), join=True))
    for direction, splitter in splitters.items():
        take(conn.handle_many(direction, splitter.end()))
    return Seen(b"".join(wire), b"".join(replies), frames, versions, conn.stats.as_dict())


@st.composite
def traffic(draw: st.DrawFn) -> list[tuple[Direction, bytes]]:
    picks = draw(st.lists(st.tuples(st.sampled_from([A2C, C2A]), st.integers(0, 100)), max_size=40))
    streams = {A2C: AGENT_LINES[0] + b"\n", C2A: USER_LINES[0] + b"\n"}
    for direction, i in picks:
        pool = AGENT_LINES if direction is A2C else USER_LINES
        streams[direction] += pool[i % len(pool)] + b"\n"
    out: list[tuple[Direction, bytes]] = []
    for direction in (C2A, A2C):
        data = streams[direction]
        cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
        # A cut at each line's end now and then: one-line chunks take ``handle_line``.
        if draw(st.booleans()):
            cuts = sorted({*cuts, *(i + 1 for i, b in enumerate(data) if b == 10)})
        prev = 0
        for cut in [*cuts, len(data)]:
            out.append((direction, data[prev:cut]))
            prev = cut
    return out


@settings(max_examples=200, deadline=None)
@given(
    traffic(),
    st.sampled_from(["none", "tag", "mark", "rules", "read"]),
    st.sampled_from(list(NonJsonPolicy)),
)
def test_a_watcher_reads_each_frame_as_an_observer_does(
    chunks: list[tuple[Direction, bytes]], chain: str, non_json: NonJsonPolicy
) -> None:
    observed = drive(chunks, chain, non_json, "observe")
    watched = drive(chunks, chain, non_json, "watch")
    plain = drive(chunks, chain, non_json, "plain")
    assert watched.frames == observed.frames
    assert watched.versions == observed.versions
    assert (watched.wire, watched.replies, watched.stats) == (
        plain.wire,
        plain.replies,
        plain.stats,
    )
    assert not plain.frames
    if chain in ("mark", "read"):  # (what the marks are tested on)
        assert any(frame[5] for frame in observed.frames) or b"tool_call_update" not in b"".join(
            chunk for _, chunk in chunks
        )


def test_a_block_of_updates_is_one_note() -> None:
    conn = Connection(Chain([]), watch=True)
    conn.handle_line(C2A, USER_LINES[0])
    conn.handle_line(A2C, AGENT_LINES[0])
    body = b"\n".join([LINES[1]] * 50)
    res = conn.handle_many(A2C, LineSplitter().feed_blocks(body + b"\n"), join=True)
    assert res.notes == (Passed(A2C, (body,), 50),)
    assert [f.raw for f in res.forward] == [body]


def test_a_read_is_one_note_but_for_what_did_not_pass_as_it_came() -> None:
    conn = Connection(chain_of("rules"), watch=True)
    conn.handle_line(C2A, USER_LINES[0])
    conn.handle_line(A2C, AGENT_LINES[0])
    chunk, request, tagged = LINES[1], LINES[6], AGENT_LINES[-1]
    lines = [chunk, chunk, request, chunk, tagged, chunk]
    read = b"\n".join(lines) + b"\n"
    res = conn.handle_many(A2C, LineSplitter().feed_blocks(read), join=True)
    # The request the tables tracked passed as it came: one note with the chunks around it.
    first, changed, last = [n for n in res.notes if type(n) is not FrameInfo]
    assert first == Passed(A2C, (b"\n".join(lines[:2]), request, chunk), 4)
    assert type(changed) is Observed and changed.raw == tagged
    assert last == Passed(A2C, (chunk,), 1)


def test_what_a_watcher_is_told_of_a_rewritten_frame() -> None:
    conn = Connection(chain_of("rules"), watch=True)
    conn.handle_line(C2A, USER_LINES[0])
    conn.handle_line(A2C, AGENT_LINES[0])
    raw = AGENT_LINES[-1]
    res = conn.handle_many(A2C, LineSplitter().feed_blocks(raw + b"\n"), join=True)
    [note] = [n for n in res.notes if type(n) is Observed]
    assert (note.raw, note.kind, note.replies) == (raw, "message", ())
    assert note.sent is not None
    [sent] = note.sent
    update = orjson.loads(sent)["params"]["update"]
    assert update["_meta"] == {"example.dev/route": "edge", "zed.dev/debugMode": None}
    assert [info.changed_by for info in note.messages] == [("rules:edge-route",)]
