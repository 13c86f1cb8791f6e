"""``acp-proxy component``: the proxy as a component of a conductor's proxy chain.

Real processes and pipes. Most tests play the conductor themselves (they write the conductor's
lines to the component's stdin and read its stdout), so every byte the component writes is
checked; the chain tests run tests/conductors/spec_conductor.py, a conductor written from the
spec text, in both of the dialects it speaks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import jsonschema
import orjson
import pytest
from proxy_harness import FAKE_AGENT, REPO, TIMEOUT, Lines, proxy_env, run

pytestmark = pytest.mark.anyio

CONDUCTORS = Path(__file__).resolve().parent / "conductors"
SPEC_CONDUCTOR = CONDUCTORS / "spec_conductor.py"
ANNOTATE = REPO / "bench" / "rules-annotate.yaml"
EXACT = CONDUCTORS / "annotate-exact.yaml"
COMPONENT = [sys.executable, "-m", "acp_proxy", "component"]

INIT_PARAMS = b'{"protocolVersion":2,"clientCapabilities":{"fs":{"readTextFile":true}}}'
TW_PARAMS = b'{"protocolVersion":2,"_meta":{"proxy":true}}'
INIT_RESULT = b'{"protocolVersion":2,"agentCapabilities":{},"authMethods":[]}'
INIT_LINE = {
    "official": b'{"jsonrpc":"2.0","id":0,"method":"proxy/initialize","params":'
    + INIT_PARAMS
    + b"}",
    "sacp": b'{"jsonrpc":"2.0","id":0,"method":"_proxy/initialize","params":' + INIT_PARAMS + b"}",
    "thinkwell": b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":' + TW_PARAMS + b"}",
}
ENVELOPE = {
    "official": (b"proxy/successor", b"proxy/successor"),
    "sacp": (b"_proxy/successor", b"_proxy/successor"),
    "thinkwell": (b"_proxy/successor/request", b"_proxy/successor/notification"),
}


class Component:
    """A running ``acp-proxy component`` driven by the test as its conductor."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self.out = Lines(process.stdout)

    async def send(self, *lines: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(b"".join(line + b"\n" for line in lines))

    async def line(self) -> bytes:
        with anyio.fail_after(TIMEOUT):
            return (await self.out.line()).rstrip(b"\n")

    async def close(self) -> tuple[int, bytes]:
        """Close its stdin (the conductor goes away): its exit code and its stderr."""
        assert self.process.stdin is not None and self.process.stderr is not None
        await self.process.stdin.aclose()
        with anyio.fail_after(TIMEOUT):
            rest = await self.out.rest()
            rc = await self.process.wait()
            err = b""
            async for chunk in self.process.stderr:
                err += chunk
        # Requests still in flight when the conductor left get -32603 errors (written into a
        # closing connection: harmless, and the same rule as standalone); nothing else.
        for line in rest.splitlines():
            assert orjson.loads(line)["error"]["code"] == -32603, rest
        return rc, err


async def start(*args: str) -> Component:
    process = await anyio.open_process(
        [*COMPONENT, "--log-format", "json", *args], env=proxy_env(), cwd=str(REPO)
    )
    return Component(process)


def wrapped(dialect: str, ident: bytes | None, method: bytes, params: bytes) -> bytes:
    """An envelope exactly as the component builds it (members in JSON-RPC order)."""
    request, notification = ENVELOPE[dialect]
    head = b'{"jsonrpc":"2.0"' + (b',"id":' + ident if ident is not None else b"")
    name = request if ident is not None else notification
    return (
        head
        + b',"method":"'
        + name
        + b'","params":{"method":"'
        + method
        + b'","params":'
        + params
        + b"}}"
    )


async def handshake(comp: Component, dialect: str) -> None:
    await comp.send(INIT_LINE[dialect])
    params = TW_PARAMS if dialect == "thinkwell" else INIT_PARAMS
    assert await comp.line() == wrapped(dialect, b"0", b"initialize", params)
    await comp.send(b'{"jsonrpc":"2.0","id":0,"result":' + INIT_RESULT + b"}")
    answer = await comp.line()
    if dialect == "thinkwell":  # the TypeScript conductor refuses an answer without it
        assert answer == (
            b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2,"agentCapabilities":{},'
            b'"authMethods":[],"_meta":{"proxy":true}}}'
        )
    else:
        assert answer == b'{"jsonrpc":"2.0","id":0,"result":' + INIT_RESULT + b"}"


@pytest.mark.parametrize("dialect", ["official", "sacp", "thinkwell"])
async def test_each_dialect_handshake_and_envelope_round_trip(dialect: str) -> None:
    comp = await start("--config", str(ANNOTATE))
    await handshake(comp, dialect)
    # client -> agent: a request goes on wrapped, its params byte for byte (odd spacing, an
    # escape, a number beyond a double), with the same id
    prompt_params = (
        b'{ "sessionId" : "s1", "prompt":[{"type":"text","text":"\\u00e9 1e400"}], "n":1e400}'
    )
    await comp.send(
        b'{"jsonrpc":"2.0","id":"p-1","method":"session/prompt","params":' + prompt_params + b"}"
    )
    assert await comp.line() == wrapped(dialect, b'"p-1"', b"session/prompt", prompt_params)
    # agent -> client: a wrapped notification comes out plain; the rule adds its key and
    # nothing else changes
    update = (
        b'{"sessionId":"s1","update":{"sessionUpdate":"tool_call_update","toolCallId":"c1",'
        b'"rawOutput":{"v":  12345678901234567890123}}}'
    )
    await comp.send(wrapped(dialect, None, b"session/update", update))
    assert await comp.line() == (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":'
        b'{"sessionUpdate":"tool_call_update","toolCallId":"c1",'
        b'"rawOutput":{"v":  12345678901234567890123},"_meta":{"example.dev/route":"edge"}}}}'
    )
    # a wrapped request from the agent goes to the client plain, and the client's answer
    # answers the envelope's id, unchanged
    ask = b'{"sessionId":"s1","toolCall":{"toolCallId":"c1"},"options":[]}'
    await comp.send(wrapped(dialect, b"41", b"session/request_permission", ask))
    assert (
        await comp.line()
        == b'{"jsonrpc":"2.0","id":41,"method":"session/request_permission","params":' + ask + b"}"
    )
    answer = b'{"jsonrpc":"2.0","id":41,"result":{"outcome":{"outcome":"cancelled"}}}'
    await comp.send(answer)
    assert await comp.line() == answer
    # the successor's answer to the prompt reaches the client as the answer to its request
    done = b'{"jsonrpc":"2.0","id":"p-1","result":{"stopReason":"end_turn"}}'
    await comp.send(done)
    assert await comp.line() == done
    rc, err = await comp.close()
    assert rc == 0
    assert any(
        e.get("dialect") == (dialect if dialect != "thinkwell" else "thinkwell")
        for e in _events(err, "conductor dialect detected")
    )


def _events(stderr: bytes, name: str) -> list[dict[str, object]]:
    out = []
    for line in stderr.splitlines():
        if line.startswith(b"{"):
            event = orjson.loads(line)
            if event.get("event") == name:
                out.append(event)
    return out


async def test_requests_the_conductor_answers_itself_are_errors_to_the_client() -> None:
    comp = await start()
    await handshake(comp, "official")
    await comp.send(
        b'{"jsonrpc":"2.0","id":7,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}'
    )
    await comp.line()
    gone = b'{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"successor exited"}}'
    await comp.send(gone)
    assert await comp.line() == gone  # not a result, and not rewritten
    rc, _ = await comp.close()
    assert rc == 0


async def test_cancellation_is_hop_by_hop_on_the_conductor_connection() -> None:
    comp = await start()
    await handshake(comp, "official")
    await comp.send(
        b'{"jsonrpc":"2.0","id":5,"method":"session/prompt","params":{"sessionId":"s"}}'
    )
    await comp.line()
    cancel5 = b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":5}}'
    await comp.send(cancel5)
    assert await comp.line() == cancel5  # names envelope 5 on this hop: plain, never wrapped
    await comp.send(wrapped("official", b"9", b"fs/read_text_file", b'{"path":"/a"}'))
    await comp.line()
    cancel9 = b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":9}}'
    await comp.send(cancel9)  # the successor gave up on its request 9
    assert await comp.line() == cancel9  # to the client, naming our plain request 9
    rc, _ = await comp.close()
    assert rc == 0


async def test_unknown_first_message_gets_a_clear_error_and_a_log_line() -> None:
    comp = await start()
    await comp.send(
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
    )
    error = orjson.loads(await comp.line())
    assert error["id"] == 1 and error["error"]["code"] == -32600
    message = error["error"]["message"]
    for expected in ("proxy/initialize", "_proxy/initialize", "_meta.proxy"):
        assert expected in message
    rc, err = await comp.close()
    assert rc == 0
    assert b"expected proxy/initialize" in err and b"initialize" in err


async def test_batches_inside_the_chain_are_refused_with_errors() -> None:
    comp = await start()
    await handshake(comp, "official")
    await comp.send(b'[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"}]')
    assert orjson.loads(await comp.line()) == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {
            "code": -32600,
            "message": "JSON-RPC batches are not supported inside a proxy chain",
        },
    }
    await comp.send(
        b'{"jsonrpc":"2.0","id":3,"method":"proxy/successor","params":[{"method":"a"}]}'
    )
    refused = orjson.loads(await comp.line())
    assert refused["id"] == 3 and refused["error"]["code"] == -32600
    rc, err = await comp.close()
    assert rc == 0 and b"batches are not supported" in err


