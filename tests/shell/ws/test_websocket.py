"""Agents reached over WebSocket: ``--listen ws://`` / ``wss://`` and ``--connect ws[s]://``,
with a real client library (``websockets``' own asyncio client) against the real CLI as a
subprocess, ``tests/tiny_agent.py`` as the agent. One JSON-RPC message per text frame, bytes
unchanged; the bearer token checked before the upgrade (401 before any ACP message: no agent is
ever started for a refused request); never in a log line or a record. Only 127.0.0.1 is ever
connected to; 0.0.0.0 is only asked for (and refused)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import anyio
import anyio.abc
import orjson
import pytest
from listen_harness import PROXY, TIMEOUT, TINY, Proxy, listening, stream_note
from proxy_harness import REPO, init_response, proxy_env, request, write_config
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

TOKEN = "s3cret-token-Zq9"


def token_config(tmp_path: Path, extra: str = "") -> str:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return write_config(tmp_path / "remote.yaml", f"auth:\n  token_file: {token}\n{extra}")


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def ws_url(proxy: Proxy) -> str:
    url = str((await proxy.event("listening"))["address"])
    assert url.startswith(("ws://127.0.0.1:", "wss://127.0.0.1:")), url
    return url


def no_token_in(proxy: Proxy, *paths: Path) -> None:
    assert TOKEN.encode() not in proxy.stderr
    for path in paths:
        assert TOKEN.encode() not in path.read_bytes(), path


# -- an authenticated session -------------------------------------------------------------------


RULES = """\
rules:
  - name: tag
    match: {direction: client_to_agent, method: session/new}
    target: message
    set_meta: {example.dev/via: ws}
record:
  path: RECORDS
