"""Metrics and health endpoints: the real CLI as a subprocess, scraped over HTTP
during and after a scripted session, parsed with ``prometheus_client.parser``. Counts are exact:
each equals what the script sent."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from proxy_harness import FAKE_AGENT, REPO, TESTS, Lines, init_response, proxy_env, request, run
from telemetry_harness import LogReader, host_port, http_get, scrape, total, value

from acp_proxy.telemetry.labels import (
    ACP_METHODS,
    code_label,
    exit_status_label,
    method_label,
    not_parsed_label,
)

PROXY = [sys.executable, "-m", "acp_proxy", "--log-format", "json"]
TIMEOUT = 20.0
C2A, A2C = "client_to_agent", "agent_to_client"


def _frame(message: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", **message})


# The scripted session: the client's frames and what the (replaying) agent answers to each.
INIT = request(0, "initialize", {"protocolVersion": 2}).rstrip(b"\n")
NEW = request(1, "session/new", {"cwd": "/w", "mcpServers": []}).rstrip(b"\n")
PROMPT = request(2, "session/prompt", {"sessionId": "s1", "prompt": []}).rstrip(b"\n")
READ_ANSWER = _frame({"id": "a1", "result": {"content": "x"}})
VENDOR = request(3, "_vendor/thing", {}).rstrip(b"\n")
PROMPT_UNANSWERED = request(4, "session/prompt", {"sessionId": "s1", "prompt": []}).rstrip(b"\n")
CANCEL = _frame({"method": "session/cancel", "params": {"sessionId": "s1"}})

UPDATE = _frame(
    {
        "method": "session/update",
        "params": {"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk"}},
    }
)
SCRIPT = [
    (INIT, [init_response(0).rstrip(b"\n")]),
    (NEW, [_frame({"id": 1, "result": {"sessionId": "s1"}})]),
    (
        PROMPT,
        [
            UPDATE,
            UPDATE,
            _frame({"id": "a1", "method": "fs/read_text_file", "params": {"path": "/w/x"}}),
        ],
    ),
    (READ_ANSWER, [_frame({"id": 2, "result": {"stopReason": "end_turn"}})]),
    (VENDOR, [_frame({"id": 3, "error": {"code": -32601, "message": "no such method"}})]),
    (CANCEL, []),
    (PROMPT_UNANSWERED, []),
]
CLIENT_FRAMES = len(SCRIPT)
AGENT_FRAMES = sum(len(answers) for _, answers in SCRIPT)
CONFIG = """\
rules:
  - name: tag-new
    match: {method: session/new}
    target: message
    set_meta: {example.dev/tag: 1}
