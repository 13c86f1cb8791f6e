"""``detach_grace``: an agent outlives its client's connection, and a new connection reattaches.

Real processes: ``acp-proxy --listen`` with ``tests/detach_agent.py``; the clients are
``acp-proxy --connect`` processes (an editor's stdio side) killed with SIGKILL mid-turn, or raw
loopback sockets where the client process is not the point. The agent's turn waits for a file
the test creates, so "while the client is away" is an ordering, never a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson
import pytest
from acp_schema import validate_v1, validate_v1_message
from listen_harness import PROXY, alive, gone, listening
from proxy_harness import REPO, TESTS, Lines, proxy_env, request, wait_until, write_config
from telemetry_harness import scrape, value

from acp_proxy.shell.streams.transports import NonBlockingSend

AGENT = [sys.executable, str(TESTS / "detach_agent.py")]
TIMEOUT = 30.0
NEW = {"cwd": "/", "mcpServers": []}
LOAD = {"sessionId": "sess-1", "cwd": "/", "mcpServers": []}


def prompt(rid: int, **spec: object) -> bytes:
    text = orjson.dumps(spec).decode()
    return request(
        rid, "session/prompt", {"sessionId": "sess-1", "prompt": [{"type": "text", "text": text}]}
    )


def chunk(text: str) -> bytes:
    note = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "sess-1",
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text},
            },
        },
    }
    return orjson.dumps(note) + b"\n"


def answer(rid: object, result: object) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result}) + b"\n"


# Chunks are compared one by one: merging them toward a slow reader (coalescing) is off.
PLAIN = "coalesce: {enabled: false}\n"


def config_file(tmp_path: Path, text: str = "") -> str:
    return write_config(tmp_path / "c.yaml", PLAIN + text)


INIT = {"protocolVersion": 1, "clientCapabilities": {}}
INIT_ANSWER = {"protocolVersion": 1, "agentCapabilities": {"loadSession": False}}


class Client:
    """An ``acp-proxy --connect ADDRESS`` process: the editor's side, on its stdin/stdout."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self.stdin = process.stdin
        self.lines = Lines(process.stdout)

    async def send(self, frame: bytes) -> None:
        await self.stdin.send(frame)

    async def line(self) -> bytes:
        return await self.lines.line()


