"""Viewing never breaks the session: deep frames, failing handlers, display-safe text.

The server runs in-process on a real socket beside a stand-in session task: a request that
went wrong answers 500 and leaves the session's task group running.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable

import anyio
import orjson
import pytest
from ui_inproc import serving

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.shell.ui import live_server as ui_server
from acp_proxy.shell.ui.hub import UiHub
from acp_proxy.ui import deepjson, export
from acp_proxy.ui.entities import EntityView
from acp_proxy.wire.chain import Direction


def _deep_frame(depth: int) -> str:
    """A legal ``tool_call_update`` whose ``rawInput`` and ``_meta`` value nest ``depth`` arrays."""
    inner = "[" * depth + "1" + "]" * depth
    return (
        '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        '{"sessionUpdate":"tool_call_update","toolCallId":"c1","title":"t","rawInput":'
        + inner
        + ',"_meta":{"k":'
        + inner
        + "}}}}"
    )


@pytest.mark.anyio
@pytest.mark.parametrize("depth", [300, 1000])
async def test_a_deep_frame_is_served_and_the_session_goes_on(depth: int) -> None:
    hub = UiHub(mode="live")
    conn = hub.open_session({"acp-proxy-record": 1})
    frame = _deep_frame(depth)
    hub.add_line(conn, {"t": 0.5, "dir": "agent_to_client", "raw": frame})
    hub.published()
    stop, session_went_on = anyio.Event(), anyio.Event()

    async def session() -> None:  # a stand-in for the session, in the same task group
        await stop.wait()
        session_went_on.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(session)
        async with serving(hub) as served:
            status, body = await served.get(f"/api/entities?conn={conn}")
            assert status == 200
            inner = "[" * depth + "1" + "]" * depth
            assert f'"rawInput":{inner}'.encode() in body
            assert f'"key":"k","value":{inner},"by":"agent"'.encode() in body
            status, zed = await served.get(f"/export?conn={conn}&format=zed")
            assert status == 200
            params = '"sessionId": "s",\n      "update": {'
            assert zed.startswith(
                b'[\n  {\n    "_direction": "incoming",\n    "_type": "notification",\n'
                b'    "id": null,\n    "method": "session/update",\n    "params": {\n      '
                + params.encode()
            )
            status, record = await served.get(f"/export?conn={conn}")
            assert status == 200
            assert (
                record.split(b"\n")[1]
                == json.dumps(
                    {"t": 0.5, "dir": "agent_to_client", "raw": frame}, separators=(",", ":")
                ).encode()
            )
        stop.set()
    assert session_went_on.is_set()


@pytest.mark.anyio
async def test_a_failing_handler_answers_500_and_the_server_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub = UiHub(mode="live")
    conn = hub.open_session({"acp-proxy-record": 1})
    hub.published()

    def broken(*_: object) -> object:
        raise ValueError("a bug in the view")

    async with serving(hub) as served:
        with monkeypatch.context() as patch:
            patch.setattr(EntityView, "snapshot", broken)
            status, body = await served.get(f"/api/entities?conn={conn}")
        assert (status, body) == (500, b"the live view failed to answer this request\n")
        assert served.server.failed == 1
        status, body = await served.get("/api/sessions")
        assert status == 200
        assert orjson.loads(body)["sessions"][0]["conn"] == conn


SAMPLES = [
    {},
    [],
    {"a": [1, 2.5, None, True, False, 'x\n"é\u2028'], "b": {}, "c": [], "d": {"e": [{}]}},
    [[[]], {"k": {"l": [1, {"m": "n"}]}}],
    "text",
    -7,
    1e16,
]


@pytest.mark.parametrize("value", SAMPLES)
def test_the_loop_writes_what_the_fast_encoders_write(value: object) -> None:
    assert deepjson.encode(value, None, deepjson._compact_leaf) == orjson.dumps(value)
    pretty = json.dumps(value, indent=2, ensure_ascii=False).encode()
    assert deepjson.encode(value, 2, deepjson._pretty_leaf) == pretty


def test_a_value_deeper_than_the_stack_is_encoded() -> None:
    depth = 5000
    value: object = "x"
    for _ in range(depth):
        value = [{"k": value}]
    compact = deepjson.compact(value)
    assert compact == b'[{"k":' * depth + b'"x"' + b"}]" * depth
    pretty = deepjson.pretty([[1]] * 1)
    assert pretty == b"[\n  [\n    1\n  ]\n]"
    lines = deepjson.pretty(value).split(b"\n")
    assert len(lines) == 4 * depth + 1
    assert lines[2 * depth] == b" " * (4 * depth) + b'"k": "x"'


def test_a_frame_the_view_fails_on_is_still_published(monkeypatch: pytest.MonkeyPatch) -> None:
    hub = UiHub(mode="live")
    tap = hub.session_observer(
        type(
            "S",
            (),
            {
                "config": type(
                    "C",
                    (),
                    {
                        "source": None,
                        "rule_names": (),
                        "rules": (),
                        "middleware": (),
                        "max_parse_bytes": 1 << 20,
                    },
                )()
            },
        )()
    )

    def broken(*_: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(EntityView, "feed", broken)
    tap.on_generated(Direction.AGENT_TO_CLIENT, (b'{"a":1}', b'{"b":2}'), tap.start)
    assert hub.drain() is False
    raws = [event.get("raw") for event in hub.events()]
    assert raws == [None, '{"a":1}', '{"b":2}']
    assert hub.failed == 2


@pytest.mark.anyio
async def test_bidirectional_controls_are_shown_escaped() -> None:
    hub = UiHub(mode="live")
    conn = hub.open_session({"acp-proxy-record": 1})
    # "session/update" as a person reads it once the override has reordered the text
    method = "\u202eetadpu/noisses\u202c"
    request = {"jsonrpc": "2.0", "id": "\u2066x\u2069", "method": method, "params": {}}
    update = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "s\u200f",
            "update": {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "c\u200e1",
                "title": "rm -rf \u202a/\u202b\u202d\u2067\u2068",
            },
        },
    }
    for message in (request, update):
        raw = json.dumps(message, ensure_ascii=False)
        hub.add_line(conn, {"t": 0, "dir": "agent_to_client", "raw": raw})
    hub.published()
    async with serving(hub) as served:
        status, body = await served.get("/history")
        assert status == 200
        events = [orjson.loads(line) for line in body.splitlines()]
        assert events[2]["info"] == {
            "type": "request",
            "method": "\\u202eetadpu/noisses\\u202c",
            "id": "\\u2066x\\u2069",
        }
        assert events[2]["raw"] == json.dumps(request, ensure_ascii=False)  # exact bytes
        assert events[3]["info"]["session"] == "s\\u200f"
        status, body = await served.get(f"/api/entities?conn={conn}")
        assert status == 200
        entity = orjson.loads(body)["entities"][0]
        assert (entity["session"], entity["id"]) == ("s\\u200f", "c\\u200e1")
        assert entity["fields"]["title"] == "rm -rf \\u202a/\\u202b\\u202d\\u2067\\u2068"
        assert "\u202e".encode() not in body and b"\xe2\x80" not in body


@pytest.mark.anyio
async def test_connections_without_a_whole_request_cannot_hold_the_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ui_server, "MAX_CLIENTS", 4)
    monkeypatch.setattr(ui_server, "MAX_HEADS", 4, raising=False)
    hub = UiHub(mode="live")
    conn = hub.open_session({"acp-proxy-record": 1})
    hub.published()
    async with serving(hub) as served:
        # Twelve connections that start a request and never finish it (a byte now and then
        # would not finish it either), connected before the request with the token.
        idle = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(12)]
        for sock in idle:
            sock.sendall(b"GET /?token=wrong HTTP/1.1\r\nHost: 127")
        with anyio.fail_after(5):  # without room for it: HEAD_TIMEOUT_S (10 s) at least
            status, body = await served.get("/api/sessions")
        assert status == 200
        assert orjson.loads(body)["sessions"][0]["conn"] == conn
        # The oldest waiting connections were closed to make room, unanswered.
        assert served.server.evicted == 9
        idle[0].settimeout(5)
        assert idle[0].recv(100) == b""
        for sock in idle:
            sock.close()


@pytest.mark.anyio
async def test_a_body_that_fails_half_way_ends_without_a_second_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub = UiHub(mode="live")
    conn = hub.open_session({"acp-proxy-record": 1})
    for n in range(600):  # several pieces of /export
        hub.add_line(conn, {"t": n, "dir": "agent_to_client", "raw": "y" * 2000})
    hub.published()
    feed = export.RecordWriter.feed
    calls: list[int] = []

    def failing(self: export.RecordWriter, held: Iterable[JsonObject]) -> bytes:
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("a bug in the export")
        return feed(self, held)

    monkeypatch.setattr(export.RecordWriter, "feed", failing)
    async with serving(hub) as served:
        status, body = await served.get(f"/export?conn={conn}")
        assert status == 200
        assert b"HTTP/1.1" not in body  # no 500 written into the body
        assert body.startswith(b'{"acp-proxy-record":1,"conn":1}\n{"t":0,')
        assert served.server.failed == 1
        assert (await served.get("/api/sessions"))[0] == 200