"""


def _replay_file(tmp_path: Path) -> Path:
    path = tmp_path / "script.txt"
    lines = []
    for client, answers in SCRIPT:
        lines.append(b"C " + client)
        lines.extend(b"A " + a for a in answers)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _check_counts(samples: dict[Any, float], *, finished: bool) -> None:
    """What the script sent, counted exactly."""
    assert value(samples, "acp_proxy_frames_total", direction=C2A) == CLIENT_FRAMES
    assert value(samples, "acp_proxy_frames_total", direction=A2C) == AGENT_FRAMES
    sent = sum(len(c) for c, _ in SCRIPT)
    assert value(samples, "acp_proxy_frame_bytes_total", direction=C2A) == sent
    received = sum(len(a) for _, answers in SCRIPT for a in answers)
    assert value(samples, "acp_proxy_frame_bytes_total", direction=A2C) == received
    assert value(samples, "acp_proxy_rewritten_total", rule="rules:tag-new") == 1
    assert (
        value(
            samples,
            "acp_proxy_messages_total",
            direction=A2C,
            type="notification",
            method="session/update",
        )
        == 2
    )
    assert (
        value(samples, "acp_proxy_messages_total", direction=C2A, type="request", method="other")
        == 1
    )

    def count(direction: str, method: str, outcome: str) -> float:
        return value(
            samples,
            "acp_proxy_request_duration_seconds_count",
            direction=direction,
            method=method,
            outcome=outcome,
        )

    assert count(C2A, "initialize", "result") == 1
    assert count(C2A, "session/new", "result") == 1
    assert count(C2A, "session/prompt", "result") == 1
    assert count(C2A, "other", "error") == 1
    # Successes carry no error code: errors are counted on their own, by code.
    errors = {
        labels: v
        for (name, labels), v in samples.items()
        if name == "acp_proxy_request_errors_total"
    }
    assert errors == {
        (("direction", C2A), ("error_code", "-32601"), ("method", "other")): 1.0,
    }
    # v2: the prompt response only accepts the prompt; the second prompt supersedes the first
    # turn, which the agent never ended; the second ends with the session.
    turns = "acp_proxy_turn_duration_seconds_count"
    assert value(samples, turns, stop_reason="superseded") == 1
    assert value(samples, turns, stop_reason="session_end") == (1 if finished else 0)
    assert value(samples, "acp_proxy_cancellations_total") == 1
    assert count(A2C, "fs/read_text_file", "result") == 1
    answered = 5
    # Every request is in the histogram exactly once; the last prompt only once it has ended.
    assert total(samples, "acp_proxy_request_duration_seconds_count") == answered + finished
    assert count(C2A, "session/prompt", "no_answer") == (1 if finished else 0)
    inf = total(samples, "acp_proxy_request_duration_seconds_bucket", le="+Inf")
    assert inf == answered + finished
    assert value(samples, "acp_proxy_protocol_versions_total", version="2") == 1
    assert value(samples, "acp_proxy_sessions_total") == 1


async def _wait_frames(address: str, c2a: int) -> dict[Any, float]:
    # The proxy handles a line after we wrote it: wait until it has (bounded, not timed).
    with anyio.fail_after(TIMEOUT):
        while True:
            samples = await scrape(address)
            if value(samples, "acp_proxy_frames_total", direction=C2A) >= c2a:
                return samples
            await anyio.sleep(0.02)


async def _drive(stdin: Any, lines: Lines, steps: list[tuple[bytes, list[bytes]]]) -> None:
    """Send these steps' client frames, reading the agent's answers to each."""
    for client, answers in steps:
        await stdin.send(client + b"\n")
        for want in answers:
            with anyio.fail_after(TIMEOUT):
                got = await lines.line()
            if want.startswith(b'{"jsonrpc":"2.0","id":1,"result"'):
                assert got == want + b"\n"


@pytest.mark.anyio
async def test_stdio_scrape_during_session_and_readyz_flips_at_initialize(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "rules.yaml"
    cfg.write_text(CONFIG)
    cmd = [
        *PROXY,
        "--config",
        str(cfg),
        "--metrics",
        "tcp://127.0.0.1:0",
        "--",
        sys.executable,
        str(FAKE_AGENT),
        "--replay",
        str(_replay_file(tmp_path)),
        "--exit-code",
        "3",
    ]
    async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
        assert proc.stdin and proc.stdout and proc.stderr
        log = LogReader(proc.stderr)
        address = (await log.event("serving metrics"))["address"]
        assert (await http_get(address, "/healthz"))[0] == 200
        status, _, body = await http_get(address, "/readyz")
        assert (status, body) == (503, b"not ready: the agent has not answered initialize\n")
        lines = Lines(proc.stdout)
        await _drive(proc.stdin, lines, SCRIPT[:1])
        # The observer saw the answer before the proxy wrote it: ready now, exactly.
        assert await http_get(address, "/readyz") == (
            200,
            (await http_get(address, "/readyz"))[1],
            b"ready\n",
        )
        await _drive(proc.stdin, lines, SCRIPT[1:])
        samples = await _wait_frames(address, CLIENT_FRAMES)
        _check_counts(samples, finished=False)
        assert value(samples, "acp_proxy_pending_requests", direction=C2A) == 1
        assert value(samples, "acp_proxy_pending_requests", direction=A2C) == 0
        assert value(samples, "acp_proxy_open_sessions") == 1
        assert value(samples, "acp_proxy_ready") == 1
        assert value(samples, "acp_proxy_build_info", version=_version()) == 1
        assert value(samples, "process_open_fds") > 0
        await proc.stdin.aclose()
        rest = await lines.rest()
        # The unanswered prompt got the proxy's error.
        assert b'"id":4' in rest and b"-32603" in rest
        with anyio.fail_after(TIMEOUT):
            assert await proc.wait() == 3


def _version() -> str:
    from acp_proxy import __version__

    return __version__


@pytest.mark.anyio
async def test_listen_scrape_after_session(tmp_path: Path) -> None:
    """With --listen the process outlives its sessions: after one ended, its counts stay,
    the sessions gauge is back to 0, and readiness is the listener's."""
    cfg = tmp_path / "rules.yaml"
    cfg.write_text(CONFIG)
    cmd = [
        *PROXY,
        "--config",
        str(cfg),
        "--listen",
        "tcp://127.0.0.1:0",
        "--metrics",
        "tcp://127.0.0.1:0",
        "--",
        sys.executable,
        str(FAKE_AGENT),
        "--replay",
        str(_replay_file(tmp_path)),
        "--exit-code",
        "3",
    ]
    async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
        assert proc.stderr
        log = LogReader(proc.stderr)
        metrics = (await log.event("serving metrics"))["address"]
        listen = (await log.event("listening"))["address"]
        with anyio.fail_after(TIMEOUT):
            while (await http_get(metrics, "/readyz"))[0] != 200:
                await anyio.sleep(0.02)
        host, _, port = listen.removeprefix("tcp://").rpartition(":")
        async with await anyio.connect_tcp(host, int(port)) as conn:
            lines = Lines(conn)
            await _drive(conn, lines, SCRIPT)
            await conn.send_eof()
            rest = await lines.rest()
            assert b'"id":4' in rest and b"-32603" in rest
        await log.event("connection closed")
        samples = await scrape(metrics)
        _check_counts(samples, finished=True)
        assert value(samples, "acp_proxy_open_sessions") == 0
        assert value(samples, "acp_proxy_pending_requests", direction=C2A) == 0
        assert value(samples, "acp_proxy_agent_exits_total", status="exit_3") == 1
        assert value(samples, "acp_proxy_generated_frames_total", direction=A2C) == 1
        written = sum(len(a) + 1 for _, answers in SCRIPT for a in answers)
        assert value(samples, "acp_proxy_written_bytes_total", direction=A2C) == written + len(
            rest.split(b"\n")[-2] + b"\n"
        )
        assert value(samples, "acp_proxy_ready") == 1
        proc.terminate()
        with anyio.fail_after(TIMEOUT):
            assert await proc.wait() == 0