async def open_client(address: str, config: str) -> Client:
    process = await anyio.open_process(
        [*PROXY, "--config", config, "--connect", address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=proxy_env(),
        cwd=str(REPO),
    )
    return Client(process)


async def start_turn(client: Client, **spec: object) -> int:
    """initialize, session/new, the agent's pid, then the prompt (id 3) and its ``before``
    chunks; returns the agent's pid."""
    await client.send(request(0, "initialize", INIT))
    assert await client.line() == answer(0, INIT_ANSWER)
    await client.send(request(1, "session/new", NEW))
    assert await client.line() == answer(1, {"sessionId": "sess-1"})
    await client.send(request(2, "_test/pid"))
    pid = int(orjson.loads(await client.line())["result"]["pid"])
    await client.send(prompt(3, **spec))
    for i in range(int(spec.get("before", 0))):  # type: ignore[call-overload]
        assert await client.line() == chunk(f"before-{i}")
    return pid


async def kill(client: Client) -> None:
    client.process.send_signal(signal.SIGKILL)
    await client.process.wait()
    await client.process.aclose()


async def reattach(client: Client, method: str = "session/load") -> None:
    """A new editor's opening: initialize (answered by the proxy), then the load (id 1)."""
    await client.send(request(0, "initialize", INIT))
    assert await client.line() == answer(0, INIT_ANSWER)
    await client.send(request(1, method, LOAD))


async def wait_file(path: Path) -> None:
    while not path.exists():
        await anyio.sleep(0.01)


def record_events(path: Path) -> list[dict[str, Any]]:
    return [e for e in map(orjson.loads, path.read_bytes().splitlines()) if "event" in e]


@pytest.mark.anyio
async def test_killed_client_reattaches_through_connect_and_gets_every_frame_once(
    tmp_path: Path,
) -> None:
    go, done, record = tmp_path / "go", tmp_path / "done", tmp_path / "conn-{conn}.jsonl"
    spec = {"before": 3, "after": 5, "go": str(go), "done": str(done)}
    config = config_file(tmp_path)
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config",
            config,
            "--listen",
            "tcp://127.0.0.1:0",
            "--detach-grace",
            "60",
            "--record",
            str(record),
            "--metrics",
            "tcp://127.0.0.1:0",
            agent=AGENT,
        ) as proxy:
            address = await proxy.address()
            metrics = str((await proxy.event("serving metrics"))["address"])
            assert (await proxy.event("listening"))["detach_grace_s"] == 60
            first = await open_client(address, config)
            pid = await start_turn(first, **spec)
            await kill(first)  # mid-turn: the prompt is in flight
            await proxy.event("client detached; keeping the agent")
            go.touch()
            await wait_file(done)  # the rest of the turn was sent while nobody was attached
            assert alive(pid)
            second = await open_client(address, config)
            await reattach(second)
            got = [await second.line() for _ in range(6)]
            # Every frame after the drop, in order, once; then the prompt's answer, with the id
            # of the request that reattached.
            assert got == [
                *(chunk(f"after-{i}") for i in range(5)),
                answer(1, {"stopReason": "end_turn"}),
            ]
            for line in got[:-1]:
                validate_v1_message(orjson.loads(line))
            validate_v1("LoadSessionResponse", orjson.loads(got[-1])["result"])
            validate_v1("PromptResponse", orjson.loads(got[-1])["result"])
            # Live again: the same agent answers.
            await second.send(request(7, "_test/pid"))
            assert await second.line() == answer(7, {"pid": pid})
            event = await proxy.event("client reattached")
            assert (event["replayed"], event["redelivered"], event["answered"]) == (5, 0, False)
            await second.stdin.aclose()
            await wait_until(
                lambda: proxy.count("client detached; keeping the agent") == 2,
                "the second client detached",
                settle=0,
            )
            samples = await scrape(metrics)
            assert value(samples, "acp_proxy_detach_events_total", event="detach") == 2
            assert value(samples, "acp_proxy_detach_events_total", event="reattach") == 1
            assert value(samples, "acp_proxy_replayed_frames_total") == 5
            proxy.terminate()
            assert await proxy.wait() == 0
            await second.process.aclose()
    assert not alive(pid)
    events = [e for e in record_events(tmp_path / "conn-1.jsonl") if e["event"] != "version"]
    assert [e["event"] for e in events] == ["detach", "reattach", "detach", "end"]
    assert (events[1]["session"], events[1]["replayed"], events[1]["redelivered"]) == (
        "sess-1",
        5,
        0,
    )


@pytest.mark.anyio
async def test_reattach_after_the_buffer_bound_is_refused_with_an_error(tmp_path: Path) -> None:
    go, done = tmp_path / "go", tmp_path / "done"
    config = config_file(tmp_path, "detach_grace: 60\ndetach_buffer_frames: 4\n")
    spec = {"before": 1, "after": 6, "go": str(go), "done": str(done)}
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "tcp://127.0.0.1:0", agent=AGENT
        ) as proxy:
            address = await proxy.address()
            first = await open_client(address, config)
            pid = await start_turn(first, **spec)
            await kill(first)
            await proxy.event("client detached; keeping the agent")
            go.touch()
            await wait_file(done)
            second = await open_client(address, config)
            await reattach(second)
            refusal = orjson.loads(await second.line())
            assert refusal["id"] == 1
            assert refusal["error"]["code"] == -32000
            assert refusal["error"]["data"] == {
                "reason": "detach_buffer_overflow",
                "sessionId": "sess-1",
                "lost": 6,
            }
            assert "detach_buffer_frames 4" in refusal["error"]["message"]
            await proxy.event("reattach refused: the detach buffer overflowed")
            proxy.terminate()
            assert await proxy.wait() == 0
            await second.process.aclose()
    assert not alive(pid)