async def test_conductor_that_closes_ends_the_component_cleanly() -> None:
    comp = await start()
    await handshake(comp, "sacp")
    # a request in flight to the successor when the conductor goes away
    await comp.send(b'{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{}}')
    await comp.line()
    assert comp.process.stdin is not None
    await comp.process.stdin.aclose()
    with anyio.fail_after(5):  # the TypeScript conductor sends SIGTERM after 250 ms
        rc = await comp.process.wait()
    assert rc == 0
    # it spawned nothing: no child of it is left
    assert not _children(comp.process.pid)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


# -- through a conductor written from the spec text ------------------------------------------


def _chain(
    dialect: str, components: int, agent: list[str], *extra: str, config: Path = ANNOTATE
) -> list[str]:
    comp = [*COMPONENT, "--config", str(config), "--log-format", "json", *extra]
    return [
        sys.executable,
        str(SPEC_CONDUCTOR),
        "--dialect",
        dialect,
        *[json.dumps(comp)] * components,
        json.dumps(agent),
    ]


async def test_successor_that_exits_answers_in_flight_requests_with_errors() -> None:
    dialect = "official"
    agent = [
        sys.executable,
        str(FAKE_AGENT),
        "--protocol",
        "1",
        "--crash-after",
        "2",
        "--exit-code",
        "3",
    ]
    init = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}\n'
    new = b'{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}\n'
    process = await anyio.open_process(_chain(dialect, 1, agent), env=proxy_env(), cwd=str(REPO))
    assert process.stdin is not None and process.stdout is not None
    out = Lines(process.stdout)
    with anyio.fail_after(TIMEOUT):
        await process.stdin.send(init)
        first = orjson.loads(await out.line())
        assert first["id"] == 0 and first["result"]["protocolVersion"] == 1
        await process.stdin.send(new)  # the agent dies reading it, leaving it unanswered
        assert orjson.loads(await out.line()) == {
            "jsonrpc": "2.0",
            "id": 1,
            "error": {"code": -32603, "message": "successor exited"},
        }
        await process.stdin.aclose()
        assert await out.rest() == b""
        assert await process.wait() == 0