"""


@pytest.mark.anyio
async def test_authenticated_session_end_to_end_with_rules_and_records(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    config = token_config(tmp_path, RULES.replace("RECORDS", str(records)))
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "ws://127.0.0.1:0/acp", agent=TINY
        ) as proxy:
            url = await ws_url(proxy)
            assert url.endswith("/acp")
            async with ws_connect(url, additional_headers=bearer(), compression=None) as ws:
                # One message per text frame, each byte as the agent wrote it (no "\n").
                await ws.send(
                    request(1, "initialize", {"protocolVersion": 2}).rstrip(b"\n"), text=True
                )
                assert await ws.recv(decode=False) == init_response(1).rstrip(b"\n")
                # The rule changed the request on its way: the agent's echo shows it.
                await ws.send(
                    b'{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/w"}}',
                    text=True,
                )
                assert orjson.loads(await ws.recv(decode=False)) == {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "result": {"echo": {"cwd": "/w", "_meta": {"example.dev/via": "ws"}}},
                }
                # Notifications then the response: each its own frame, bytes unchanged.
                await ws.send(
                    request(3, "_test/stream", {"count": 3, "tag": "é"}).rstrip(b"\n"), text=True
                )
                got = [await ws.recv(decode=False) for _ in range(4)]
                assert got == [stream_note("é").rstrip(b"\n")] * 3 + [
                    b'{"jsonrpc":"2.0","id":3,"result":{"streamed":3}}'
                ]
                # A big integer passes byte-exact (never re-serialized).
                big = b'{"jsonrpc":"2.0","id":4,"method":"x","params":{"n":%d}}' % 2**70
                await ws.send(big, text=True)
                expected = b'{"jsonrpc":"2.0","id":4,"result":{"echo":{"n":%d}}}' % 2**70
                assert await ws.recv(decode=False) == expected
            await proxy.event("connection closed", conn=1)
            proxy.terminate()
            assert await proxy.wait() == 0
    [record] = list(records.glob("*.jsonl"))
    entries = [orjson.loads(line) for line in record.read_bytes().splitlines()]
    sent = [e for e in entries if e.get("dir") == "client_to_agent"]
    assert [orjson.loads(e["raw"])["id"] for e in sent] == [1, 2, 3, 4]
    assert sent[1]["changed_by"] == ["rules:tag"]
    assert entries[-1]["event"] == "end"
    no_token_in(proxy, record)


# -- frames and lines ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_frames_map_to_lines_and_bounds_close_the_connection(tmp_path: Path) -> None:
    config = token_config(tmp_path, "max_frame_bytes: 4096\n")
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "ws://127.0.0.1:0/acp", agent=TINY
        ) as proxy:
            url = await ws_url(proxy)
            async with ws_connect(url, additional_headers=bearer(), max_size=None) as ws:
                # A message in three fragments is one line.
                parts = [b'{"jsonrpc":"2.0",', b'"id":1,"method":"x",', b'"params":{"f":3}}']
                await ws.send(iter(parts), text=True)
                assert (
                    await ws.recv(decode=False)
                    == b'{"jsonrpc":"2.0","id":1,"result":{"echo":{"f":3}}}'
                )
                # Pretty-printed: its line breaks become spaces (JSON whitespace), one line.
                pretty = (
                    b'{\n  "jsonrpc": "2.0",\n  "id": 2,\n  "method": "x",\n'
                    b'  "params": {"p": "a\\nb"}\n}'
                )
                await ws.send(pretty, text=True)
                assert (
                    await ws.recv(decode=False)
                    == b'{"jsonrpc":"2.0","id":2,"result":{"echo":{"p":"a\\nb"}}}'
                )
                # A binary frame is not ACP: close 1003.
                await ws.send(b'{"jsonrpc":"2.0","id":3,"method":"x"}')
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == 1003
            async with ws_connect(url, additional_headers=bearer(), max_size=None) as ws:
                # A message over max_frame_bytes: close 1009, the connection ends.
                over = b'{"jsonrpc":"2.0","id":1,"method":"x","params":"%s"}' % (b"y" * 5000)
                await ws.send(over, text=True)
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == 1009
            await proxy.event("connection closed", conn=2)
            proxy.terminate()
            assert await proxy.wait() == 0
    # The session of the first saw exactly the two messages; the second none.
    assert proxy.count("agent started") == 1


# -- refusals before the upgrade ----------------------------------------------------------------


async def raw_upgrade(url: str, head: dict[str, str], target: str = "/acp") -> bytes:
    """Send an upgrade request by hand (exactly these headers) and return the whole answer."""
    port = int(url.removeprefix("ws://127.0.0.1:").partition("/")[0])
    lines = [f"GET {target} HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade"]
    lines += ["Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    lines += [f"{k}: {v}" for k, v in head.items()]
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while not (answer.startswith(b"HTTP/1.1 101 ") and b"\r\n\r\n" in answer):
            try:
                answer += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
        return answer  # a refusal: up to its end; a 101: its head


@pytest.mark.anyio
async def test_missing_wrong_and_url_tokens_are_refused_before_any_message(
    tmp_path: Path,
) -> None:
    config = token_config(tmp_path)
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "ws://127.0.0.1:0/acp", agent=TINY
        ) as proxy:
            url = await ws_url(proxy)
            cases = {
                "missing": (url, {}),
                "wrong": (url, bearer("not-the-token")),
                "another scheme": (url, {"Authorization": f"Basic {TOKEN}"}),
                "in the URL": (f"{url}?token={TOKEN}", {}),
                "in the URL, and right in the header": (f"{url}?access_token={TOKEN}", bearer()),
            }
            for case, (target, headers) in cases.items():
                with pytest.raises(InvalidStatus) as caught:
                    async with ws_connect(target, additional_headers=headers):
                        pass
                response = caught.value.response
                assert response.status_code == 401, case
                assert response.headers["WWW-Authenticate"] == 'Bearer realm="acp-proxy"'
            # The answer, byte for byte after the date: a 401 and nothing of ACP.
            host = url.removeprefix("ws://").partition("/")[0]
            answer = await raw_upgrade(url, {"Host": host})
            status, _, rest = answer.partition(b"\r\n")
            assert status == b"HTTP/1.1 401 Unauthorized"
            assert rest.endswith(
                b'\r\nWWW-Authenticate: Bearer realm="acp-proxy"\r\n\r\n'
                b"a valid bearer token is required in the Authorization header (none given)\n"
            )
            refused = [e for e in proxy.events if e["event"] == "WebSocket upgrade refused"]
            assert [e["status"] for e in refused] == [401] * 6
            # A right token still opens a session afterwards.
            async with ws_connect(url, additional_headers=bearer()) as ws:
                await ws.send(request(1, "initialize", {}).rstrip(b"\n"), text=True)
                assert await ws.recv(decode=False) == init_response(1).rstrip(b"\n")
            await proxy.event("connection closed", conn=7)
            proxy.terminate()
            assert await proxy.wait() == 0
    # No refused connection ever started an agent (it starts at the first message).
    assert proxy.count("agent started") == 1
    closed = [e["status"] for e in proxy.events if e["event"] == "connection closed"]
    assert [s.partition(" a ")[0] for s in closed[:6]] == ["refused: 401"] * 6
    no_token_in(proxy)


@pytest.mark.anyio
async def test_host_origin_path_and_method_checks(tmp_path: Path) -> None:
    config = token_config(tmp_path)
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "ws://127.0.0.1:0/acp", agent=TINY
        ) as proxy:
            url = await ws_url(proxy)
            host = url.removeprefix("ws://").partition("/")[0]
            port = host.rpartition(":")[2]
            cases = [
                ({"Host": f"evil.example:{port}", **bearer()}, "/acp", b"421"),
                ({"Host": host, "Origin": "http://evil.example", **bearer()}, "/acp", b"403"),
                ({"Host": host, "Sec-Fetch-Site": "cross-site", **bearer()}, "/acp", b"403"),
                ({"Host": host, **bearer()}, "/other", b"404"),
                ({"Host": host, "Origin": f"http://{host}"}, "/acp", b"401"),
            ]
            for headers, target, status in cases:
                answer = await raw_upgrade(url, headers, target)
                assert answer.startswith(b"HTTP/1.1 " + status + b" "), (headers, answer)
            # Same origin, with the token: the upgrade.
            answer = await raw_upgrade(url, {"Host": host, "Origin": f"http://{host}", **bearer()})
            assert answer.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
            proxy.terminate()
            assert await proxy.wait() == 0
    assert proxy.count("agent started") == 0
    no_token_in(proxy)


async def read_all(stream: anyio.abc.ByteStream) -> bytes:
    got = b""
    while True:
        try:
            got += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return got


@pytest.mark.anyio
async def test_handshake_timeout_and_connection_limit(tmp_path: Path) -> None:
    config = token_config(tmp_path, "handshake_timeout: 0.5\nmax_connections: 1\n")
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "ws://127.0.0.1:0/acp", agent=TINY
        ) as proxy:
            url = await ws_url(proxy)
            port = int(url.removeprefix("ws://127.0.0.1:").partition("/")[0])
            async with await anyio.connect_tcp("127.0.0.1", port) as silent:
                await proxy.event("connection opened", conn=1)
                # Over max_connections: an HTTP 503 at once (the slot is the silent one's).
                async with await anyio.connect_tcp("127.0.0.1", port) as second:
                    answer = await read_all(second)
                assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
                assert answer.endswith(
                    b"\r\n\r\ntoo many connections (max_connections 1); try again later\n"
                )
                # Silent past handshake_timeout: closed without a word.
                assert await read_all(silent) == b""
            closed = await proxy.event("connection closed", conn=1)
            assert closed["status"] == "handshake timeout: no upgrade within 0.5 s"
            # Part of a request head by then: a 400.
            async with await anyio.connect_tcp("127.0.0.1", port) as slow:
                await slow.send(b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                answer = await read_all(slow)
            assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
            assert answer.endswith(b"\r\n\r\nno whole request in time\n")
            await proxy.event("connection closed", conn=2)
            proxy.terminate()
            assert await proxy.wait() == 0
    assert proxy.count("agent started") == 0
    assert proxy.count("connection refused: too many connections") == 1


# -- refusing to start --------------------------------------------------------------------------


def start(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*PROXY, *args, "--", *TINY],
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )


def test_non_loopback_listener_without_auth_refuses_to_start(tmp_path: Path) -> None:
    ran = start("--listen", "ws://0.0.0.0:0/acp")
    assert ran.returncode == 2
    assert ran.stderr.decode().endswith(
        "acp-proxy: refusing to listen on tcp://0.0.0.0:0: 0.0.0.0 is not a loopback address "
        "(no auth is configured: anyone who can reach it could drive the agent); set auth: "
        "{token_file: FILE} in the config (docs/remote.md)\n"
    )
    # With a token but over plain ws://, the token would cross the network readable.
    ran = start("--config", token_config(tmp_path), "--listen", "ws://0.0.0.0:0/acp")
    assert ran.returncode == 2
    assert "ws:// is unencrypted" in ran.stderr.decode()
    # wss:// without a certificate.
    ran = start("--config", token_config(tmp_path), "--listen", "wss://127.0.0.1:0/acp")
    assert ran.returncode == 2
    assert ran.stderr.decode().endswith(
        "acp-proxy: wss://127.0.0.1:0/acp: a wss:// listener needs tls: {cert: FILE, key: FILE} "
        "in the config\n"
    )
    # A token file that is not there.
    config = write_config(tmp_path / "gone.yaml", f"auth: {{token_file: {tmp_path / 'nope'}}}\n")
    ran = start("--config", config, "--listen", "ws://127.0.0.1:0/acp")
    assert ran.returncode == 2
    assert f"auth.token_file {tmp_path / 'nope'}: No such file or directory" in ran.stderr.decode()


# -- wss:// with a certificate made here; --connect from a stdio editor ----------------------


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by the ``openssl`` command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=acp-test",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=TIMEOUT,
    )
    return cert, key


@pytest.mark.anyio
async def test_wss_session_and_connect_from_a_stdio_editor(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_config = token_config(tmp_path, f"tls:\n  cert: {cert}\n  key: {key}\n")
    # The editor's side reads the token from an environment variable and trusts the cert.
    editor_config = write_config(
        tmp_path / "editor.yaml", f"auth: {{token_env: ACP_TEST_TOKEN}}\ntls: {{ca: {cert}}}\n"
    )
    trust = ssl.create_default_context(cafile=str(cert))
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", server_config, "--listen", "wss://127.0.0.1:0/acp", agent=TINY
        ) as proxy:
            url = await ws_url(proxy)
            # A real client library over TLS.
            async with ws_connect(url, additional_headers=bearer(), ssl=trust) as ws:
                await ws.send(request(1, "initialize", {}).rstrip(b"\n"), text=True)
                assert await ws.recv(decode=False) == init_response(1).rstrip(b"\n")
            # Without trusting the certificate, no connection.
            with pytest.raises(ssl.SSLCertVerificationError):
                async with ws_connect(url, additional_headers=bearer()):
                    pass
            # acp-proxy --connect wss://: an editor on stdio reaches the remote agent.
            script = request(1, "initialize", {"protocolVersion": 2}) + request(2, "x", {"a": 1})
            editor = await anyio.run_process(
                [*PROXY, "--config", editor_config, "--connect", url],
                input=script,
                env=proxy_env(ACP_TEST_TOKEN=TOKEN),
                cwd=str(REPO),
                check=False,
            )
            assert editor.returncode == 0, editor.stderr.decode()
            assert (
                editor.stdout
                == init_response(1) + b'{"jsonrpc":"2.0","id":2,"result":{"echo":{"a":1}}}\n'
            )
            assert TOKEN.encode() not in editor.stderr
            # Its token wrong: the server's 401, said on stderr, exit 1.
            editor = await anyio.run_process(
                [*PROXY, "--config", editor_config, "--connect", url],
                input=script,
                env=proxy_env(ACP_TEST_TOKEN="wrong"),
                cwd=str(REPO),
                check=False,
            )
            assert editor.returncode == 1
            assert editor.stdout == b""
            assert (
                f"acp-proxy: cannot connect to the agent at {url}: the server refused the "
                "WebSocket upgrade: 401 Unauthorized (a valid bearer token is required in the "
                "Authorization header (not the token))\n"
            ) in editor.stderr.decode()
            proxy.terminate()
            assert await proxy.wait() == 0
    assert proxy.count("agent started") == 2
    assert proxy.count("TLS handshake failed") == 1
    no_token_in(proxy)


# -- the config: addresses, check-config --------------------------------------------------------


def checked(tmp_path: Path, text: str, **environ: str) -> tuple[list[str], str]:
    from acp_proxy.cli.commands import run_checks
    from acp_proxy.config import explain_config, load_config

    path = write_config(tmp_path / "c.yaml", text)
    config = load_config(path, environ)
    return run_checks(config), explain_config(config)


def test_check_config_refuses_what_the_listener_refuses(tmp_path: Path) -> None:
    problems, _ = checked(tmp_path, "listen: ws://0.0.0.0:8443/acp\n")
    assert problems == [
        f"{tmp_path / 'c.yaml'}:1: listen: 0.0.0.0 is not a loopback address (no auth is "
        "configured: anyone who can reach it could drive the agent); the proxy refuses to listen "
        "there: set auth: {token_file: FILE} in the config (docs/remote.md)"
    ]
    token = tmp_path / "token"
    token.write_text(TOKEN)
    problems, explained = checked(
        tmp_path,
        f"listen: wss://0.0.0.0:8443/acp\nauth: {{token_file: {token}}}\n"
        f"tls: {{cert: {tmp_path / 'cert.pem'}, key: {tmp_path / 'key.pem'}}}\n",
    )
    assert problems == [
        f"{tmp_path / 'c.yaml'}:3: tls: cannot read {tmp_path / 'cert.pem'}",
        f"{tmp_path / 'c.yaml'}:3: tls: cannot read {tmp_path / 'key.pem'}",
    ]
    assert f"  auth: bearer token from the file {token}\n" in explained + "\n"
    assert TOKEN not in explained
    # --connect over wss, the token in a variable that is not set.
    problems, explained = checked(
        tmp_path, "connect: wss://127.0.0.1:8443/acp\nauth: {token_env: ACP_TEST_TOKEN}\n"
    )
    assert problems == [
        f"{tmp_path / 'c.yaml'}:2: auth: the variable ACP_TEST_TOKEN (auth.token_env) is not "
        "set or empty"
    ]
    assert "  tls: none (wss:// connect trusts the system's authorities)" in explained


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "connect: ws://127.0.0.1:8443/acp?token=x\n",
            "connect: a WebSocket address has no query (a token goes in auth:)",
        ),
        (
            "listen: ws://127.0.0.1/acp\n",
            'listen: expected an address such as "tcp://127.0.0.1:7777" or '
            '"unix:///run/acp.sock", got "ws://127.0.0.1/acp"',
        ),
        # The token itself never goes in the file.
        (
            "auth: {token: x}\n",
            'auth.token: unknown key "token"; did you mean "token_env"? Valid keys: token_file, '
            "token_env",
        ),
    ],
)
def test_config_addresses_and_sections(tmp_path: Path, text: str, error: str) -> None:
    from acp_proxy.config import ConfigError, load_config

    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path / "c.yaml", text), {})
    assert error in str(caught.value)


# -- keeping a quiet session open ---------------------------------------------------------------


@pytest.mark.anyio
async def test_a_quiet_session_is_pinged_and_goes_on(tmp_path: Path) -> None:
    """``ws_ping_interval``: after that long without a frame, the listener pings (what keeps a
    load balancer from closing a quiet session); the client's pongs are taken, and the session
    goes on exactly."""
    from websockets.client import ClientProtocol
    from websockets.frames import Frame, Opcode
    from websockets.http11 import Response
    from websockets.uri import parse_uri

    config = token_config(tmp_path, "ws_ping_interval: 0.2\n")
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "ws://127.0.0.1:0/acp", agent=TINY
        ) as proxy:
            url = await ws_url(proxy)
            stream = await anyio.connect_tcp("127.0.0.1", int(url.split(":")[2].split("/")[0]))
            client = ClientProtocol(parse_uri(url))
            opening = client.connect()
            opening.headers["Authorization"] = f"Bearer {TOKEN}"
            client.send_request(opening)
            await stream.send(b"".join(client.data_to_send()))

            async def events() -> list[object]:
                while not (got := client.events_received()):
                    client.receive_data(await stream.receive())
                await stream.send(b"".join(client.data_to_send()))  # pongs
                return list(got)

            (answer,) = await events()
            assert isinstance(answer, Response) and answer.status_code == 101
            client.send_text(request(1, "initialize", {"protocolVersion": 2}).rstrip(b"\n"))
            await stream.send(b"".join(client.data_to_send()))
            frames: list[Frame] = []
            while not any(f.opcode is Opcode.PING for f in frames):
                frames += [e for e in await events() if isinstance(e, Frame)]
            texts = [f.data for f in frames if f.opcode is Opcode.TEXT]
            assert texts == [init_response(1).rstrip(b"\n")]
            assert {f.opcode for f in frames} == {Opcode.TEXT, Opcode.PING}
            client.send_text(b'{"jsonrpc":"2.0","id":2,"method":"x","params":{"k":1}}')
            await stream.send(b"".join(client.data_to_send()))
            later: list[Frame] = []
            while not any(f.opcode is Opcode.TEXT for f in later):
                later += [e for e in await events() if isinstance(e, Frame)]
            texts = [f.data for f in later if f.opcode is Opcode.TEXT]
            assert texts == [b'{"jsonrpc":"2.0","id":2,"result":{"echo":{"k":1}}}']
            await stream.aclose()
            await proxy.event("connection closed", conn=1)
            proxy.terminate()
            assert await proxy.wait() == 0