@pytest.mark.anyio
async def test_grace_time_over_answers_the_permission_cancelled_and_stops_the_agent(
    tmp_path: Path,
) -> None:
    go, done, record = tmp_path / "go", tmp_path / "done", tmp_path / "conn-{conn}.jsonl"
    spec = {"before": 1, "after": 0, "go": str(go), "done": str(done), "ask": True}
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config",
            config_file(tmp_path),
            "--listen",
            "tcp://127.0.0.1:0",
            "--detach-grace",
            "0.3",
            "--record",
            str(record),
            agent=AGENT,
        ) as proxy:
            stream = await proxy.connect()
            lines = Lines(stream)
            await stream.send(request(0, "initialize", INIT) + request(1, "session/new", NEW))
            await lines.line()
            await lines.line()
            await stream.send(request(2, "_test/pid"))
            pid = int(orjson.loads(await lines.line())["result"]["pid"])
            go.touch()
            await stream.send(prompt(3, **spec))
            assert await lines.line() == chunk("before-0")
            asked = orjson.loads(await lines.line())
            assert asked["method"] == "session/request_permission"
            validate_v1_message(asked)
            await stream.aclose()  # the editor is gone with the question open
            event = await proxy.event(
                "no client reattached within the grace time; stopping the agent"
            )
            assert event["answered"] == 1
            await proxy.event("agent session ended")
            await gone(pid)  # no orphan
            proxy.terminate()
            assert await proxy.wait() == 0
    entries = [orjson.loads(x) for x in (tmp_path / "conn-1.jsonl").read_bytes().splitlines()]
    sent = [orjson.loads(e["raw"]) for e in entries if e.get("dir") == "client_to_agent"]
    assert sent[-1] == {
        "jsonrpc": "2.0",
        "id": "perm-1",
        "result": {"outcome": {"outcome": "cancelled"}},
    }
    validate_v1("RequestPermissionResponse", sent[-1]["result"])
    got = [orjson.loads(e["raw"]) for e in entries if e.get("dir") == "agent_to_client"]
    assert got[-2:] == [
        orjson.loads(chunk("permission: cancelled")),
        {"jsonrpc": "2.0", "id": 3, "result": {"stopReason": "end_turn"}},
    ]
    assert [e["event"] for e in entries if e.get("event") in ("detach", "detach_expired")] == [
        "detach",
        "detach_expired",
    ]


@pytest.mark.anyio
async def test_an_attached_session_is_refused_to_a_second_connection_unless_takeover(
    tmp_path: Path,
) -> None:
    for takeover in (False, True):
        config = config_file(tmp_path, f"detach_grace: 60\ntakeover: {str(takeover).lower()}\n")
        with anyio.fail_after(TIMEOUT):
            async with listening(
                "--config", config, "--listen", "tcp://127.0.0.1:0", agent=AGENT
            ) as proxy:
                a = await proxy.connect()
                a_lines = Lines(a)
                await a.send(request(0, "initialize", INIT) + request(1, "session/new", NEW))
                await a_lines.line()
                assert await a_lines.line() == answer(1, {"sessionId": "sess-1"})
                b = await proxy.connect()
                b_lines = Lines(b)
                await b.send(request(0, "initialize", INIT) + request(1, "session/load", LOAD))
                assert await b_lines.line() == answer(0, INIT_ANSWER)
                said = orjson.loads(await b_lines.line())
                if takeover:
                    assert said == {"jsonrpc": "2.0", "id": 1, "result": {}}
                    assert await a_lines.rest() == b""  # the old connection is closed
                    await b.send(request(2, "_test/pid"))
                    assert b"pid" in await b_lines.line()
                else:
                    assert said["error"]["data"] == {"reason": "attached", "sessionId": "sess-1"}
                    # The first connection is untouched.
                    await a.send(request(2, "_test/pid"))
                    assert b"pid" in await a_lines.line()
                proxy.terminate()
                assert await proxy.wait() == 0
                await a.aclose()
                await b.aclose()