_STANDALONE: dict[Path, object] = {}


def _demo_session(argv: list[str]) -> object:
    from acp_proxy import demo
    from acp_proxy.demo.session import run_session

    env = demo._child_env()
    return run_session(argv, env, TIMEOUT)


def client_state(record: object) -> object:
    """What the client model stores after every frame the scripted client received."""
    from acp_proxy.demo.session import SessionRecord
    from acp_proxy.meta.state import ClientModel

    assert isinstance(record, SessionRecord)
    model = ClientModel(record.negotiated_version)
    for frame in record.received:
        if isinstance(frame.message, dict):
            model.apply(frame.message)
    return model.snapshot()


@pytest.mark.parametrize(
    ("dialect", "components", "config"),
    [("official", 1, EXACT), ("sacp", 2, EXACT), ("official", 2, ANNOTATE)],
)
async def test_chain_gives_the_client_what_standalone_gives_it(
    dialect: str, components: int, config: Path
) -> None:
    """The scripted v2 client through the spec conductor and N components reaches the same
    client state as through acp-proxy standalone, and (coalescing off, whose merges depend on
    timing) the same frames byte for byte."""
    from acp_proxy.demo.session import SessionRecord
    from acp_proxy.demo.stored import final_meta

    agent = [sys.executable, "-m", "acp_proxy.demo.agent", "--pace-ms", "2"]
    standalone = [*COMPONENT[:3], "--config", str(config), "--", *agent]
    if config not in _STANDALONE:  # the same for every chain with this config: run once
        _STANDALONE[config] = await anyio.to_thread.run_sync(_demo_session, standalone)
    alone = _STANDALONE[config]
    chain = _chain(dialect, components, agent, config=config)
    chained = await anyio.to_thread.run_sync(_demo_session, chain)
    assert isinstance(alone, SessionRecord) and isinstance(chained, SessionRecord)
    assert client_state(chained) == client_state(alone)
    assert final_meta(chained) == final_meta(alone)
    routed = [m for m in final_meta(chained).values() if isinstance(m, dict)]
    assert any("example.dev/route" in m for m in routed)
    if config == EXACT:
        # The conductor re-encodes what it routes; its encoding of compact UTF-8 JSON is the
        # same. A second component repeats the follow-up the first one sent after a
        # ``_meta: null`` clear (it sees a clear too): the same frame twice in a row.
        got = [f.raw for f in chained.received]
        got = [raw for i, raw in enumerate(got) if components == 1 or i == 0 or got[i - 1] != raw]
        assert got == [f.raw for f in alone.received]


