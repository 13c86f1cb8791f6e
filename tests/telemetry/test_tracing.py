"""OpenTelemetry traces: the real CLI with a local OTLP/HTTP receiver (decoded with
``opentelemetry-proto``): spans, parent/child links, attributes, the forwarded ``traceparent``
(only that member changed), ``tracing.inject``, and a dead collector that changes nothing."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from proxy_harness import FAKE_AGENT, REPO, Lines, init_response, proxy_env, request, run
from telemetry_harness import Receiver, attrs, running_receiver

pytest.importorskip("opentelemetry.sdk")

from acp_proxy.telemetry.propagation import SpanIds, parse_traceparent

TIMEOUT = 30.0
PROXY = [sys.executable, "-m", "acp_proxy", "--log-format", "json"]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


def _env(endpoint: str) -> dict[str, str]:
    return proxy_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_BSP_SCHEDULE_DELAY="50",
        OTEL_SERVICE_NAME="proxy-under-test",
    )


def _frame(message: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", **message})


PROMPT = (
    b'{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s1",'
    b'"prompt":[],"_meta":{"traceparent":"00-'
    + TRACE.encode()
    + b"-"
    + PARENT.encode()
    + b'-01","tracestate":"vendor=x","baggage":"k=v"}}}'
)
NEW = request(1, "session/new", {"cwd": "/w", "mcpServers": []}).rstrip(b"\n")
SCRIPT: list[tuple[bytes, list[bytes]]] = [
    # A v1 session: its turn ends with the prompt response.
    (
        request(0, "initialize", {"protocolVersion": 1}).rstrip(b"\n"),
        [init_response(0, version=1)[:-1]],
    ),
    (NEW, [_frame({"id": 1, "result": {"sessionId": "s1"}})]),
    (
        PROMPT,
        [
            _frame(
                {
                    "method": "session/update",
                    "params": {
                        "sessionId": "s1",
                        "update": {
                            "sessionUpdate": "tool_call",
                            "toolCallId": "t1",
                            "title": "Read x",
                            "kind": "read",
                            "status": "pending",
                        },
                    },
                }
            ),
            _frame(
                {
                    "id": "a1",
                    "method": "fs/read_text_file",
                    "params": {"sessionId": "s1", "path": "/w/x"},
                }
            ),
        ],
    ),
    (
        _frame({"id": "a1", "result": {"content": "x"}}),
        [
            _frame(
                {
                    "method": "session/update",
                    "params": {
                        "sessionId": "s1",
                        "update": {
                            "sessionUpdate": "tool_call_update",
                            "toolCallId": "t1",
                            "status": "completed",
                        },
                    },
                }
            ),
            _frame({"id": 2, "result": {"stopReason": "end_turn"}}),
        ],
    ),
    (
        request(3, "_vendor/thing", {}).rstrip(b"\n"),
        [_frame({"id": 3, "error": {"code": -32601, "message": "no such method"}})],
    ),
]


async def _session(tmp_path: Path, config: str, env: dict[str, str]) -> tuple[int, list[bytes]]:
    """Drive SCRIPT through the proxy (one step at a time); the lines the agent received."""
    replay = tmp_path / "script.txt"
    lines = []
    for client, answers in SCRIPT:
        lines.append(b"C " + client)
        lines.extend(b"A " + a for a in answers)
    replay.write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "proxy.yaml").write_text(config)
    record = tmp_path / "received.txt"
    cmd = [
        *PROXY,
        "--config",
        str(tmp_path / "proxy.yaml"),
        "--",
        sys.executable,
        str(FAKE_AGENT),
        "--replay",
        str(replay),
        "--record",
        str(record),
    ]
    async with await anyio.open_process(cmd, env=env, cwd=str(REPO)) as proc:
        assert proc.stdin and proc.stdout
        out = Lines(proc.stdout)
        for client, answers in SCRIPT:
            await proc.stdin.send(client + b"\n")
            for want in answers:
                with anyio.fail_after(TIMEOUT):
                    got = await out.line()
                assert _without_injected(got) == _without_injected(want + b"\n")
        await proc.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            rc = await proc.wait()
    return rc, record.read_bytes().splitlines()


def _without_injected(frame: bytes) -> Any:
    """A frame minus a ``traceparent`` that ``tracing.inject`` added (the only ``_meta`` of
    the agent's requests here); other frames as they are."""
    message = orjson.loads(frame)
    meta = message.get("params", {}).get("_meta")
    if meta is not None and list(meta) == ["traceparent"]:
        del message["params"]["_meta"]
    return message


def _by_name(receiver: Receiver) -> dict[str, Any]:
    with receiver.lock:
        spans = [s for _, s in receiver.spans]
    names = [s.name for s in spans]
    assert len(names) == len(set(names)), names
    return {s.name: s for s in spans}


@pytest.mark.anyio
async def test_spans_links_attributes_and_forwarded_traceparent(
    tmp_path: Path, receiver: Receiver
) -> None:
    rc, received = await _session(tmp_path, "tracing: {enabled: true}\n", _env(receiver.endpoint))
    assert rc == 0
    spans = _by_name(receiver)
    assert sorted(spans) == [
        "_vendor/thing",
        "execute_tool",
        "fs/read_text_file",
        "initialize",
        "invoke_agent",
        "session/new",
    ]
    resource = {kv.key: kv.value.string_value for kv in receiver.spans[0][0].attributes}
    assert resource["service.name"] == "proxy-under-test"

    prompt = spans["invoke_agent"]  # the turn: the session/prompt request's span
    # The client's traceparent is the parent of the proxy's span.
    assert prompt.trace_id.hex() == TRACE
    assert prompt.parent_span_id.hex() == PARENT
    assert prompt.trace_state == "vendor=x"
    assert attrs(prompt) == {
        "rpc.system": "jsonrpc",
        "rpc.method": "session/prompt",
        "rpc.jsonrpc.version": "2.0",
        "rpc.jsonrpc.request_id": "2",
        "acp.direction": "client_to_agent",
        "acp.session_id": "s1",
        "acp.protocol_version": 1,
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.conversation.id": "s1",
        "gen_ai.response.finish_reasons": ["end_turn"],
        "acp.stop_reason": "end_turn",
        "acp.turn.tool_calls": 1,
    }
    # The agent got the proxy span's traceparent, and only that member differs.
    forwarded = PROMPT.replace(
        f"00-{TRACE}-{PARENT}-01".encode(), f"00-{TRACE}-{prompt.span_id.hex()}-01".encode()
    )
    assert forwarded != PROMPT
    assert received[2] == forwarded

    # The turn's tool call and the agent's request during it are children of the prompt span.
    tool = spans["execute_tool"]
    assert (tool.trace_id, tool.parent_span_id) == (prompt.trace_id, prompt.span_id)
    assert attrs(tool) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.call.id": "t1",
        "gen_ai.conversation.id": "s1",
        "acp.session_id": "s1",
        "acp.tool_call_id": "t1",
        "acp.tool_call.kind": "read",
        "acp.tool_call.title": "Read x",
        "acp.tool_call.status": "completed",
        "acp.tool_call.final_status": "completed",
    }
    read = spans["fs/read_text_file"]
    assert (read.trace_id, read.parent_span_id) == (prompt.trace_id, prompt.span_id)
    assert attrs(read)["acp.direction"] == "agent_to_client"
    assert attrs(read)["rpc.jsonrpc.request_id"] == "a1"
    assert prompt.start_time_unix_nano <= tool.start_time_unix_nano
    assert tool.end_time_unix_nano <= prompt.end_time_unix_nano

    vendor = spans["_vendor/thing"]
    assert attrs(vendor)["rpc.jsonrpc.error_code"] == -32601
    assert attrs(vendor)["rpc.jsonrpc.error_message"] == "no such method"
    assert vendor.status.code == vendor.status.STATUS_CODE_ERROR
    # Requests without a traceparent start traces of their own and are forwarded untouched.
    assert spans["session/new"].parent_span_id == b""
    assert spans["session/new"].trace_id != prompt.trace_id
    assert received[1] == NEW
    assert "acp.protocol_version" not in attrs(spans["initialize"])  # not negotiated yet