@pytest.mark.anyio
async def test_without_detach_grace_the_agent_stops_with_its_connection(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening("--listen", "tcp://127.0.0.1:0", agent=AGENT) as proxy:
            stream = await proxy.connect()
            lines = Lines(stream)
            await stream.send(request(2, "_test/pid"))
            pid = int(orjson.loads(await lines.line())["result"]["pid"])
            await stream.aclose()
            await gone(pid)
            assert proxy.count("client detached; keeping the agent") == 0
            proxy.terminate()
            assert await proxy.wait() == 0
    assert os.path.exists(str(tmp_path))


async def opened_raw(proxy: Any) -> tuple[anyio.abc.ByteStream, Lines, int]:
    """A raw loopback client with a session (initialize, session/new) and its agent's pid."""
    stream = await proxy.connect()
    lines = Lines(stream)
    await stream.send(request(0, "initialize", INIT) + request(1, "session/new", NEW))
    await lines.line()
    assert await lines.line() == answer(1, {"sessionId": "sess-1"})
    await stream.send(request(2, "_test/pid"))
    pid = int(orjson.loads(await lines.line())["result"]["pid"])
    return stream, lines, pid


@pytest.mark.anyio
async def test_a_question_the_old_client_left_open_is_asked_again_after_the_reattach(
    tmp_path: Path,
) -> None:
    go, done = tmp_path / "go", tmp_path / "done"
    spec = {"before": 0, "after": 1, "go": str(go), "done": str(done), "ask": True}
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config",
            config_file(tmp_path, "detach_grace: 60\n"),
            "--listen",
            "tcp://127.0.0.1:0",
            agent=AGENT,
        ) as proxy:
            a, a_lines, pid = await opened_raw(proxy)
            go.touch()
            await a.send(prompt(3, **spec))
            assert await a_lines.line() == chunk("after-0")
            asked = await a_lines.line()
            assert b"session/request_permission" in asked
            await a.aclose()  # gone with the question open
            await proxy.event("client detached; keeping the agent")
            b = await proxy.connect()
            b_lines = Lines(b)
            await b.send(request(0, "initialize", INIT) + request(1, "session/load", LOAD))
            assert await b_lines.line() == answer(0, INIT_ANSWER)
            assert await b_lines.line() == asked  # asked again, the same frame
            await b.send(answer("perm-1", {"outcome": {"outcome": "selected", "optionId": "ok"}}))
            assert await b_lines.line() == chunk("permission: selected")
            assert await b_lines.line() == answer(1, {"stopReason": "end_turn"})
            event = await proxy.event("client reattached")
            assert (event["replayed"], event["redelivered"]) == (0, 1)
            assert alive(pid)
            proxy.terminate()
            assert await proxy.wait() == 0
            await b.aclose()


@pytest.mark.anyio
async def test_a_new_session_while_an_agent_is_held_gets_its_own_agent(tmp_path: Path) -> None:
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config",
            config_file(tmp_path, "detach_grace: 60\n"),
            "--listen",
            "tcp://127.0.0.1:0",
            agent=AGENT,
        ) as proxy:
            a, _, held_pid = await opened_raw(proxy)
            await a.aclose()
            await proxy.event("client detached; keeping the agent")
            # initialize is answered once (by the proxy, from the held agent's answer); the new
            # agent's own answer to it is not passed on.
            b, b_lines, pid = await opened_raw(proxy)
            assert pid != held_pid
            await b.send(request(5, "_test/pid"))
            assert await b_lines.line() == answer(5, {"pid": pid})
            proxy.terminate()
            assert await proxy.wait() == 0
            await b.aclose()
    assert not alive(held_pid)


@pytest.mark.anyio
async def test_past_the_bound_a_load_goes_to_an_agent_that_can_load(tmp_path: Path) -> None:
    go, done = tmp_path / "go", tmp_path / "done"
    spec = {"before": 0, "after": 6, "go": str(go), "done": str(done)}
    config = config_file(tmp_path, "detach_grace: 60\ndetach_buffer_frames: 4\n")
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "tcp://127.0.0.1:0", agent=[*AGENT, "load"]
        ) as proxy:
            a, _, pid = await opened_raw(proxy)
            await a.send(prompt(3, **spec))
            await a.aclose()
            await proxy.event("client detached; keeping the agent")
            go.touch()
            await wait_file(done)
            b = await proxy.connect()
            b_lines = Lines(b)
            await b.send(request(0, "initialize", INIT) + request(1, "session/load", LOAD))
            init = {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}
            assert await b_lines.line() == answer(0, init)
            # The agent's own replay, not a gap.
            assert await b_lines.line() == chunk("history")
            assert await b_lines.line() == answer(1, {})
            await proxy.event("client reattached; session/load forwarded to the agent")
            proxy.terminate()
            assert await proxy.wait() == 0
            await b.aclose()
    assert not alive(pid)