async def test_component_wire_is_byte_exact_inside_the_chain(tmp_path: Path) -> None:
    """What the component writes on its conductor connection, byte for byte (the spec
    conductor's trace of the raw lines): each envelope it builds carries the exact params bytes
    of the plain request it was sent, and each envelope it was sent leaves as its inner message
    with the exact params bytes, but for the rule's key (and the follow-up the rule sends after
    a ``_meta: null`` clear)."""
    trace = tmp_path / "trace"
    agent = [sys.executable, "-m", "acp_proxy.demo.agent", "--pace-ms", "2"]
    argv = _chain("official", 1, agent, config=EXACT)
    argv[2:2] = ["--trace", str(trace)]
    await anyio.to_thread.run_sync(_demo_session, argv)
    rows = [line.split(b" ", 2) for line in trace.read_bytes().splitlines()]
    to_comp = [raw for conn, way, raw in rows if conn == b"component0" and way == b"to"]
    from_comp = [raw for conn, way, raw in rows if conn == b"component0" and way == b"from"]
    envelope = (
        b'{"jsonrpc":"2.0","method":"proxy/successor","params":{"method":"session/update","params":'
    )
    # the conductor writes compact JSON, members in order: the inner params are a byte slice
    inner = [
        b'{"jsonrpc":"2.0","method":"session/update","params":' + raw[len(envelope) : -2] + b"}"
        for raw in to_comp
        if raw.startswith(envelope)
    ]
    plain_out = [raw for raw in from_comp if b'"method":"session/update"' in raw]
    assert len(inner) >= 10
    j = 0
    rule_key = b'"example.dev/route":"edge"'
    for raw in plain_out:
        expected = inner[j] if j < len(inner) else b""
        stripped = raw.replace(b',"_meta":{' + rule_key + b"}", b"").replace(b"," + rule_key, b"")
        if raw == expected or (stripped == expected and rule_key in raw):
            j += 1
            continue
        # otherwise the rule's own follow-up: only the entity's id and the rule's key
        update = orjson.loads(raw)["params"]["update"]
        assert update["_meta"] == {"example.dev/route": "edge"} and len(update) == 3, raw
    assert j == len(inner)
    # the client's requests go on wrapped, with the conductor's exact params bytes
    requests = [
        raw for raw in to_comp if b'"method":"session/' in raw and not raw.startswith(envelope)
    ]
    wrapped_out = [raw for raw in from_comp if b'"method":"proxy/successor"' in raw]
    assert len(requests) == 2 and len(wrapped_out) == 3  # initialize, session/new, session/prompt
    for plain, out in zip(requests, wrapped_out[1:], strict=True):
        msg = orjson.loads(plain)
        head = b'{"jsonrpc":"2.0","id":%d,"method":' % msg["id"]
        assert plain.startswith(head)
        method, _, params = plain[len(head) :].partition(b',"params":')
        assert (
            out
            == head
            + b'"proxy/successor","params":{"method":'
            + method
            + b',"params":'
            + params
            + b"}"
        )


