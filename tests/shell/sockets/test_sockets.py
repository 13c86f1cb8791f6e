"""Socket transports: real loopback TCP and real Unix sockets, the real CLI as a
subprocess, ``tests/tiny_agent.py`` as the (cheap) agent. Only 127.0.0.1 and Unix paths are ever
connected to; 0.0.0.0 is only bound (never sent to)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson
import pytest
from listen_harness import (
    PROXY,
    TIMEOUT,
    TINY,
    Proxy,
    agent_pid,
    alive,
    echo,
    exchange,
    gone,
    listening,
    stream_note,
)
from proxy_harness import (
    REPO,
    Lines,
    Ran,
    error_line,
    init_response,
    proxy_env,
    request,
    run,
    write_config,
)

from acp_proxy.shell.sockets.address import Address, AddressError, is_loopback_ip, parse_address
from acp_proxy.shell.sockets.listening import resolve_tcp

# -- pure: addresses ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "listen", "expected"),
    [
        ("tcp://127.0.0.1:7777", False, Address("tcp", host="127.0.0.1", port=7777)),
        ("tcp://localhost:1", False, Address("tcp", host="localhost", port=1)),
        ("tcp://[::1]:7777", False, Address("tcp", host="::1", port=7777)),
        ("tcp://127.0.0.1:0", True, Address("tcp", host="127.0.0.1", port=0)),
        ("unix:///run/acp.sock", False, Address("unix", path="/run/acp.sock")),
    ],
)
def test_parse_address(url: str, listen: bool, expected: Address) -> None:
    address = parse_address(url, listen=listen)
    assert address == expected
    assert str(address) == url


@pytest.mark.parametrize(
    ("url", "listen", "message"),
    [
        ("127.0.0.1:7777", True, "expected tcp://HOST:PORT, tcp://[IPV6]:PORT or unix:///"),
        ("http://127.0.0.1:80", True, "expected tcp://HOST:PORT"),
        ("tcp://127.0.0.1", True, "missing :PORT (expected tcp://HOST:PORT)"),
        ("tcp://:7777", True, "missing HOST (expected tcp://HOST:PORT)"),
        ("tcp://127.0.0.1:0", False, "the port must be a number from 1 to 65535"),
        ("tcp://127.0.0.1:65536", True, "the port must be a number from 0 to 65535"),
        ("tcp://127.0.0.1:x", True, "the port must be a number"),
        ("tcp://::1:7777", True, "put an IPv6 address in brackets: tcp://[::1]:PORT"),
        ("tcp://[nope]:7777", True, "'nope' is not an IPv6 address"),
        ("tcp://127.0.0.1:7777/x", True, "a tcp address has no path"),
        ("unix://run/acp.sock", True, "a Unix socket path must be absolute"),
    ],
)
def test_parse_address_errors(url: str, listen: bool, message: str) -> None:
    with pytest.raises(AddressError) as caught:
        parse_address(url, listen=listen)
    assert str(caught.value).startswith(repr(url) + ": ")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("ip", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("localhost", False),  # names are resolved first; only addresses are judged
    ],
)
def test_is_loopback_ip(ip: str, loopback: bool) -> None:
    assert is_loopback_ip(ip) is loopback


# -- many sessions ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_fifty_concurrent_sessions_exact_and_isolated() -> None:
    sessions = 50
    transcripts: dict[int, bytes] = {}
    expected: dict[int, bytes] = {}
    pids: dict[int, int] = {}

    async def client(proxy: Proxy, i: int) -> None:
        tag = f"client-{i}-é"
        script = [
            (request(1, "initialize", {"protocolVersion": 2, "n": i}), init_response(1)),
            (request(2, "session/new", {"cwd": f"/w/{i}"}), echo(2, {"cwd": f"/w/{i}"})),
            (
                request(3, "_test/stream", {"count": 5, "tag": tag}),
                stream_note(tag) * 5 + b'{"jsonrpc":"2.0","id":3,"result":{"streamed":5}}\n',
            ),
            # A big integer passes byte-exact both ways (never re-serialized by the proxy).
            (
                b'{"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"big":%d}}\n'
                % (2**70 + i),
                b'{"jsonrpc":"2.0","id":4,"result":{"echo":{"big":%d}}}\n' % (2**70 + i),
            ),
        ]
        stream = await proxy.connect()
        lines = Lines(stream)
        got = b""
        want = b""
        for frame, answer in script:
            await stream.send(frame)
            for _ in range(answer.count(b"\n")):
                got += await lines.line()
            want += answer
        pids[i] = await agent_pid(lines, stream)
        await stream.send_eof()
        got += await lines.rest()
        await stream.aclose()
        transcripts[i], expected[i] = got, want

    with anyio.fail_after(TIMEOUT):
        async with listening("--listen", "tcp://127.0.0.1:0", agent=TINY) as proxy:
            async with anyio.create_task_group() as tg:
                for i in range(sessions):
                    tg.start_soon(client, proxy, i)
            for i in range(sessions):
                await proxy.event("connection closed", conn=i + 1)
            proxy.terminate()
            assert await proxy.wait() == 0
    assert transcripts == expected
    assert len(set(pids.values())) == sessions  # one agent per connection
    closed = [e for e in proxy.events if e["event"] == "connection closed"]
    assert sorted(e["conn"] for e in closed) == list(range(1, sessions + 1))
    for event in closed:
        assert (event["status"], event["version"]) == ("agent exited with status 0", 2)
        assert (event["frames_client_to_agent"], event["frames_agent_to_client"]) == (5, 10)
    assert not any(alive(pid) for pid in pids.values())


@pytest.mark.anyio
async def test_client_disconnect_mid_stream_kills_only_its_agent() -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--listen", "tcp://127.0.0.1:0", "--max-frame-bytes", "1000", agent=TINY
        ) as proxy:
            a, b = await proxy.connect(), await proxy.connect()
            a_lines, b_lines = Lines(a), Lines(b)
            a_pid, b_pid = await agent_pid(a_lines, a), await agent_pid(b_lines, b)
            # A asks for ~15 MB, reads a little of it and goes away.
            await a.send(request(1, "_test/stream", {"count": 100_000, "tag": "a"}))
            assert await a_lines.line() == stream_note("a")
            await a.aclose()
            await gone(a_pid)
            await proxy.event("connection closed", conn=1)
            # B is untouched: same agent, exact answers, and its own oversize frame only
            # costs B an error for that one request.
            assert alive(b_pid)
            assert await exchange(b_lines, b, request(2, "x", {"k": "v"})) == echo(2, {"k": "v"})
            answer = orjson.loads(await exchange(b_lines, b, request(3, "x", {"p": "y" * 2000})))
            assert (answer["id"], answer["error"]["code"]) == (3, -32600)
            assert await agent_pid(b_lines, b, rid=4) == b_pid
            await b.send_eof()
            assert await b_lines.rest() == b""
            await b.aclose()
            await gone(b_pid)
            proxy.terminate()
            assert await proxy.wait() == 0
    closed_a = next(e for e in proxy.events if e["event"] == "connection closed" and e["conn"] == 1)
    assert closed_a["agent_pid"] == a_pid


def keepalive_timers(port: int) -> list[str]:
    """The timers of the established TCP sockets whose local port is ``port`` (``ss -o``)."""
    out = subprocess.run(
        ["ss", "-tnoH", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [field for line in out.splitlines() for field in line.split() if "timer:(" in field]


@pytest.mark.anyio
async def test_tcp_connections_have_keepalive() -> None:
    """A listened TCP connection asks the kernel to probe a silent peer (a peer whose host
    vanished without a FIN is found and its session ends), with the module's timings."""
    from acp_proxy.shell.sockets import streams

    with anyio.fail_after(TIMEOUT):
        async with listening("--listen", "tcp://127.0.0.1:0", agent=TINY) as proxy:
            port = int((await proxy.address()).rpartition(":")[2])
            client = await proxy.connect()
            lines = Lines(client)
            await agent_pid(lines, client)
            (timer,) = keepalive_timers(port)
            assert timer.startswith("timer:(keepalive,"), timer
            await client.send_eof()
            assert await lines.rest() == b""
            await client.aclose()
            proxy.terminate()
            assert await proxy.wait() == 0
    # The timings, read back from a socket the class set up.
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as near,
    ):
        sock = streams.SocketStream(near.dup()).sock
        options = [
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        ]
        sock.close()
    assert options == [1, 60, 15, 4]