@pytest.mark.anyio
async def test_inject_gives_requests_without_one_a_traceparent(
    tmp_path: Path, receiver: Receiver
) -> None:
    rc, received = await _session(
        tmp_path, "tracing: {enabled: true, inject: true}\n", _env(receiver.endpoint)
    )
    assert rc == 0
    new = _by_name(receiver)["session/new"]
    assert new.parent_span_id == b""
    ids = parse_traceparent(orjson.loads(received[1])["params"]["_meta"]["traceparent"])
    assert ids == SpanIds(int(new.trace_id.hex(), 16), int(new.span_id.hex(), 16), 1)
    # Only _meta was added: the rest of the frame is as sent.
    assert received[1].startswith(NEW[:-2])
    # Before the protocol version is known the chain does not run: initialize is untouched.
    assert b"traceparent" not in received[0]


@pytest.mark.anyio
@pytest.mark.parametrize("collector", ["refused", "silent"])
async def test_a_dead_collector_changes_nothing(tmp_path: Path, collector: str) -> None:
    """Same output and exit code with a collector that refuses or never answers."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if collector == "silent":
        listener.listen(16)  # accepts connections (backlog) and never answers
    else:
        listener.close()  # nothing listens: connection refused
    config = tmp_path / "proxy.yaml"
    config.write_text("tracing: {enabled: true, inject: true}\n")
    stdin = b"".join(
        request(i, "initialize" if i == 0 else "_test/echo", {"n": i}) for i in range(50)
    )
    try:
        plain = await run([*PROXY, "--", sys.executable, str(FAKE_AGENT)], stdin)
        traced = await run(
            [*PROXY, "--config", str(config), "--", sys.executable, str(FAKE_AGENT)],
            stdin,
            env=proxy_env(
                OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                OTEL_BSP_SCHEDULE_DELAY="10",
            ),
            timeout=TIMEOUT,
        )
    finally:
        listener.close()
    assert plain.rc == traced.rc == 0
    assert traced.stdout == plain.stdout
    assert len(plain.stdout.splitlines()) == 50


def test_traceparent_parsing() -> None:
    good = f"00-{TRACE}-{PARENT}-01"
    assert parse_traceparent(good) == SpanIds(int(TRACE, 16), int(PARENT, 16), 1)
    assert parse_traceparent(f"01-{TRACE}-{PARENT}-00-future") is not None
    for bad in [
        f"ff-{TRACE}-{PARENT}-01",
        f"00-{'0' * 32}-{PARENT}-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"00-{TRACE.upper()}-{PARENT}-01",
        f"00-{TRACE}-{PARENT}-01-extra",
        "00-abc",
        None,
        42,
    ]:
        assert parse_traceparent(bad) is None, bad


def test_missing_extra_is_a_clear_error(tmp_path: Path) -> None:
    """Without the SDK installed the proxy says which extra to install (simulated: the import
    fails inside a subprocess)."""
    import subprocess

    config = tmp_path / "proxy.yaml"
    config.write_text("tracing: {enabled: true}\n")
    code = (
        "import sys; sys.modules['opentelemetry.sdk'] = None; "
        "sys.modules['opentelemetry.sdk.trace'] = None; "
        "from acp_proxy.cli import main; "
        f"sys.exit(main(['--config', {str(config)!r}, '--', 'true']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=proxy_env(),
        capture_output=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 2
    # acp-proxy is not on the package index: the command names this installation's source.
    want = f"acp-proxy: tracing needs the OpenTelemetry SDK (the otel extra): {sys.executable} "
    want += f"-m pip install -e '{REPO}[otel]'\n"
    assert done.stderr.decode() == want


@pytest.mark.parametrize(
    ("prefix", "direct_url", "hint"),
    [
        (
            "/v",
            '{"dir_info": {"editable": true}, "url": "file:///src/acp"}',
            "/v/bin/python -m pip install -e '/src/acp[otel]'",
        ),
        (
            "/v",
            '{"dir_info": {}, "url": "file:///src/acp"}',
            "/v/bin/python -m pip install '/src/acp[otel]'",
        ),
        (
            "/h/.local/share/pipx/venvs/acp-proxy",
            '{"dir_info": {}, "url": "file:///src/acp"}',
            "pipx inject acp-proxy opentelemetry-sdk opentelemetry-exporter-otlp-proto-http",
        ),
        (
            "/h/.local/share/uv/tools/acp-proxy",
            '{"dir_info": {}, "url": "file:///src/acp"}',
            "uv tool install --reinstall '/src/acp[otel]'",
        ),
        (
            "/v",
            '{"archive_info": {}, "url": "file:///tmp/acp_proxy-0.2.0-py3-none-any.whl"}',
            "/v/bin/python -m pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http",
        ),
        (
            "/v",
            "",
            "/v/bin/python -m pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http",
        ),
    ],
)
def test_install_hint_fits_the_installation(
    prefix: str, direct_url: str, hint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from acp_proxy.shell.telemetry import tracing

    monkeypatch.setattr(Path, "is_dir", lambda self: str(self) == "/src/acp")
    assert tracing.install_hint(prefix, "/v/bin/python", direct_url) == hint


@pytest.mark.parametrize("meta", ["x", None, [1], 7])
def test_inject_leaves_a_meta_that_is_not_an_object_alone(meta: Any) -> None:
    """``inject`` changes only the ``traceparent`` member of an object ``_meta``: a ``_meta``
    that is not an object (a peer's bug, or a value it means) is forwarded as it is."""
    from acp_proxy.telemetry.propagation import TraceContext
    from acp_proxy.wire.chain import FORWARD, Direction, MessageContext, Replace

    middleware = TraceContext(inject=True)
    ctx = MessageContext(Direction.CLIENT_TO_AGENT, 2)
    message: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "session/new",
        "params": {"_meta": meta},
    }
    assert middleware(message, ctx) is FORWARD
    assert not middleware.decided
    # An object _meta gets its traceparent member, and keeps the others.
    message["params"] = {"cwd": "/", "_meta": {"k": 1}}
    verdict = middleware(message, ctx)
    assert isinstance(verdict, Replace)
    (out,) = verdict.messages
    params: Any = out["params"]
    assert list(params["_meta"]) == ["k", "traceparent"]
    assert params["cwd"] == "/"