async def test_record_marks_the_conductor_and_hop_metadata(tmp_path: Path) -> None:
    record = tmp_path / "rec.jsonl"
    comp = await start("--record", str(record))
    await handshake(comp, "official")
    hop = b'{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    await comp.send(
        b'{"jsonrpc":"2.0","method":"proxy/successor","params":{"method":"session/update",'
        b'"params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[]}},"_meta":'
        + hop
        + b"}}"
    )
    assert await comp.line() == (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[]}}}'
    )
    rc, _ = await comp.close()
    assert rc == 0
    entries = [orjson.loads(line) for line in record.read_bytes().splitlines()]
    schema = json.loads((REPO / "config" / "record.schema.json").read_text(encoding="utf-8"))
    for entry in entries:  # the record format's schema knows the component's events
        jsonschema.validate(entry, schema)
    assert entries[0]["connect"] == "conductor"
    events = [e for e in entries if "event" in e]
    conductor = next(e for e in events if e["event"] == "conductor")
    assert conductor["dialect"] == "official" and conductor["envelope"] == "proxy/successor"
    hops = [e for e in events if e["event"] == "hop"]
    assert hops == [
        {
            "t": hops[0]["t"],
            "event": "hop",
            "direction": "agent_to_client",
            "envelope": "proxy/successor",
            "hop_meta": orjson.loads(hop),
        }
    ]
    frames = [e for e in entries if "dir" in e and "raw" in e]
    # the record holds the inner messages (what rules saw), in both directions
    assert [orjson.loads(f["raw"]).get("method") for f in frames] == [
        "initialize",
        None,
        "session/update",
    ]
    shown = await run([sys.executable, "-m", "acp_proxy", "show", str(record)])
    assert shown.rc == 0, shown.stderr