@pytest.mark.anyio
async def test_http_paths_and_methods(tmp_path: Path) -> None:
    cmd = [*PROXY, "--metrics", "tcp://127.0.0.1:0", "--", sys.executable, str(FAKE_AGENT)]
    async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
        assert proc.stderr and proc.stdin
        log = LogReader(proc.stderr)
        address = (await log.event("serving metrics"))["address"]
        status, head, body = await http_get(address, "/nope")
        assert (status, body) == (404, b"/metrics, /healthz, /readyz\n")
        status, head, body = await http_get(address, "/healthz", method="HEAD")
        assert (status, body) == (200, b"")
        assert b"Content-Length: 3" in head
        status, _, _ = await http_get(address, "/metrics", method="POST")
        assert status == 405
        status, head, _ = await http_get(address, "/metrics")
        assert status == 200
        assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8" in head
        await proc.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            assert await proc.wait() == 0


@pytest.mark.anyio
async def test_healthz_answers_within_a_second_beside_hundreds_of_slow_connections() -> None:
    """300 connections that sent part of a request head and then nothing (a scraper that hangs,
    a slow-loris) never keep /healthz from answering: the oldest unfinished ones are closed
    beyond the cap on open connections, and a probe is answered at once."""
    from acp_proxy.shell.telemetry.metrics_server import MAX_CONNECTIONS

    cmd = [*PROXY, "--metrics", "tcp://127.0.0.1:0", "--", sys.executable, str(FAKE_AGENT)]
    async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
        assert proc.stderr and proc.stdin
        log = LogReader(proc.stderr)
        address = (await log.event("serving metrics"))["address"]
        host, port = host_port(address)
        slow = []
        try:
            for _ in range(MAX_CONNECTIONS + 44):
                stream = await anyio.connect_tcp(host, port)
                await stream.send(b"GET /metrics HT")  # the request line, never finished
                slow.append(stream)
            for _ in range(5):
                with anyio.fail_after(1.0):
                    status, _, body = await http_get(address, "/healthz")
                assert (status, body) == (200, b"ok\n")
            # The oldest slow connection was closed to make room (EOF, no answer).
            with anyio.fail_after(TIMEOUT), pytest.raises(anyio.EndOfStream):
                await slow[0].receive()
        finally:
            for stream in slow:
                await stream.aclose()
        await proc.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            assert await proc.wait() == 0