# -- the agent over a socket (--connect) --------------------------------------------------------


@pytest.mark.anyio
async def test_connect_agent_connection_lost_with_request_in_flight() -> None:
    seen: list[bytes] = []

    async def agent(stream: anyio.abc.SocketStream) -> None:
        lines = Lines(stream)
        seen.append(await lines.line())
        await stream.send(init_response(1))
        seen.append(await lines.line())
        await stream.aclose()  # request 2 is never answered

    with anyio.fail_after(TIMEOUT):
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        url = f"tcp://127.0.0.1:{port}"
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, agent)
            async with await anyio.open_process(
                [*PROXY, "--connect", url],
                env=proxy_env(),
                cwd=str(REPO),
            ) as proxy:
                assert proxy.stdin is not None and proxy.stdout is not None
                assert proxy.stderr is not None
                out = Lines(proxy.stdout)
                await proxy.stdin.send(request(1, "initialize", {}))
                assert await out.line() == init_response(1)
                await proxy.stdin.send(request(2, "session/prompt", {"p": 1}))
                rest = await out.rest()
                err = await Lines(proxy.stderr).rest()
                rc = await proxy.wait()
            tg.cancel_scope.cancel()
    assert seen == [request(1, "initialize", {}), request(2, "session/prompt", {"p": 1})]
    assert rest == error_line(
        2, -32603, f"agent connection to {url} was lost during session/prompt"
    )
    assert rc == 1
    assert f"acp-proxy: the connection to the agent at {url} was lost\n".encode() in err