async def test_a_conductor_that_reads_slowly_gets_every_line_whole() -> None:
    """Backpressure toward the conductor: non-blocking writes that the pipe takes only in part
    leave the rest to the writer, and later lines wait behind it; every line arrives whole and
    in order (coalescing off, so each update is its own frame)."""
    comp = await start("--config", str(EXACT))
    await handshake(comp, "official")
    count, pad = 2000, "x" * 800
    lines = []
    for i in range(count):
        update = {"sessionUpdate": "plan", "entries": [], "n": i, "pad": pad}
        params = orjson.dumps({"sessionId": "s", "update": update})
        lines.append(params)
    data = [wrapped("official", None, b"session/update", p) for p in lines]

    async with anyio.create_task_group() as tg:
        tg.start_soon(comp.send, *data)
        await anyio.sleep(0.3)  # the component fills the pipe toward us meanwhile
        for params in lines:
            assert (
                await comp.line()
                == b'{"jsonrpc":"2.0","method":"session/update","params":' + params + b"}"
            )
    rc, _ = await comp.close()
    assert rc == 0


async def test_metrics_count_the_inner_messages() -> None:
    """--metrics in a component: the frames, rewrites and negotiated version of the inner
    messages, in each direction as standalone."""
    from telemetry_harness import LogReader, scrape, value

    args = ["--log-format", "json", "--config", str(ANNOTATE), "--metrics", "tcp://127.0.0.1:0"]
    process = await anyio.open_process([*COMPONENT, *args], env=proxy_env(), cwd=str(REPO))
    comp = Component(process)
    assert process.stderr is not None
    log = LogReader(process.stderr)
    address = (await log.event("serving metrics"))["address"]
    await handshake(comp, "official")
    update = b'{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c"}}'
    await comp.send(wrapped("official", None, b"session/update", update))
    await comp.line()
    samples = await scrape(address)
    assert value(samples, "acp_proxy_frames_total", direction="client_to_agent") == 1
    assert value(samples, "acp_proxy_frames_total", direction="agent_to_client") == 2
    assert value(samples, "acp_proxy_rewritten_total", rule="rules:edge-route") == 1
    assert process.stdin is not None
    await process.stdin.aclose()
    with anyio.fail_after(TIMEOUT):
        assert await process.wait() == 0


async def test_chunks_reach_a_parked_reader_through_its_consumer_in_order() -> None:
    """The side streams' consumer path (the round trip without a task switch): a chunk goes to
    the consumer only while the reader is parked with nothing queued; a woken reader gets
    ``None``; a declined chunk, and every chunk after it until the reader parks again, is
    queued in order; a consumer's exception is raised by the receive."""
    from proxy_harness import memory_pipe_pair

    from acp_proxy.shell.component import ConductorMux
    from acp_proxy.shell.logsetup import get_logger
    from acp_proxy.shell.transports import HANDLED, HANDLED_WAKE, NOT_HANDLED
    from acp_proxy.wire.component import Link

    ours, _theirs = memory_pipe_pair()
    mux = ConductorMux(ours, Link(), log=get_logger(), max_frame_bytes=1 << 20)
    side = mux.client
    seen: list[bytes] = []
    answers = iter([HANDLED, HANDLED_WAKE, NOT_HANDLED])

    def consume(chunk: bytes) -> int:
        seen.append(chunk)
        answer = next(answers, None)
        if answer is None:
            raise ValueError("boom")
        return answer

    side.set_consumer(consume)
    got: list[bytes | None] = []

    async def read() -> None:
        got.append(await side.receive_or_handled())

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            await side.deliver(b"1\n")  # handled: the reader stays parked
            await anyio.wait_all_tasks_blocked()
            assert got == [] and side.parked
            await side.deliver(b"2\n")  # handled, and the reader wakes with None
        assert got == [None] and seen == [b"1\n", b"2\n"]
        await side.deliver(b"3\n")  # not parked: queued, the consumer not asked
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
        assert got == [None, b"3\n"] and seen == [b"1\n", b"2\n"]
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            await side.deliver(b"4\n")  # declined: the reader takes it
            await side.deliver(b"5\n")  # the reader is not parked again yet: queued after it
        assert got == [None, b"3\n", b"4\n"]
        assert await side.receive() == b"5\n"
        with pytest.raises(ExceptionGroup) as caught:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await anyio.wait_all_tasks_blocked()
                await side.deliver(b"6\n")
        assert [str(e) for e in caught.value.exceptions] == ["boom"]
    # The mux never ran (it closes its sides' queues when its reading ends): close them here.
    for each in (mux.client, mux.agent):
        each.incoming.close()
        await each.aclose()