@pytest.mark.anyio
async def test_metrics_refuses_a_non_loopback_address_with_its_own_consent() -> None:
    agent = ["--", sys.executable, "-c", "1"]
    ran = await run([*PROXY, "--metrics", "tcp://0.0.0.0:0", *agent])
    assert ran.rc == 2
    line = ran.stderr.decode().splitlines()[-1]
    # What the metrics port exposes (not "driving the agent"), and its own flag.
    assert line == (
        "acp-proxy: --metrics: refusing to listen on tcp://0.0.0.0:0: 0.0.0.0 is not a "
        "loopback address (anyone who can reach it can read the metrics and the health of "
        "the proxy); pass --metrics-allow-remote (metrics_allow_remote: true in the config) "
        "to serve it there"
    )
    # --allow-remote is the ACP listener's consent, not the metrics port's.
    ran = await run([*PROXY, "--metrics", "tcp://0.0.0.0:0", "--allow-remote", *agent])
    assert ran.rc == 2
    ran = await run([*PROXY, "--metrics", "tcp://0.0.0.0:0", "--metrics-allow-remote", *agent])
    assert ran.rc == 0, ran.stderr


@pytest.mark.anyio
async def test_metrics_bad_url_is_a_usage_error() -> None:
    ran = await run([*PROXY, "--metrics", "ftp://x", "--", sys.executable, "-c", "1"])
    assert ran.rc == 2
    assert b"--metrics: 'ftp://x': expected tcp://HOST:PORT" in ran.stderr


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("127.0.0.1:9464", "tcp://127.0.0.1:9464"),
        ("http://127.0.0.1:9464", "tcp://127.0.0.1:9464"),
        ("http://127.0.0.1:9464/", "tcp://127.0.0.1:9464"),
        ("http://[::1]:9464/metrics", "tcp://[::1]:9464"),
        ("localhost:0", "tcp://localhost:0"),
        ("tcp://127.0.0.1:1", "tcp://127.0.0.1:1"),
        ("unix:///run/m.sock", "unix:///run/m.sock"),
        ("https://127.0.0.1:9464", "https://127.0.0.1:9464"),  # not served: left to be refused
    ],
)
def test_endpoint_url_forms(given: str, url: str) -> None:
    from acp_proxy.telemetry.endpoint import endpoint_url

    assert endpoint_url(given) == url