@pytest.mark.anyio
async def test_a_traceparent_read_before_the_version_is_known_still_parents_the_span(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A client that pipelines: its requests are read before the initialize response, when the
    chain (and so the rewrite) does not run yet. Their spans still join the client's trace;
    the frames reach the agent byte for byte."""
    config = tmp_path / "proxy.yaml"
    config.write_text("tracing: {enabled: true}\n")
    meta = {"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "vendor=x"}
    frames = [
        request(0, "initialize", {"protocolVersion": 2, "_meta": meta}),
        request(1, "session/new", {"cwd": "/w", "mcpServers": [], "_meta": meta}),
    ]
    record = tmp_path / "received.txt"
    # The agent never answers: the version stays unknown, whatever the timing.
    agent = [sys.executable, str(FAKE_AGENT), "--record", str(record), "--silent-after", "0"]
    ran = await run(
        [*PROXY, "--config", str(config), "--", *agent],
        b"".join(frames),
        env=_env(receiver.endpoint),
        timeout=TIMEOUT,
    )
    assert ran.rc == 0
    assert record.read_bytes() == b"".join(frames)  # nothing rewritten before the version
    with anyio.fail_after(TIMEOUT):
        while len(receiver.spans) < 2:
            await anyio.sleep(0.02)
    spans = _by_name(receiver)
    for name in ("initialize", "session/new"):
        span = spans[name]
        assert (span.trace_id.hex(), span.parent_span_id.hex()) == (TRACE, PARENT), name
        assert span.trace_state == "vendor=x"


def test_a_detach_and_a_reattach_are_spans(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``detach_grace``: the process observer makes a span of each detach event, with the
    frames a reattach replayed."""
    from acp_proxy.config import TracingConfig
    from acp_proxy.shell.session import hooks
    from acp_proxy.shell.telemetry.tracing import Tracing

    env = _env(receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)  # the exporter reads it
    tracing = Tracing(TracingConfig(enabled=True), env)
    hooks.install(tracing)
    try:
        hooks.detach_event("detach", 0)
        hooks.detach_event("reattach", 5)
    finally:
        hooks.uninstall(tracing)
        tracing.flush()
    spans = _by_name(receiver)
    assert sorted(spans) == ["acp-proxy detach", "acp-proxy reattach"]
    attributes = {a.key: a.value for a in spans["acp-proxy reattach"].attributes}
    assert attributes["acp_proxy.detach.event"].string_value == "reattach"
    assert attributes["acp_proxy.detach.replayed"].int_value == 5