@pytest.mark.anyio
async def test_connect_over_unix_closes_cleanly(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    received: list[bytes] = []

    async def agent(stream: anyio.abc.SocketStream) -> None:
        lines = Lines(stream)
        received.append(await lines.line())
        await stream.send(init_response(1, version=1))
        received.append(await lines.rest())  # until the proxy half-closes
        await stream.aclose()

    with anyio.fail_after(TIMEOUT):
        listener = await anyio.create_unix_listener(path)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, agent)
            ran = await run([*PROXY, "--connect", f"unix://{path}"], request(1, "initialize", {}))
            tg.cancel_scope.cancel()
    assert (ran.rc, ran.stdout) == (0, init_response(1, version=1))
    assert received == [request(1, "initialize", {}), b""]
    assert ran.events("exit")[0]["status"] == "agent connection closed"


def _said_once(ran: Ran, event: str) -> str:
    """An error that ends the run, with --log-format json on stderr: the JSON log event, and
    the same message once as a plain line for the person reading stderr."""
    (said,) = [e["error"] for e in ran.events(event)]
    assert ran.stderr.count(f"acp-proxy: {said}\n".encode()) == 1
    return str(said)


@pytest.mark.anyio
async def test_port_in_use_is_said_once_on_a_console(tmp_path: Path) -> None:
    """The default console log on stderr: the plain `acp-proxy: ...` line only, no log line
    repeating it (both were printed before)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        cmd = [a for a in PROXY if a not in ("--log-format", "json")]
        ran = await run([*cmd, "--listen", f"tcp://127.0.0.1:{port}", "--", *TINY])
    assert ran.rc == 1
    lines = ran.stderr.decode().splitlines()
    said = [line for line in lines if "is already in use" in line]
    assert said == [
        f"acp-proxy: cannot listen on tcp://127.0.0.1:{port}: port {port} is already in use "
        "(another process is listening on it)"
    ]


@pytest.mark.anyio
async def test_connect_refused_is_a_clear_error(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/nobody.sock"
    ran = await run([*PROXY, "--connect", url, "--connect-timeout", "0.3"], request(1, "x"))
    assert (ran.rc, ran.stdout) == (1, b"")
    assert _said_once(ran, "cannot connect to the agent") == (
        f"cannot connect to the agent at {url}: No such file or directory "
        "(tried for 0.3 s, --connect-timeout)"
    )


@pytest.mark.anyio
async def test_listen_and_connect_one_agent_connection_per_client(tmp_path: Path) -> None:
    """--listen with --connect: each client gets its own agent connection; losing one ends only
    that client's session (its request in flight is answered with -32603)."""
    agent_path = tmp_path / "agent.sock"
    agent_url = f"unix://{agent_path}"

    async def agent(stream: anyio.abc.SocketStream) -> None:
        lines = Lines(stream)
        while True:
            try:
                line = await lines.line()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
            message = orjson.loads(line)
            if message["method"] == "drop":
                break  # the connection goes away with this request unanswered
            await stream.send(echo(message["id"], message["params"]))
        await stream.aclose()

    with anyio.fail_after(TIMEOUT):
        agent_listener = await anyio.create_unix_listener(agent_path)
        async with agent_listener, anyio.create_task_group() as tg:
            tg.start_soon(agent_listener.serve, agent)
            async with listening(
                "--listen", f"unix://{tmp_path}/proxy.sock", "--connect", agent_url
            ) as proxy:
                a, b = await proxy.connect(), await proxy.connect()
                a_lines, b_lines = Lines(a), Lines(b)
                assert await exchange(a_lines, a, request(1, "x", {"c": "a"})) == echo(
                    1, {"c": "a"}
                )
                assert await exchange(b_lines, b, request(1, "x", {"c": "b"})) == echo(
                    1, {"c": "b"}
                )
                await a.send(request(2, "drop", {}))
                assert await a_lines.rest() == error_line(
                    2, -32603, f"agent connection to {agent_url} was lost during drop"
                )
                await a.aclose()
                assert await exchange(b_lines, b, request(2, "x", {"c": "b"})) == echo(
                    2, {"c": "b"}
                )
                await b.send_eof()
                assert await b_lines.rest() == b""
                await b.aclose()
                await proxy.event("connection closed", conn=2)
                proxy.terminate()
                assert await proxy.wait() == 0
            tg.cancel_scope.cancel()
    statuses = {e["conn"]: e["status"] for e in proxy.events if e["event"] == "connection closed"}
    assert statuses == {
        1: f"agent connection to {agent_url} lost",
        2: f"agent connection to {agent_url} closed",
    }