@pytest.mark.anyio
async def test_metrics_accepts_host_port_and_http_forms(tmp_path: Path) -> None:
    for form in ("127.0.0.1:0", "http://127.0.0.1:0/"):
        ran = await run([*PROXY, "--metrics", form, "--", sys.executable, "-c", "1"])
        assert ran.rc == 0, ran.stderr
        assert b'{"address":"tcp://127.0.0.1:' in ran.stderr


# -- pure: bounded labels --------------------------------------------------------------------------


def test_acp_methods_are_the_schemas_methods() -> None:
    found: set[str] = set()
    for path in (TESTS / "schemas").glob("v*/schema*.json"):
        found.update(re.findall(r'"x-method":\s*"([^"]+)"', path.read_text(encoding="utf-8")))
    assert found == ACP_METHODS


@pytest.mark.parametrize(
    ("method", "label"),
    [("session/prompt", "session/prompt"), ("_vendor/x", "other"), (None, "other"), ("", "other")],
)
def test_method_label(method: str | None, label: str) -> None:
    assert method_label(method) == label


@pytest.mark.parametrize(
    ("code", "label"),
    [
        (-32601, "-32601"),
        (-32000, "-32000"),
        (-32099, "-32099"),
        (-32800, "-32800"),
        (-32100, "other"),
        (1, "other"),
        ("-32601", "other"),
        (True, "other"),
        (None, "other"),
    ],
)
def test_code_label(code: object, label: str) -> None:
    assert code_label(code) == label


@pytest.mark.parametrize(
    ("rc", "label"), [(0, "exit_0"), (3, "exit_3"), (-9, "signal_SIGKILL"), (-15, "signal_SIGTERM")]
)
def test_exit_status_label(rc: int, label: str) -> None:
    assert exit_status_label(rc) == label


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        ("over the parse budget of 10 bytes", "parse_budget"),
        ("not parseable JSON: unexpected character", "invalid_json"),
        ("batch could not be scanned", "batch"),
    ],
)
def test_not_parsed_label(reason: str, label: str) -> None:
    assert not_parsed_label(reason) == label


def test_config_key_and_schema() -> None:
    from acp_proxy.config import parse_config

    config = parse_config("metrics: tcp://127.0.0.1:9464\n", "x.yaml", {})
    assert config.metrics == "tcp://127.0.0.1:9464"
    schema = json.loads((REPO / "config" / "acp-proxy.schema.json").read_text())
    assert "metrics" in schema["properties"] and "tracing" in schema["properties"]


# -- a real Prometheus server ----------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.anyio
async def test_a_real_prometheus_scrapes_the_proxy(tmp_path: Path) -> None:
    """Debian's ``prometheus`` scrapes the proxy; its HTTP API returns the frame counter."""
    import shutil

    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("ACP_PROXY_REQUIRE_PROMETHEUS") == "1":  # .ci/run installed it
            pytest.fail("ACP_PROXY_REQUIRE_PROMETHEUS=1, but no prometheus binary on PATH")
        print("skipped: no prometheus binary (apt-get install prometheus)")
        pytest.skip("no prometheus binary on PATH (Debian package `prometheus`)")
    cmd = [
        *PROXY,
        "--listen",
        "tcp://127.0.0.1:0",
        "--metrics",
        "tcp://127.0.0.1:0",
        "--",
        sys.executable,
        str(FAKE_AGENT),
        "--replay",
        str(_replay_file(tmp_path)),
    ]
    async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
        assert proc.stderr
        log = LogReader(proc.stderr)
        metrics = (await log.event("serving metrics"))["address"]
        listen = (await log.event("listening"))["address"]
        host, _, port = listen.removeprefix("tcp://").rpartition(":")
        async with await anyio.connect_tcp(host, int(port)) as conn:
            lines = Lines(conn)
            await _drive(conn, lines, SCRIPT)
            await conn.send_eof()
            await lines.rest()
        await log.event("connection closed")
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: acp-proxy\n"
            f"    static_configs: [{{targets: ['{metrics.removeprefix('tcp://')}']}}]\n"
        )
        web = f"127.0.0.1:{_free_port()}"
        prom_cmd = [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address={web}",
        ]
        query = (
            "/api/v1/query?query=" + "acp_proxy_frames_total%7Bdirection%3D%22client_to_agent%22%7D"
        )
        async with await anyio.open_process(prom_cmd, stdout=None, stderr=None) as prom:
            try:
                result: list[Any] = []
                with anyio.fail_after(60):
                    while not result:
                        await anyio.sleep(0.5)
                        try:
                            status, _, body = await http_get(f"tcp://{web}", query)
                        except OSError:
                            continue
                        if status == 200:
                            result = json.loads(body)["data"]["result"]
                assert result[0]["metric"]["job"] == "acp-proxy"
                assert result[0]["value"][1] == str(CLIENT_FRAMES)
            finally:
                prom.terminate()
                with anyio.fail_after(TIMEOUT):
                    await prom.wait()
        proc.terminate()
        with anyio.fail_after(TIMEOUT):
            assert await proc.wait() == 0