@pytest.mark.anyio
async def test_frames_kept_while_detached_count_in_the_buffer_budget() -> None:
    from acp_proxy.config import Config
    from acp_proxy.shell.log.logsetup import get_logger
    from acp_proxy.shell.session.buffer_budget import process_budget
    from acp_proxy.shell.sockets.detach import HeldSession

    config = Config(detach_grace_s=5.0, detach_buffer_frames=3)
    held = HeldSession(config, 1, get_logger())
    budget = process_budget(config)
    before = budget.held
    frames = chunk("a") + chunk("b")
    await held.write(frames[:-7])  # a partial line is held too
    assert budget.held - before == len(frames) - 7
    await held.write(frames[-7:])
    assert list(held.ledger.buffer) == [chunk("a")[:-1], chunk("b")[:-1]]
    assert budget.held - before == len(frames)
    await held.write(chunk("c") + chunk("d"))  # past 3 frames: dropped, and given back
    assert held.ledger.overflowed
    assert budget.held == before


class _CutClient(NonBlockingSend):
    """A client socket that takes ``room`` bytes at once, then is gone."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.got = b""

    def try_send(self, data: bytes | memoryview) -> int:
        taken = bytes(data[: self.room])
        self.room -= len(taken)
        self.got += taken
        return len(taken)

    async def send(self, data: bytes) -> None:
        raise anyio.BrokenResourceError


@pytest.mark.anyio
async def test_a_line_the_socket_cut_is_kept_whole_when_the_client_is_lost() -> None:
    from acp_proxy.config import Config
    from acp_proxy.shell.log.logsetup import get_logger
    from acp_proxy.shell.sockets.detach import HeldSession

    held = HeldSession(Config(detach_grace_s=5.0), 1, get_logger())
    client = _CutClient(len(chunk("a")) + 5)
    held.attach_first(client)  # type: ignore[arg-type]
    data = chunk("a") + chunk("b") + chunk("c")
    taken = held.tx.try_send(data)
    assert taken == len(chunk("a")) + 5
    await held.tx.send(data[taken:])  # the rest of "b", then "c": the client is gone
    assert client.got == data[:taken]
    assert held.client is None
    # "a" was delivered; "b" (cut) and "c" are kept whole, in order, for the next client.
    assert list(held.ledger.buffer) == [chunk("b")[:-1], chunk("c")[:-1]]


@pytest.mark.anyio
async def test_the_live_view_is_told_of_a_detach() -> None:
    from types import SimpleNamespace

    from acp_proxy.config import Config
    from acp_proxy.shell.log.logsetup import get_logger
    from acp_proxy.shell.sockets.detach import HeldSession
    from acp_proxy.shell.ui.hub import UiHub
    from acp_proxy.shell.ui.tap import UiTap

    hub = UiHub()
    tap = UiTap(hub, hub.open_session({"acp-proxy-record": 1}))
    held = HeldSession(Config(detach_grace_s=5.0), 1, get_logger())
    held.session = SimpleNamespace(observers=(tap,))
    client = _CutClient(0)
    held.attach_first(client)  # type: ignore[arg-type]
    held.ledger.sessions.add("sess-1")
    held._lost(client)  # type: ignore[arg-type]
    hub.drain()
    event = list(hub.events())[-1]
    del event["t"]
    assert event == {
        "seq": 2,
        "conn": 1,
        "event": "detach",
        "grace_s": 5.0,
        "sessions": ["sess-1"],
    }


@pytest.mark.anyio
async def test_while_detached_the_policy_decides_what_it_is_configured_to(tmp_path: Path) -> None:
    go, done = tmp_path / "go", tmp_path / "done"
    spec = {"before": 1, "after": 0, "go": str(go), "done": str(done), "ask": True}
    config = config_file(tmp_path, "detach_grace: 60\npolicy: {default: allow}\n")
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "tcp://127.0.0.1:0", agent=AGENT
        ) as proxy:
            a, a_lines, pid = await opened_raw(proxy)
            await a.send(prompt(3, **spec))
            assert await a_lines.line() == chunk("before-0")
            await a.aclose()
            await proxy.event("client detached; keeping the agent")
            go.touch()
            await wait_file(done)  # the question was answered without a client
            b = await proxy.connect()
            b_lines = Lines(b)
            await b.send(request(0, "initialize", INIT) + request(1, "session/load", LOAD))
            assert await b_lines.line() == answer(0, INIT_ANSWER)
            assert await b_lines.line() == chunk("permission: selected")
            assert await b_lines.line() == answer(1, {"stopReason": "end_turn"})
            assert alive(pid)
            proxy.terminate()
            assert await proxy.wait() == 0
            await b.aclose()


@pytest.mark.anyio
async def test_a_websocket_client_reattaches_like_a_socket_one(tmp_path: Path) -> None:
    """The same over ``ws://``: the editor's ``--connect ws://`` dies mid-turn, a new one
    reattaches and gets every frame after the drop once, then the prompt's answer."""
    go, done = tmp_path / "go", tmp_path / "done"
    spec = {"before": 2, "after": 3, "go": str(go), "done": str(done)}
    config = config_file(tmp_path)
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "ws://127.0.0.1:0/acp", "--detach-grace", "60",
            agent=AGENT,
        ) as proxy:  # fmt: skip
            address = await proxy.address()
            assert address.startswith("ws://127.0.0.1:") and address.endswith("/acp")
            first = await open_client(address, config)
            pid = await start_turn(first, **spec)
            await kill(first)
            await proxy.event("client detached; keeping the agent")
            go.touch()
            await wait_file(done)
            second = await open_client(address, config)
            await reattach(second)
            got = [await second.line() for _ in range(4)]
            assert got == [
                *(chunk(f"after-{i}") for i in range(3)),
                answer(1, {"stopReason": "end_turn"}),
            ]
            await second.send(request(7, "_test/pid"))
            assert await second.line() == answer(7, {"pid": pid})
            await second.stdin.aclose()
            proxy.terminate()
            assert await proxy.wait() == 0
            await second.process.aclose()
    assert not alive(pid)


