"""The WebSocket stream's rule, as properties (in-process, ``websockets``' Sans-I/O on the other
end): the lines the session writes, in any chunking, leave as exactly one text frame each, their
bytes unchanged; the text messages that arrive, in any fragmentation and any cut of the TCP
stream, come out as exactly one line each, their bytes unchanged but for a raw ``\\n`` turned
into a space, read with any ``max_bytes``. And both upgrades in-process, with the root logger at
DEBUG: the token is in no log record."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import anyio
import anyio.abc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proxy_harness import close_memory_pipes, memory_pipe_pair
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from acp_proxy.config import AuthConfig, Config
from acp_proxy.shell.sockets.address import parse_address
from acp_proxy.shell.ws.websocket import WsStream
from acp_proxy.shell.ws.wsclient import UpgradeRefused, upgrade
from acp_proxy.shell.ws.wsserver import WsServer

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


class Kernel(anyio.abc.ByteStream):
    """A socket whose non-blocking write takes what ``takes`` says (then all), and whose
    ``send`` takes everything: what was written, in order, is ``wire``."""

    def __init__(self, takes: list[int]) -> None:
        self.takes = takes
        self.wire = b""

    def try_send(self, data: bytes) -> int:
        n = min(self.takes.pop(0), len(data)) if self.takes else len(data)
        self.wire += data[:n]
        return n

    async def send(self, item: bytes) -> None:
        self.wire += item

    async def receive(self, max_bytes: int = 65536) -> bytes:
        raise anyio.EndOfStream

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


@settings(max_examples=80, deadline=None)
@given(
    batches=st.lists(lines, max_size=6),
    takes=st.lists(st.integers(min_value=0, max_value=60), max_size=10),
)
def test_direct_writes_cut_anywhere_still_make_one_frame_per_line(
    batches: list[list[bytes]], takes: list[int]
) -> None:
    # As the outbox writes: try_send first; what it did not take, through send.
    async def main() -> list[bytes]:
        kernel = Kernel(list(takes))
        ws = WsStream(kernel, ServerProtocol(state=State.OPEN, max_size=None))
        for batch in batches:
            data = b"".join(line + b"\n" for line in batch)
            taken = ws.try_send(data)
            assert 0 <= taken <= len(data)
            if taken < len(data):
                await ws.send(data[taken:])
        peer = ClientProtocol(parse_uri("ws://h/"), state=State.OPEN, max_size=None)
        peer.receive_data(kernel.wire)
        events = peer.events_received()
        return [bytes(e.data) for e in events if isinstance(e, Frame) and e.opcode is Opcode.TEXT]

    assert anyio.run(main) == [line for batch in batches for line in batch]


class Notes:
    """A log that keeps what it was told (the servers' ``log``)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, event: str, **fields: object) -> None:
        self.lines.append(f"{event} {fields}")


@pytest.mark.anyio
async def test_upgrade_in_process_never_logs_the_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Even with the root logger at DEBUG (where websockets would log every upgrade header).
    caplog.set_level(logging.DEBUG)
    secret = "in-process-secret-7f3a"
    token = tmp_path / "token"
    token.write_text(secret)
    address = parse_address("ws://127.0.0.1:8443/acp", listen=False)
    server = WsServer(
        address, secret, None, max_bytes=1 << 20, timeout_s=10, consent=False, exposure=("", "")
    )
    server.port, server.names = 8443, ["127.0.0.1"]
    notes = Notes()
    for sent, opened in ((secret, True), ("wrong", False)):
        ours, theirs = memory_pipe_pair(1000)
        (tmp_path / "given").write_text(sent)
        config = Config(auth=AuthConfig(token_file=str(tmp_path / "given")))
        async with anyio.create_task_group() as tg:
            result: list[object] = []

            async def serve(
                stream: anyio.abc.ByteStream = theirs, out: list[object] = result
            ) -> None:
                out.append((await server.upgrade(stream, "peer", notes))[0])

            tg.start_soon(serve)
            if opened:
                client = await upgrade(ours, address, config, 10)
                assert client.ping_s == config.ws_ping_interval_s == 20  # the default
                await client.send(b'{"jsonrpc":"2.0","id":1,"method":"x"}\n')
            else:
                with pytest.raises(UpgradeRefused) as refused:
                    await upgrade(ours, address, config, 10)
                assert "401 Unauthorized" in str(refused.value)
        server_side = result[0]
        assert isinstance(server_side, WsStream) is opened
        if isinstance(server_side, WsStream):
            assert await server_side.receive() == b'{"jsonrpc":"2.0","id":1,"method":"x"}\n'
    assert secret not in caplog.text
    assert all(secret not in line for line in notes.lines)
    assert len(notes.lines) == 1 and "WebSocket upgrade refused" in notes.lines[0]


@pytest.mark.anyio
async def test_a_quiet_connection_is_pinged_while_it_waits() -> None:
    """No frame sent for ``ping_s`` while the session waits for the peer: a ping goes out (and
    again after as long); the peer's pong and its next message are taken as usual."""
    ours, theirs = memory_pipe_pair(1000)
    ws = WsStream(ours, ServerProtocol(state=State.OPEN, max_size=None), ping_s=0.05)
    peer = ClientProtocol(parse_uri("ws://h/"), state=State.OPEN, max_size=None)
    got: list[bytes] = []
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def read() -> None:
                    got.append(await ws.receive())

                tg.start_soon(read)
                pings: list[Frame] = []
                while len(pings) < 2:
                    peer.receive_data(await theirs.receive())
                    frames = [e for e in peer.events_received() if isinstance(e, Frame)]
                    assert all(f.opcode is Opcode.PING for f in frames), frames
                    pings += frames
                await theirs.send(b"".join(peer.data_to_send()))  # the pongs
                peer.send_text(b'{"jsonrpc":"2.0","id":1,"method":"x"}')
                await theirs.send(b"".join(peer.data_to_send()))
    finally:
        close_memory_pipes()
    assert got == [b'{"jsonrpc":"2.0","id":1,"method":"x"}\n']


@pytest.mark.anyio
async def test_a_message_in_many_empty_fragments_holds_no_more_than_its_bytes() -> None:
    """A hostile peer sends a text message as a first fragment and then empty continuation
    frames without end (6 bytes each on the wire; they never bring the message nearer its size
    limit): what the connection holds for the message is its bytes, not one entry per frame."""
    import tracemalloc

    ours, theirs = memory_pipe_pair(0)
    ws = WsStream(ours, ServerProtocol(state=State.OPEN, max_size=1 << 20))
    peer = ClientProtocol(parse_uri("ws://h/"), state=State.OPEN, max_size=None)
    empties = 20_000
    got: list[bytes] = []
    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def read() -> None:
                    got.append(await ws.receive())

                tg.start_soon(read)
                peer.send_text(b'{"jsonrpc":"2.0",', fin=False)
                await theirs.send(b"".join(peer.data_to_send()))
                await anyio.wait_all_tasks_blocked()
                tracemalloc.start()
                try:
                    before = tracemalloc.get_traced_memory()[0]
                    for _ in range(empties // 1_000):  # 6 kB of frames a write
                        for _ in range(1_000):
                            peer.send_continuation(b"", fin=False)
                        await theirs.send(b"".join(peer.data_to_send()))
                    await anyio.wait_all_tasks_blocked()
                    held = tracemalloc.get_traced_memory()[0] - before
                finally:
                    tracemalloc.stop()
                peer.send_continuation(b'"method":"x"}', fin=True)
                await theirs.send(b"".join(peer.data_to_send()))
    finally:
        close_memory_pipes()
    assert got == [b'{"jsonrpc":"2.0","method":"x"}\n']
    assert held < 64 * 1024, held  # one entry per empty frame: 8 bytes each, 160 kB