@pytest.mark.anyio
async def test_dropped_oversize_diverted_and_failures_by_reason(tmp_path: Path) -> None:
    """The exceptional paths, each counted once under its reason: a banner line diverted, an
    oversize request (answered by the proxy, not timed), a fail-closed middleware."""
    cfg = tmp_path / "proxy.yaml"
    cfg.write_text(
        "max_frame_bytes: 1000\n"
        "middleware:\n"
        "  - use: custom_middleware:Boom\n"
        "    fail_closed: true\n"
    )
    cmd = [
        *PROXY,
        "--config",
        str(cfg),
        "--listen",
        "tcp://127.0.0.1:0",
        "--metrics",
        "tcp://127.0.0.1:0",
        "--",
        sys.executable,
        str(FAKE_AGENT),
        "--banner",
        "Starting agent v1.0",
    ]
    env = proxy_env(PYTHONPATH=f"{REPO}:{TESTS}")
    async with await anyio.open_process(cmd, env=env, cwd=str(REPO)) as proc:
        assert proc.stderr
        log = LogReader(proc.stderr)
        metrics = (await log.event("serving metrics"))["address"]
        listen = (await log.event("listening"))["address"]
        host, _, port = listen.removeprefix("tcp://").rpartition(":")
        async with await anyio.connect_tcp(host, int(port)) as conn:
            lines = Lines(conn)
            await conn.send(request(0, "initialize", {"protocolVersion": 2}))
            with anyio.fail_after(TIMEOUT):
                assert await lines.line() == init_response(0)
            big = request(1, "session/new", {"cwd": "/" + "x" * 2000, "mcpServers": []})
            await conn.send(big)
            with anyio.fail_after(TIMEOUT):
                assert b'"id":1,"error"' in await lines.line()
            await conn.send(request(2, "session/new", {"cwd": "/w", "mcpServers": []}))
            with anyio.fail_after(TIMEOUT):
                assert b'"id":2,"error"' in await lines.line()
            await conn.send_eof()
            await lines.rest()
        await log.event("connection closed")
        samples = await scrape(metrics)
        proc.terminate()
        with anyio.fail_after(TIMEOUT):
            assert await proc.wait() == 0
    assert value(samples, "acp_proxy_diverted_total", kind="text") == 1
    assert value(samples, "acp_proxy_oversize_total", direction=C2A) == 1
    assert value(samples, "acp_proxy_dropped_total", reason="oversize", rule="") == 1
    assert value(samples, "acp_proxy_dropped_total", reason="fail_closed", rule="Boom") == 1
    assert value(samples, "acp_proxy_middleware_failures_total", middleware="Boom") == 1
    assert value(samples, "acp_proxy_frames_total", direction=C2A) == 3
    # Only initialize reached the agent and got its answer: the others are not timed.
    assert total(samples, "acp_proxy_request_duration_seconds_count") == 1
    assert value(samples, "acp_proxy_frame_bytes_total", direction=C2A) == sum(
        len(f) - 1
        for f in (
            request(0, "initialize", {"protocolVersion": 2}),
            big,
            request(2, "session/new", {"cwd": "/w", "mcpServers": []}),
        )
    )


