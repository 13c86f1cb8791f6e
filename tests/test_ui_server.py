"""The live view's server on real sockets: every refusal, and 50 observers with one stuck.

The refusals run against ``acp-proxy ui FILE`` (a real process on a real port); the observer
load runs the hub and server in-process on a real listening socket, so the test can read the
server's accounted bytes while it publishes.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import orjson
import pytest
from ui_records import big_record, serve_record

from acp_proxy.shell.sockets.address import parse_address
from acp_proxy.shell.sockets.listening import open_listener
from acp_proxy.shell.ui_hub import HubLimits, UiHub
from acp_proxy.shell.ui_server import UiServer, accepts_gzip


def http(url: str, target: str, method: str = "GET", **headers: str) -> tuple[int, bytes]:
    """One request on a fresh connection: (status, the whole response)."""
    parts = urlsplit(url)
    fields = {"Host": parts.netloc, **{k.replace("_", "-"): v for k, v in headers.items()}}
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall((head + "\r\n").encode())
        data = b""
        try:
            # The first bytes come once the view described what it holds (a live view
            # describes what it was told only when asked); an event stream then stays open.
            while chunk := sock.recv(65536):
                data += chunk
                sock.settimeout(0.5)
        except TimeoutError:
            pass
    return int(data.split(b" ", 2)[1]), data


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    path = big_record(tmp_path_factory.mktemp("ui") / "r.jsonl", 10)
    with serve_record(path) as url:
        yield url, url.split("token=")[1]


def test_the_page_and_the_stream_with_the_token(served: tuple[str, str]) -> None:
    url, token = served
    status, page = http(url, f"/?token={token}")
    assert status == 200
    assert b"Content-Security-Policy: default-src 'none'" in page
    assert b"Referrer-Policy: no-referrer" in page
    assert b"<title>acp-proxy live view</title>" in page
    status, stream = http(url, f"/events?token={token}")
    assert status == 200
    body = stream.split(b"\r\n\r\n", 1)[1]
    datas = [orjson.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert datas[0] == {
        "event": "hello",
        "stream": "acp-proxy-events",
        "version": 4,
        "mode": "records",
        "head": 11,
    }
    assert [d["seq"] for d in datas[1:]] == list(range(1, 12))
    status, stream = http(url, f"/events?since=9&token={token}")
    body = stream.split(b"\r\n\r\n", 1)[1]
    assert [orjson.loads(x[6:]).get("seq") for x in body.split(b"\n") if x[:6] == b"data: "] == [
        None,
        10,
        11,
    ]


@pytest.mark.parametrize(
    ("target", "headers", "status", "why"),
    [
        ("/", {}, 403, b"a valid token is required"),
        ("/events", {}, 403, b"a valid token is required"),
        ("/events?token=wrong", {}, 403, b"a valid token is required"),
        ("/api/entities?conn=1&token=wrong", {}, 403, b"a valid token is required"),
        ("/?token={token}", {"Host": "attacker.example:{port}"}, 421, b"its own address"),
        ("/events?token={token}", {"Host": "attacker.example:{port}"}, 421, b"its own address"),
        ("/?token={token}", {"Origin": "http://attacker.example"}, 403, b"cross-origin"),
        ("/events?token={token}", {"Origin": "http://attacker.example"}, 403, b"cross-origin"),
        ("/events?token={token}", {"Sec-Fetch-Site": "cross-site"}, 403, b"cross-origin"),
    ],
)
def test_refused(
    served: tuple[str, str], target: str, headers: dict[str, str], status: int, why: bytes
) -> None:
    url, token = served
    port = str(urlsplit(url).port)
    fixed = {k: v.replace("{port}", port) for k, v in headers.items()}
    got, response = http(url, target.replace("{token}", token), **fixed)
    assert got == status
    assert why in response
    assert b"\ndata: " not in response


def test_nothing_is_written_through_it(served: tuple[str, str]) -> None:
    url, token = served
    for method in ("POST", "PUT", "DELETE"):
        assert http(url, f"/events?token={token}", method=method)[0] == 405


def test_a_remote_address_needs_allow_remote(tmp_path: Path) -> None:
    record = big_record(tmp_path / "r.jsonl", 2)
    ui = subprocess.run(
        [sys.executable, "-m", "acp_proxy", "ui", "--ui", "tcp://0.0.0.0:0", str(record)],
        capture_output=True,
        check=False,
        timeout=30,
    )
    assert ui.returncode == 2
    assert b"is not a loopback address" in ui.stderr
    marker = tmp_path / "agent-ran"
    live = subprocess.run(
        [sys.executable, "-m", "acp_proxy", "--ui", "tcp://0.0.0.0:0", "--", "touch", str(marker)],
        capture_output=True,
        check=False,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert live.returncode == 2
    assert b"is not a loopback address" in live.stderr
    assert not marker.exists()  # refused before the agent was started


def test_unix_addresses_are_refused() -> None:
    live = subprocess.run(
        [sys.executable, "-m", "acp_proxy", "--ui", "unix:///tmp/x.sock", "--", "true"],
        capture_output=True,
        check=False,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert live.returncode == 2
    assert b"--ui: the live view needs a tcp:// address" in live.stderr


OBSERVERS = 50
EVENTS = 3000
PAYLOAD = "x" * 2000  # about 6 MB of events in all


@pytest.mark.anyio
async def test_fifty_observers_one_stuck() -> None:
    limits = HubLimits(history_bytes=2 * 1024 * 1024, observer_bytes=1024 * 1024, max_observers=64)
    hub = UiHub(mode="records", limits=limits)
    conn = hub.open_session({"acp-proxy-record": 1})
    listener = await open_listener(
        parse_address("tcp://127.0.0.1:0", listen=True), allow_remote=False, log=None
    )
    port = listener.address.port
    server = UiServer(hub, token="t", port=port, names=["127.0.0.1"], allow_remote=False)
    request = f"GET /events?since=now&token=t HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    last = hub.builder.head + EVENTS
    received: list[list[int]] = [[] for _ in range(OBSERVERS - 1)]
    peak = peak_lag = 0

    async def reader(i: int) -> None:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(request.encode())
            buffer = b""
            while not received[i] or received[i][-1] < last:
                buffer += await stream.receive(1 << 20)
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.startswith(b"data: "):
                        seq = orjson.loads(line[6:]).get("seq")
                        if seq is not None:
                            received[i].append(seq)

    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    async with anyio.create_task_group() as tg:
        for sock in listener.sockets:
            tg.start_soon(server.serve, sock)
        stuck.connect(("127.0.0.1", port))
        stuck.sendall(request.encode())
        for i in range(OBSERVERS - 1):
            tg.start_soon(reader, i)
        with anyio.fail_after(10):
            while len(hub.observers) < OBSERVERS:
                await anyio.sleep(0.01)
        with anyio.fail_after(60):
            for n in range(EVENTS):
                hub.add_line(conn, {"t": n, "dir": "agent_to_client", "raw": PAYLOAD})
                peak = max(peak, hub.held_bytes())
                peak_lag = max(peak_lag, hub.lag_bytes())
                if n % 25 == 0:
                    await anyio.sleep(0.005)  # a fast session: about 10 MB/s of events
            while any(not r or r[-1] < last for r in received):
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    stuck.close()
    listener.close()
    # Every reading observer got every event, in order; the stuck one was cut off, and the
    # hub never held more than its stated bound.
    first = last - EVENTS + 1
    assert all(r == list(range(first, last + 1)) for r in received)
    assert len(server.cut_off) == 1
    assert "fell more than 1048576 bytes behind the session" in server.cut_off[0]
    assert peak <= hub.bound_bytes()
    # An observer's backlog is checked every 64 events: at most its bound and 64 events more.
    assert peak_lag <= limits.observer_bytes + 64 * (len(PAYLOAD) + 200)
    assert server.refused == 0


@pytest.mark.anyio
async def test_a_slow_observer_is_told_why_it_was_cut_off() -> None:
    limits = HubLimits(history_bytes=8 * 1024 * 1024, observer_bytes=256 * 1024, max_observers=4)
    hub = UiHub(mode="records", limits=limits)
    conn = hub.open_session({"acp-proxy-record": 1})
    listener = await open_listener(
        parse_address("tcp://127.0.0.1:0", listen=True), allow_remote=False, log=None
    )
    port = listener.address.port
    server = UiServer(hub, token="t", port=port, names=["127.0.0.1"], allow_remote=False)
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    received = b""
    async with anyio.create_task_group() as tg:
        for sock in listener.sockets:
            tg.start_soon(server.serve, sock)
        slow.connect(("127.0.0.1", port))
        slow.sendall(
            f"GET /events?since=now&token=t HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        )
        with anyio.fail_after(10):
            while not hub.observers:
                await anyio.sleep(0.01)
            n = 0
            while not server.cut_off:  # it does not read meanwhile: the buffers fill up
                hub.add_line(conn, {"t": n, "dir": "agent_to_client", "raw": PAYLOAD})
                n += 1
                if n % 25 == 0:
                    await anyio.sleep(0.001)
        slow.setblocking(False)
        with anyio.fail_after(10):  # now it reads: what was queued, then why, then EOF
            while True:
                await anyio.wait_readable(slow)
                chunk = slow.recv(1 << 20)
                if not chunk:
                    break
                received += chunk
        tg.cancel_scope.cancel()
    slow.close()
    listener.close()
    last = received.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    assert last.startswith(b"data: ")
    notice = orjson.loads(last[6:])
    assert notice["event"] == "cutoff"
    assert "fell more than 262144 bytes behind the session" in notice["reason"]
    assert hub.observers == set()


def test_check_config_refuses_what_the_run_refuses(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    for body, code, said in (
        ("ui:\n  address: tcp://0.0.0.0:8765\n", 2, b"ui: 0.0.0.0 is not a loopback address"),
        ("ui:\n  address: unix:///tmp/ui.sock\n", 2, b"the live view needs a tcp:// address"),
        ("ui:\n  address: tcp://0.0.0.0:8765\n  allow_remote: true\n", 0, b""),
    ):
        config.write_text(body)
        ran = subprocess.run(
            [sys.executable, "-m", "acp_proxy", "check-config", str(config)],
            capture_output=True,
            check=False,
            timeout=30,
        )
        assert ran.returncode == code, ran.stderr
        assert said in ran.stderr


@pytest.mark.anyio
async def test_a_gzip_observer_reads_the_same_stream_compressed() -> None:
    hub = UiHub(mode="records")
    conn = hub.open_session({"acp-proxy-record": 1})
    for n in range(300):  # held: a replay from event 100 starts inside a block
        hub.add_line(conn, {"t": n, "dir": "agent_to_client", "raw": f"held {n} " + "x" * 300})
    hub.published()
    listener = await open_listener(
        parse_address("tcp://127.0.0.1:0", listen=True), allow_remote=False, log=None
    )
    port = listener.address.port
    server = UiServer(hub, token="t", port=port, names=["127.0.0.1"], allow_remote=False)
    last = hub.builder.head + 300
    bodies: dict[str, bytes] = {}
    sizes: dict[str, int] = {}

    async def read(encoding: str) -> None:
        request = f"GET /events?since=100&token=t HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        if encoding:
            request += f"Accept-Encoding: {encoding}\r\n"
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send((request + "\r\n").encode())
            raw = b""
            while b"\r\n\r\n" not in raw:
                raw += await stream.receive(1 << 20)
            head, body = raw.split(b"\r\n\r\n", 1)
            gzipped = b"Content-Encoding: gzip" in head
            assert gzipped == (encoding != "")
            inflate = zlib.decompressobj(wbits=31)
            text = inflate.decompress(body) if gzipped else body
            size = len(body)
            while b"id: %d\n" % last not in text:
                chunk = await stream.receive(1 << 20)
                size += len(chunk)
                text += inflate.decompress(chunk) if gzipped else chunk
            bodies[encoding], sizes[encoding] = text, size

    async with anyio.create_task_group() as tg:
        for sock in listener.sockets:
            tg.start_soon(server.serve, sock)
        for encoding in ("", "gzip, deflate, br", "br;q=1.0, gzip;q=0.5"):
            tg.start_soon(read, encoding)
        with anyio.fail_after(10):
            while len(hub.observers) < 3:
                await anyio.sleep(0.01)
            for n in range(300):  # and live events
                hub.add_line(
                    conn, {"t": n, "dir": "agent_to_client", "raw": f"live {n} " + "y" * 300}
                )
                if n % 50 == 0:
                    hub.published()
                    await anyio.sleep(0.01)
            hub.published()
            while len(bodies) < 3:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    listener.close()
    # The same bytes, event for event, from event 101 on (the replay, then the live ones).
    plain = bodies[""]
    assert plain.startswith(b"retry: 2000\n\ndata: ")
    assert b"\n\nid: 101\ndata: " in plain and b"id: 100\n" not in plain
    assert bodies["gzip, deflate, br"] == plain
    assert bodies["br;q=1.0, gzip;q=0.5"] == plain
    assert sizes["gzip, deflate, br"] * 5 < sizes[""]


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        ("gzip", True),
        ("deflate, gzip;q=0.8", True),
        ("GZIP ; q=1", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("br, identity", False),
        ("", False),
        ("gzip;q=x", False),
    ],
)
def test_accepts_gzip(header: str, accepted: bool) -> None:
    assert accepts_gzip(header) == accepted