async def test_traces_cover_the_inner_requests(tmp_path: Path) -> None:
    """Tracing in a component: the inner requests get their spans (the client's traceparent
    their parent), as standalone; the envelope the request travels on carries the proxy's
    traceparent inside the inner params, where the standalone proxy puts it."""
    pytest.importorskip("opentelemetry.sdk")
    from telemetry_harness import running_receiver

    trace, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    config = tmp_path / "traced.yaml"
    config.write_text("tracing: {enabled: true}\n", encoding="utf-8")
    with running_receiver() as receiver:
        env = proxy_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="50")
        process = await anyio.open_process(
            [*COMPONENT, "--config", str(config)], env=env, cwd=str(REPO)
        )
        comp = Component(process)
        await handshake(comp, "official")
        meta = b'{"traceparent":"00-' + trace.encode() + b"-" + parent.encode() + b'-01"}'
        await comp.send(
            b'{"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd":"/","mcpServers":[],'
            b'"_meta":' + meta + b"}}"
        )
        envelope = orjson.loads(await comp.line())
        assert envelope["method"] == "proxy/successor"
        forwarded = envelope["params"]["params"]["_meta"]["traceparent"]
        assert forwarded.startswith(f"00-{trace}-") and parent not in forwarded
        await comp.send(b'{"jsonrpc":"2.0","id":3,"result":{"sessionId":"s"}}')
        await comp.line()
        rc, _ = await comp.close()
        assert rc == 0
        with receiver.lock:
            spans = {s.name: s for _, s in receiver.spans}
    new = spans["session/new"]
    assert (new.trace_id.hex(), new.parent_span_id.hex()) == (trace, parent)
    assert forwarded == f"00-{trace}-{new.span_id.hex()}-01"


async def test_cancellation_crosses_the_chain_hop_by_hop(tmp_path: Path) -> None:
    """Through the spec conductor: the client cancels its request; each hop cancels the request
    it sent with its own connection's id, so the agent hears of the one it was sent."""
    got = tmp_path / "agent-got.txt"
    agent = [sys.executable, str(FAKE_AGENT), "--protocol", "1", "--silent-after", "1"]
    agent += ["--record", str(got)]
    process = await anyio.open_process(_chain("official", 1, agent), env=proxy_env(), cwd=str(REPO))
    assert process.stdin is not None and process.stdout is not None
    out = Lines(process.stdout)
    with anyio.fail_after(TIMEOUT):
        await process.stdin.send(
            b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}\n'
        )
        await out.line()
        await process.stdin.send(
            b'{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{}}\n'
        )
        await process.stdin.send(
            b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":1}}\n'
        )
        while b"$/cancel_request" not in (got.read_bytes() if got.exists() else b""):
            await anyio.sleep(0.02)  # (the agent writes what it read to the file)
        await process.stdin.aclose()
        await out.rest()
        assert await process.wait() == 0
    received = [orjson.loads(line) for line in got.read_bytes().splitlines()]
    prompt = next(m for m in received if m.get("method") == "session/prompt")
    cancel = next(m for m in received if m.get("method") == "$/cancel_request")
    # the agent's connection numbers requests itself (--id-base): the cancel names its own id
    assert cancel["params"] == {"requestId": prompt["id"]} and prompt["id"] != 1