@pytest.mark.anyio
async def test_the_agent_behind_connect_is_held_like_a_spawned_one(tmp_path: Path) -> None:
    """``--listen`` with ``--connect``: the agent's connection outlives the editor's. The agent
    here is served by another proxy (``--listen unix:// -- AGENT``); the editor's
    ``--connect`` dies mid-turn, a new one reattaches and gets every frame after the drop once,
    then the prompt's answer, from the same agent; the relay's shutdown closes the agent's
    connection, and the agent ends with it."""
    go, done = tmp_path / "go", tmp_path / "done"
    spec = {"before": 2, "after": 3, "go": str(go), "done": str(done)}
    config = config_file(tmp_path)
    agent_socket = f"unix://{tmp_path / 'agent.sock'}"
    with anyio.fail_after(TIMEOUT):
        async with listening("--config", config, "--listen", agent_socket, agent=AGENT) as host:
            await host.address()
            async with listening(
                "--config", config, "--listen", "tcp://127.0.0.1:0", "--connect", agent_socket,
                "--detach-grace", "60",
            ) as relay:  # fmt: skip
                address = await relay.address()
                assert (await relay.event("listening"))["detach_grace_s"] == 60
                first = await open_client(address, config)
                pid = await start_turn(first, **spec)
                await kill(first)
                await relay.event("client detached; keeping the agent")
                go.touch()
                await wait_file(done)
                assert alive(pid)
                second = await open_client(address, config)
                await reattach(second)
                got = [await second.line() for _ in range(4)]
                assert got == [
                    *(chunk(f"after-{i}") for i in range(3)),
                    answer(1, {"stopReason": "end_turn"}),
                ]
                await second.send(request(7, "_test/pid"))
                assert await second.line() == answer(7, {"pid": pid})
                event = await relay.event("client reattached")
                assert (event["replayed"], event["redelivered"]) == (3, 0)
                assert host.count("connection opened") == 1  # one agent connection, kept
                await second.stdin.aclose()
                await wait_until(
                    lambda: relay.count("client detached; keeping the agent") == 2,
                    "the second client detached",
                    settle=0,
                )
                relay.terminate()
                assert await relay.wait() == 0
                await second.process.aclose()
            closed = await relay.event("agent session ended")
            assert closed["status"] == f"agent connection to {agent_socket} closed"
            await gone(pid)  # the relay closed the agent's connection: the host stopped it
            host.terminate()
            assert await host.wait() == 0