@pytest.mark.anyio
async def test_agent_that_cannot_start_is_reported_to_its_client(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-agent")
    with anyio.fail_after(TIMEOUT):
        async with listening("--listen", "tcp://127.0.0.1:0", agent=[missing]) as proxy:
            stream = await proxy.connect()
            # The agent is started at the client's first request, not at connect.
            await stream.send(request(1, "initialize", {}))
            assert await Lines(stream).rest() == (
                b'{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"'
                b"agent could not be started (" + missing.encode() + b": command not found) "
                b'during initialize"}}\n'
            )
            await stream.aclose()
            await proxy.event("connection closed", conn=1)
            proxy.terminate()
            assert await proxy.wait() == 0


# -- listening: safety --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ran = await run([*PROXY, "--listen", f"tcp://127.0.0.1:{port}", "--", *TINY])
    assert (ran.rc, ran.stdout) == (1, b"")
    assert _said_once(ran, "cannot listen") == (
        f"cannot listen on tcp://127.0.0.1:{port}: port {port} is already in use "
        "(another process is listening on it)"
    )


@pytest.mark.anyio
async def test_non_loopback_refused_without_allow_remote() -> None:
    ran = await run([*PROXY, "--listen", "tcp://0.0.0.0:0", "--", *TINY])
    assert (ran.rc, ran.stdout) == (2, b"")
    assert (
        b"acp-proxy: refusing to listen on tcp://0.0.0.0:0: 0.0.0.0 is not a loopback address "
        b"(anyone who can reach it can drive the agent); pass --allow-remote "
        b"(allow_remote: true in the config) to accept remote clients\n"
    ) in ran.stderr
    assert ran.events("listening") == []


@pytest.mark.anyio
async def test_allow_remote_binds_and_warns() -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening("--listen", "tcp://0.0.0.0:0", "--allow-remote", agent=TINY) as proxy:
            warning = await proxy.event(
                "listening on a non-loopback address: traffic is unauthenticated and "
                "unencrypted; anyone who can reach it can drive the agent"
            )
            assert warning["level"] == "warning"
            assert warning["addresses"] == ["0.0.0.0"]
            port = (await proxy.address()).rpartition(":")[2]
            stream = await anyio.connect_tcp("127.0.0.1", int(port))  # loopback only
            lines = Lines(stream)
            assert await exchange(lines, stream, request(1, "initialize", {})) == init_response(1)
            await stream.aclose()
            proxy.terminate()
            assert await proxy.wait() == 0


@pytest.mark.anyio
async def test_unix_socket_is_0600_and_removed_on_exit(tmp_path: Path) -> None:
    path = tmp_path / "acp.sock"
    with anyio.fail_after(TIMEOUT):
        async with listening("--listen", f"unix://{path}", agent=TINY) as proxy:
            assert await proxy.address() == f"unix://{path}"
            mode = os.lstat(path).st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) == 0o600
            stream = await proxy.connect()
            lines = Lines(stream)
            assert await exchange(lines, stream, request(1, "initialize", {})) == init_response(1)
            await stream.send_eof()
            assert await lines.rest() == b""
            await stream.aclose()
            proxy.terminate()
            assert await proxy.wait() == 0
    assert not path.exists()


