"""The WebSocket stream's rule, as properties (in-process, ``websockets``' Sans-I/O on the other
end): the lines the session writes, in any chunking, leave as exactly one text frame each, their
bytes unchanged; the text messages that arrive, in any fragmentation and any cut of the TCP
stream, come out as exactly one line each, their bytes unchanged but for a raw ``\\n`` turned
into a space, read with any ``max_bytes``."""

from __future__ import annotations

import itertools

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st
from proxy_harness import close_memory_pipes, memory_pipe_pair
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from acp_proxy.shell.sockets.websocket import WsStream

lines = st.lists(
    st.text(min_size=1, max_size=40).map(lambda t: t.replace("\n", "").encode() or b"x"),
    max_size=12,
)
messages = st.lists(st.text(max_size=40).map(str.encode), max_size=10)


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points})
    edges = [0, *marks, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


@settings(max_examples=60, deadline=None)
@given(lines=lines, points=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8))
def test_each_line_written_is_one_text_frame_unchanged(
    lines: list[bytes], points: list[int]
) -> None:
    async def main() -> list[bytes]:
        ours, theirs = memory_pipe_pair(1000)
        ws = WsStream(ours, ServerProtocol(state=State.OPEN, max_size=None))
        for chunk in cuts(b"".join(line + b"\n" for line in lines), points):
            await ws.send(chunk)
        peer = ClientProtocol(parse_uri("ws://h/"), state=State.OPEN, max_size=None)
        await ours.aclose()
        while True:
            try:
                peer.receive_data(await theirs.receive())
            except anyio.EndOfStream:
                break
        events = peer.events_received()
        return [bytes(e.data) for e in events if isinstance(e, Frame) and e.opcode is Opcode.TEXT]

    try:
        assert anyio.run(main) == lines
    finally:
        close_memory_pipes()


@settings(max_examples=60, deadline=None)
@given(
    messages=messages,
    splits=st.lists(st.integers(min_value=0, max_value=3), max_size=10),
    points=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
    max_bytes=st.integers(min_value=1, max_value=200),
)
def test_each_text_message_is_one_line(
    messages: list[bytes], splits: list[int], points: list[int], max_bytes: int
) -> None:
    peer = ClientProtocol(parse_uri("ws://h/"), state=State.OPEN, max_size=None)
    for i, message in enumerate(messages):
        parts = splits[i] if i < len(splits) else 0
        pieces = cuts(message, list(range(1, parts + 1))) or [b""]
        if len(pieces) == 1:
            peer.send_text(pieces[0])
        else:
            peer.send_text(pieces[0], fin=False)
            for piece in pieces[1:-1]:
                peer.send_continuation(piece, fin=False)
            peer.send_continuation(pieces[-1], fin=True)
    peer.send_close(1000)
    wire = b"".join(peer.data_to_send())

    async def main() -> bytes:
        ours, theirs = memory_pipe_pair(1000)
        ws = WsStream(ours, ServerProtocol(state=State.OPEN, max_size=None))
        for chunk in cuts(wire, points):
            await theirs.send(chunk)
        got = b""
        while True:
            try:
                piece = await ws.receive(max_bytes)
            except anyio.EndOfStream:
                return got
            assert 0 < len(piece) <= max_bytes
            got += piece

    try:
        assert anyio.run(main) == b"".join(m.replace(b"\n", b" ") + b"\n" for m in messages)
    finally:
        close_memory_pipes()