@pytest.mark.anyio
async def test_only_the_principal_that_left_a_session_may_reattach_to_it(tmp_path: Path) -> None:
    """Over a WebSocket with JWTs, a held agent belongs to the subject whose token opened it:
    another subject's ``session/load`` naming its session is a load like any other (its own new
    agent answers it: the held one is neither found nor touched), and the same subject
    reattaches as usual."""
    import json as jsonlib
    import time

    import jwt
    from cryptography.hazmat.primitives.asymmetric import ec
    from jwt.algorithms import ECAlgorithm

    key = ec.generate_private_key(ec.SECP256R1())
    jwks = tmp_path / "jwks.json"
    jwk = jsonlib.loads(ECAlgorithm.to_jwk(key.public_key()))
    jwks.write_text(jsonlib.dumps({"keys": [{**jwk, "kid": "k1", "alg": "ES256"}]}))
    issuer, audience = "https://issuer.example", "acp-agents"
    server = config_file(
        tmp_path,
        f"auth:\n  jwks_file: {jwks}\n  jwt_issuer: {issuer}\n  jwt_audience: {audience}\n",
    )

    def client_config(subject: str) -> str:
        claims = {"iss": issuer, "aud": audience, "sub": subject, "exp": int(time.time()) + 300}
        token = tmp_path / f"{subject}.jwt"
        token.write_text(jwt.encode(claims, key, algorithm="ES256", headers={"kid": "k1"}))
        token.chmod(0o600)
        return write_config(tmp_path / f"{subject}.yaml", PLAIN + f"auth:\n  token_file: {token}\n")

    alice, mallory = client_config("alice"), client_config("mallory")
    go, done = tmp_path / "go", tmp_path / "done"
    spec = {"before": 1, "after": 2, "go": str(go), "done": str(done)}
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", server, "--listen", "ws://127.0.0.1:0/acp", "--detach-grace", "60",
            agent=AGENT,
        ) as proxy:  # fmt: skip
            address = await proxy.address()
            first = await open_client(address, alice)
            pid = await start_turn(first, **spec)
            await kill(first)
            await proxy.event("client detached; keeping the agent")
            go.touch()
            await wait_file(done)
            # Another subject names alice's session: its own agent answers the load.
            other = await open_client(address, mallory)
            await reattach(other)
            assert await other.line() == chunk("history")
            assert await other.line() == answer(1, {})
            await other.send(request(2, "_test/pid"))
            other_pid = int(orjson.loads(await other.line())["result"]["pid"])
            assert other_pid != pid
            assert proxy.count("client reattached") == 0
            await kill(other)  # now an agent is held for each subject, both with sess-1
            await wait_until(
                lambda: proxy.count("client detached; keeping the agent") == 2,
                "the other subject's client detached",
                settle=0,
            )
            # The other subject reattaches: to its own agent, never to alice's.
            other = await open_client(address, mallory)
            await reattach(other)
            assert await other.line() == answer(1, {})
            await other.send(request(2, "_test/pid"))
            assert await other.line() == answer(2, {"pid": other_pid})
            await kill(other)
            # Alice gets her session, with everything it sent while she was away.
            second = await open_client(address, alice)
            await reattach(second)
            got = [await second.line() for _ in range(3)]
            assert got == [
                chunk("after-0"),
                chunk("after-1"),
                answer(1, {"stopReason": "end_turn"}),
            ]
            await second.send(request(7, "_test/pid"))
            assert await second.line() == answer(7, {"pid": pid})
            reattached = [e for e in proxy.events if e["event"] == "client reattached"]
            assert [e["replayed"] for e in reattached] == [0, 2]
            principals = {e["principal"] for e in proxy.events if "principal" in e}
            assert principals == {f"{issuer} alice", f"{issuer} mallory"}
            await second.stdin.aclose()
            proxy.terminate()
            assert await proxy.wait() == 0
            await second.process.aclose()
    assert not alive(pid) and not alive(other_pid)