@pytest.mark.anyio
async def test_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "acp.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(path))  # closed without unlink: nothing listens on the file
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    with anyio.fail_after(TIMEOUT):
        async with listening("--listen", f"unix://{path}", agent=TINY) as proxy:
            note = await proxy.event("replacing a stale socket file (nothing listening on it)")
            assert note["path"] == str(path)
            stream = await proxy.connect()
            lines = Lines(stream)
            assert await exchange(lines, stream, request(1, "initialize", {})) == init_response(1)
            await stream.aclose()
            proxy.terminate()
            assert await proxy.wait() == 0
    assert not path.exists()


@pytest.mark.anyio
async def test_live_socket_and_other_files_are_refused(tmp_path: Path) -> None:
    live = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX) as holder:
        holder.bind(str(live))
        holder.listen()
        ran = await run([*PROXY, "--listen", f"unix://{live}", "--", *TINY])
        assert (ran.rc, ran.stdout) == (1, b"")
        assert _said_once(ran, "cannot listen") == (
            f"cannot listen on unix://{live}: another process is listening on {live}"
        )
        assert stat.S_ISSOCK(os.lstat(live).st_mode)  # left alone
    plain = tmp_path / "plain.sock"
    plain.write_text("keep me")
    ran = await run([*PROXY, "--listen", f"unix://{plain}", "--", *TINY])
    assert ran.rc == 1
    assert _said_once(ran, "cannot listen") == (
        f"cannot listen on unix://{plain}: {plain} exists and is not a socket; "
        "refusing to replace it"
    )
    assert plain.read_text() == "keep me"


@pytest.mark.anyio
async def test_max_connections_refusal(tmp_path: Path) -> None:
    path = tmp_path / "acp.sock"
    refusal = (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"acp-proxy: too many '
        b'connections (max_connections 2); try again later"}}\n'
    )
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--listen", f"unix://{path}", "--max-connections", "2", agent=TINY
        ) as proxy:
            held = [await proxy.connect() for _ in range(2)]
            for stream in held:
                lines = Lines(stream)
                assert await exchange(lines, stream, request(1, "initialize", {})) == (
                    init_response(1)
                )
            extra = await proxy.connect()
            await extra.send(request(1, "initialize", {}))
            assert await Lines(extra).rest() == refusal
            await extra.aclose()
            assert (await proxy.event("connection refused: too many connections"))[
                "max_connections"
            ] == 2
            # Room again once a session ends.
            await held[0].aclose()
            await proxy.event("connection closed", conn=1)
            again = await proxy.connect()
            lines = Lines(again)
            assert await exchange(lines, again, request(1, "initialize", {})) == init_response(1)
            await again.aclose()
            await held[1].aclose()
            proxy.terminate()
            assert await proxy.wait() == 0
    assert proxy.count("connection opened") == 3


# -- shutdown -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_sigterm_with_sessions_open_ends_them_all(tmp_path: Path) -> None:
    path = tmp_path / "acp.sock"
    config = write_config(tmp_path / "fast.yaml", "agent:\n  grace_period: 0.3\n")
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", f"unix://{path}", agent=[*TINY, "stubborn"]
        ) as proxy:
            streams = [await proxy.connect() for _ in range(3)]
            pids = []
            for stream in streams:
                lines = Lines(stream)
                assert await exchange(lines, stream, request(1, "initialize", {})) == (
                    init_response(1)
                )
                pids.append(await agent_pid(lines, stream))
            proxy.terminate()
            # Each client sees its session end (EOF); the stubborn agents (SIGTERM ignored,
            # no exit at EOF) go through the whole ladder to SIGKILL.
            for stream in streams:
                assert await Lines(stream).rest() == b""
                await stream.aclose()
            assert await proxy.wait() == 0
    assert not any(alive(pid) for pid in pids)
    assert not path.exists()
    closed = [e for e in proxy.events if e["event"] == "connection closed"]
    assert [e["status"] for e in closed] == ["agent was killed by SIGKILL (status 137)"] * 3
    assert proxy.count("agent ignored SIGTERM; sending SIGKILL") == 3