@pytest.mark.anyio
async def test_check_config_applies_the_loopback_rule_to_metrics(tmp_path: Path) -> None:
    cfg = tmp_path / "proxy.yaml"
    cfg.write_text("metrics: tcp://0.0.0.0:9464\n")
    check = [sys.executable, "-m", "acp_proxy", "check-config", str(cfg)]
    ran = await run(check)
    assert ran.rc == 2
    assert ran.stderr.decode().startswith(
        f"acp-proxy: {cfg}:1: metrics: 0.0.0.0 is not a loopback address"
    )
    cfg.write_text("metrics: tcp://0.0.0.0:9464\nallow_remote: true\n")
    assert (await run(check)).rc == 2  # the listener's consent does not cover the metrics port
    cfg.write_text("metrics: 0.0.0.0:9464\nmetrics_allow_remote: true\n")
    assert (await run(check)).rc == 0


# -- pure: the accounting, driven by a real pipeline.Connection, no I/O ----------------------------


def test_accounting_from_a_connection_in_observe_mode() -> None:
    from acp_proxy.config import Config
    from acp_proxy.telemetry.metrics import Metrics
    from acp_proxy.wire.chain import Direction
    from acp_proxy.wire.connection.pipeline import Connection
    from acp_proxy.wire.framing import Line

    conn = Connection(Config().build_chain(), observe=True)

    class Session:  # what Metrics reads of a session (runtime.PumpSession in the shell)
        connection = conn

    metrics = Metrics(max_pending=1)
    observer = metrics.session(Session())  # type: ignore[arg-type]
    c2a, a2c = Direction.CLIENT_TO_AGENT, Direction.AGENT_TO_CLIENT
    steps = [
        (c2a, INIT, 0.0),
        (a2c, init_response(0).rstrip(b"\n"), 0.25),
        (c2a, NEW, 1.0),
        (c2a, request(9, "session/new", {}).rstrip(b"\n"), 1.0),  # table full (max 1): untimed
        (a2c, _frame({"id": 1, "error": {"code": -32602, "message": "bad"}}), 4.0),
    ]
    for direction, raw, now in steps:
        observer.on_notes(conn.handle(direction, Line(raw)).notes, now)
    assert metrics.ready
    assert metrics.untracked == {(C2A,): 1}
    assert {k: (h.count, h.total) for k, h in metrics.durations.items()} == {
        (C2A, "initialize", "result"): (1, 0.25),
        (C2A, "session/new", "error"): (1, 3.0),
    }
    assert metrics.errors == {(C2A, "session/new", "-32602"): 1}
    hist = metrics.durations[(C2A, "initialize", "result")]
    assert hist.buckets[5] == 1 and sum(hist.buckets) == 1  # 0.25 is in the le="0.25" bucket


def test_an_observer_bug_is_counted_not_raised() -> None:
    from acp_proxy.telemetry.metrics import Metrics

    metrics = Metrics(max_pending=10)
    observer = metrics.session(object())  # type: ignore[arg-type]
    observer.on_end(None, 0.0)  # reading the "session" fails: counted, not raised
    assert metrics.observer_errors == 1


@pytest.mark.parametrize(
    ("version", "label"),
    [(1, "1"), (2, "2"), (3, "other"), (99999, "other"), ("2", "other"), (True, "other")],
)
def test_protocol_version_label_is_bounded(version: object, label: str) -> None:
    from acp_proxy.telemetry.labels import version_label

    assert version_label(version) == label