# -- command line -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--listen", "tcp://localhost", "--", "a"], "--listen: 'tcp://localhost': missing :PORT"),
        (["--connect", "unix://x.sock"], "--connect: 'unix://x.sock': a Unix socket path must"),
        (["--connect", "tcp://127.0.0.1:1", "--", "a"], "an AGENT_CMD cannot be used with it"),
        (["--connect-timeout", "0", "--", "a"], "must be a positive number of seconds: '0'"),
        (["--max-connections", "0", "--", "a"], "must be positive: '0'"),
        (["--listen", "tcp://127.0.0.1:0"], "missing AGENT_CMD"),
    ],
)
@pytest.mark.anyio
async def test_socket_usage_errors(argv: list[str], message: str) -> None:
    ran = await run([*PROXY, *argv])
    assert (ran.rc, ran.stdout) == (2, b"")
    assert message in ran.stderr.decode()


@pytest.mark.anyio
async def test_command_line_wins_over_the_config_file(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "sockets.yaml",
        f"listen: unix://{tmp_path}/from-file.sock\nmax_connections: 3\n",
    )
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "tcp://127.0.0.1:0", agent=TINY
        ) as proxy:
            listening_event = await proxy.event("listening")
            assert listening_event["address"].startswith("tcp://127.0.0.1:")
            assert listening_event["max_connections"] == 3  # from the file
            proxy.terminate()
            assert await proxy.wait() == 0
    assert not (tmp_path / "from-file.sock").exists()


@pytest.mark.anyio
@pytest.mark.parametrize("pattern", [False, True])
async def test_listen_records_one_file_per_connection(tmp_path: Path, pattern: bool) -> None:
    # With --listen, each connection gets its own record, never two interleaved.
    target = str(tmp_path / "conn-{conn}.jsonl") if pattern else str(tmp_path)
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--listen", "tcp://127.0.0.1:0", "--record", target, agent=TINY
        ) as proxy:
            a, b = await proxy.connect(), await proxy.connect()
            a_lines, b_lines = Lines(a), Lines(b)
            assert await exchange(a_lines, a, request(1, "x", {"who": "a"})) == echo(
                1, {"who": "a"}
            )
            assert await exchange(b_lines, b, request(1, "x", {"who": "b"})) == echo(
                1, {"who": "b"}
            )
            assert await exchange(a_lines, a, request(2, "x", {"who": "a"})) == echo(
                2, {"who": "a"}
            )
            for stream, lines in ((a, a_lines), (b, b_lines)):
                await stream.send_eof()
                assert await lines.rest() == b""
                await stream.aclose()
            await proxy.event("connection closed", conn=1)
            await proxy.event("connection closed", conn=2)
            proxy.terminate()
            assert await proxy.wait() == 0
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) == 2
    if pattern:
        assert [f.name for f in files] == ["conn-1.jsonl", "conn-2.jsonl"]
    by_conn: dict[int, list[dict[str, Any]]] = {}
    for f in files:
        entries = [orjson.loads(x) for x in f.read_bytes().splitlines()]
        by_conn[entries[0]["conn"]] = entries
        assert entries[-1]["event"] == "end"
        assert entries[-1]["exit"]["code"] == 0
    who = {
        conn: [
            orjson.loads(e["raw"])["params"]["who"]
            for e in entries
            if e.get("dir") == "client_to_agent"
        ]
        for conn, entries in by_conn.items()
    }
    assert who == {1: ["a", "a"], 2: ["b"]}


@pytest.mark.anyio
async def test_an_ip_literal_is_resolved_without_a_thread_and_a_name_by_the_resolver() -> None:
    """Binding ``127.0.0.1`` (``--ui``, ``--metrics``, ``--listen``) or connecting to ``::1``
    needs no lookup: no worker thread is started for it (a thread cost every ``--ui`` its own
    malloc arena, and another to stop it at exit). A name still goes to the resolver."""
    before = {thread.ident for thread in threading.enumerate()}
    v4 = await resolve_tcp(parse_address("tcp://127.0.0.1:0", listen=True), passive=True)
    v6 = await resolve_tcp(parse_address("tcp://[::1]:8080", listen=False))
    assert {thread.ident for thread in threading.enumerate()} == before
    assert [(info[0], info[4]) for info in v4] == [(socket.AF_INET, ("127.0.0.1", 0))]
    assert [(info[0], info[4][:2]) for info in v6] == [(socket.AF_INET6, ("::1", 8080))]
    named = await resolve_tcp(parse_address("tcp://localhost:8080", listen=False))
    assert ("127.0.0.1", 8080) in [info[4][:2] for info in named]