def test_a_thousand_versions_make_three_series() -> None:
    from acp_proxy.telemetry.metrics import Metrics
    from acp_proxy.wire.notes import VersionNegotiated

    metrics = Metrics(max_pending=10)
    for version in range(1000):
        observer = metrics.session(object())  # type: ignore[arg-type]
        observer.on_notes((VersionNegotiated(version),), 0.0)
    assert metrics.versions == {("other",): 998, ("1",): 1, ("2",): 1}


def test_hostile_peers_leave_a_bounded_number_of_series() -> None:
    """Thousands of distinct methods, error codes, tool kinds and statuses, stop reasons and
    currencies through a real pipeline: the scrape's series stay a small fixed set."""
    from acp_proxy.config import Config
    from acp_proxy.telemetry.metrics import Metrics
    from acp_proxy.wire.chain import Direction
    from acp_proxy.wire.connection.pipeline import Connection
    from acp_proxy.wire.framing import Line

    conn = Connection(Config().build_chain(), observe=True)

    from types import SimpleNamespace

    side = SimpleNamespace(bytes=0, discarded=0)
    queue = SimpleNamespace(stats=SimpleNamespace(merged=0))

    class Session:  # what Metrics reads of a live session at scrape time
        connection = conn
        to_client = SimpleNamespace(queue=queue, held=lambda: 0)
        to_agent = SimpleNamespace(held=lambda: 0)
        stats = SimpleNamespace(to_client=side, to_agent=side)

    metrics = Metrics(max_pending=100)
    observer = metrics.session(Session())
    c2a, a2c = Direction.CLIENT_TO_AGENT, Direction.AGENT_TO_CLIENT

    def feed(direction: Direction, message: dict[str, Any]) -> None:
        raw = orjson.dumps({"jsonrpc": "2.0", **message})
        observer.on_notes(conn.handle(direction, Line(raw)).notes, 0.0)

    feed(c2a, {"id": 0, "method": "initialize", "params": {"protocolVersion": 2}})
    feed(a2c, {"id": 0, "result": {"protocolVersion": 2}})

    def update(body: dict[str, Any]) -> dict[str, Any]:
        return {"method": "session/update", "params": {"sessionId": "s", "update": body}}

    for i in range(2000):
        feed(c2a, {"id": f"r{i}", "method": f"_x/m{i}", "params": {}})
        feed(a2c, {"id": f"r{i}", "error": {"code": 1000 + i, "message": "no"}})
        feed(c2a, {"id": i, "method": "session/prompt", "params": {"sessionId": "s", "prompt": []}})
        tool = {"sessionUpdate": "tool_call_update", "toolCallId": f"t{i}", "kind": f"k{i}"}
        feed(a2c, update(tool))
        feed(
            a2c,
            update({"sessionUpdate": "tool_call_update", "toolCallId": f"t{i}", "status": f"s{i}"}),
        )
        cost = {"amount": float(i), "currency": f"Q{chr(65 + i % 26)}{chr(65 + i // 26 % 26)}"}
        feed(a2c, update({"sessionUpdate": "usage_update", "used": 1, "size": 2, "cost": cost}))
        feed(a2c, update({"sessionUpdate": "state_update", "state": "idle", "stopReason": f"x{i}"}))
    observer.on_end(None, 1.0)
    assert metrics.observer_errors == 0
    series = {
        (family.name, tuple(sorted(sample.labels.items())))
        for family in metrics.collect()
        for sample in family.samples
    }
    assert len(series) < 400, len(series)
    labels: dict[str, set[str]] = {
        k: set() for k in ("method", "error_code", "kind", "status", "stop_reason", "currency")
    }
    for _, pairs in series:
        for key, val in pairs:
            if key in labels:
                labels[key].add(val)
    assert labels["error_code"] == {"other"}
    assert "other" in labels["method"] and not any(m.startswith("_x/") for m in labels["method"])
    assert labels["kind"] == {"other"}
    assert labels["status"] <= {"other", "unfinished"}
    assert labels["stop_reason"] == {"other"}
    assert len(labels["currency"]) == 17  # the first 16, then other
