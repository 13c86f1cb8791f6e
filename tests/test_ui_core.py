"""The live view's pure room: stream events, request joining, the entity view, exports and the
request checks (acp_proxy.ui)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.telemetry.endpoint import parse_head
from acp_proxy.ui import events, security
from acp_proxy.ui.entities import EntityView
from acp_proxy.ui.export import record_lines, zed_messages

C2A, A2C = "client_to_agent", "agent_to_client"


def frame(direction: str, message: object, t: float = 0.0, **extra: Any) -> Any:
    return {"t": t, "dir": direction, "raw": orjson.dumps(message).decode(), **extra}


def update(kind: str, meta: object = "omit", **fields: object) -> Any:
    body: dict[str, object] = {"sessionUpdate": kind, **fields}
    if meta != "omit":
        body["_meta"] = meta
    message = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": "s", "update": body},
    }
    return message


@pytest.mark.parametrize(
    ("message", "info"),
    [
        (
            {"jsonrpc": "2.0", "id": 1, "method": "initialize"},
            {"type": "request", "method": "initialize", "id": 1},
        ),
        (
            {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}},
            {"type": "notification", "method": "session/cancel", "session": "s"},
        ),
        ({"jsonrpc": "2.0", "id": "a", "result": {}}, {"type": "response", "id": "a"}),
        (
            {"jsonrpc": "2.0", "id": 3, "error": {"code": -32601, "message": "no"}},
            {"type": "error", "id": 3, "code": -32601, "message": "no"},
        ),
        ([{"jsonrpc": "2.0", "method": "x"}], {"type": "batch", "size": 1}),
        ("text", {"type": "other"}),
        (
            update("tool_call_update", toolCallId="c"),
            {
                "type": "notification",
                "method": "session/update",
                "session": "s",
                "update": "tool_call_update",
            },
        ),
    ],
)
def test_describe_message(message: Any, info: JsonObject) -> None:
    assert events.describe_message(message) == info


def test_a_response_is_joined_to_its_request_with_the_latency() -> None:
    builder = events.StreamBuilder()
    builder.session(1, {"acp-proxy-record": 1})
    request = builder.line(1, frame(C2A, {"jsonrpc": "2.0", "id": 7, "method": "session/new"}, 1.0))
    other = builder.line(1, frame(C2A, {"jsonrpc": "2.0", "id": 7, "result": {}}, 1.1))
    answer = builder.line(1, frame(A2C, {"jsonrpc": "2.0", "id": 7.0, "result": {}}, 1.25))
    assert other["info"] == {"type": "response", "id": 7}  # same direction: not an answer
    assert answer["info"] == {
        "type": "response",
        "id": 7.0,
        "reply_to": request["seq"],
        "answers": "session/new",
        "latency": 0.25,
    }
    again: Any = builder.line(1, frame(A2C, {"jsonrpc": "2.0", "id": 7, "result": {}}, 1.3))
    assert "reply_to" not in again["info"]  # each request is answered once


def test_pending_requests_are_bounded() -> None:
    joiner = events.Joiner()
    for i in range(2 * events.MAX_PENDING + 10):
        joiner.see(C2A, {"type": "request", "id": i, "method": "m"}, i, 0.0)
    first: JsonObject = {"type": "response", "id": 0}
    joiner.see(A2C, first, 99, 0.0)
    assert "reply_to" not in first  # forgotten: the oldest went first
    last: JsonObject = {"type": "response", "id": 2 * events.MAX_PENDING + 9}
    joiner.see(A2C, last, 99, 0.0)
    assert last["reply_to"] == 2 * events.MAX_PENDING + 9


def test_non_message_frames_keep_their_kind() -> None:
    builder = events.StreamBuilder()
    line: Any = {"t": 0, "dir": A2C, "raw": "hello", "kind": "non-json", "sent": []}
    assert builder.line(1, line)["info"] == {"type": "non-json"}


def _view(*lines: Any) -> Any:
    builder, view = events.StreamBuilder(), EntityView()
    for line in lines:
        view.feed(builder.line(1, line))
    entities: Any = view.snapshot()["entities"]
    return {str(e["id"]): e for e in entities}


def test_the_entity_view_marks_what_the_proxy_wrote() -> None:
    sent = update("tool_call_update", {"a": 1, "x/route": "edge", "dbg": None}, toolCallId="c")
    got = _view(
        frame(
            A2C,
            update("tool_call_update", {"a": 1, "dbg": True}, toolCallId="c", title="T"),
            sent=[orjson.dumps(sent).decode()],
            changed_by=["rules:r"],
        )
    )["c"]
    assert got["meta"] == {"a": 1, "x/route": "edge"}
    assert got["injected"] == {"x/route": ["rules:r"]}
    ops = [(h["op"], h["key"], h["by"]) for h in got["history"]]
    assert ops == [("set", "a", "agent"), ("set", "x/route", "proxy"), ("remove", "dbg", "proxy")]


def test_a_clear_by_the_agent_and_the_proxys_follow_up() -> None:
    cleared = update("tool_call_update", None, toolCallId="c")
    follow = update("tool_call_update", {"x/route": "edge"}, toolCallId="c")
    got = _view(
        frame(A2C, update("tool_call_update", {"a": 1}, toolCallId="c")),
        frame(
            A2C,
            cleared,
            sent=[orjson.dumps(cleared).decode(), orjson.dumps(follow).decode()],
            changed_by=["rules:r"],
        ),
    )["c"]
    assert got["meta"] == {"x/route": "edge"}
    history = [(h["op"], h.get("key"), h["by"]) for h in got["history"]]
    assert history == [("set", "a", "agent"), ("clear", None, "agent"), ("set", "x/route", "proxy")]
    assert got["injected"] == {"x/route": ["rules:r"]}


def test_a_clear_the_proxy_wrote_is_the_proxys() -> None:
    got = _view(frame(A2C, update("tool_call_update", None, toolCallId="c"), generated=True))["c"]
    assert [(h["op"], h["by"]) for h in got["history"]] == [("clear", "proxy")]


def test_the_entity_view_is_bounded() -> None:
    from acp_proxy.ui import entities

    view, builder = EntityView(), events.StreamBuilder()
    for i in range(entities.MAX_HISTORY + 5):
        view.feed(builder.line(1, frame(A2C, update("tool_call_update", {"k": i}, toolCallId="c"))))
    snapshot: Any = view.snapshot()
    (entity,) = snapshot["entities"]
    assert len(entity["history"]) == entities.MAX_HISTORY
    assert entity["history_dropped"] == 5
    assert entity["meta"] == {"k": entities.MAX_HISTORY + 4}


def test_zed_export_has_zeds_shape() -> None:
    builder = events.StreamBuilder()
    lines = [
        frame(C2A, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"v": 2}}),
        frame(A2C, {"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}),
        frame(A2C, {"jsonrpc": "2.0", "id": 9, "error": {"code": 1, "message": "m"}}),
        frame(A2C, {"jsonrpc": "2.0", "method": "session/update", "params": {"u": 1}}),
        frame(A2C, {"jsonrpc": "2.0", "method": "x"}, sent=[]),
    ]
    got = zed_messages([builder.line(1, line) for line in lines])
    assert got == [
        {
            "_direction": "outgoing",
            "_type": "request",
            "id": 1,
            "method": "initialize",
            "params": {"v": 2},
        },
        {
            "_direction": "incoming",
            "_type": "response",
            "id": 1,
            "method": "initialize",
            "params": {"ok": True},
        },
        {
            "_direction": "incoming",
            "_type": "response",
            "id": 9,
            "method": "[unrecognized response]",
            "params": {"code": 1, "message": "m"},
        },
        {
            "_direction": "incoming",
            "_type": "notification",
            "id": None,
            "method": "session/update",
            "params": {"u": 1},
        },
    ]


def test_record_export_gives_back_the_record_lines() -> None:
    builder = events.StreamBuilder()
    header: Any = {"acp-proxy-record": 1, "started": "x"}
    line = frame(C2A, {"jsonrpc": "2.0", "method": "x"}, 0.5)
    stream = [
        builder.session(1, header),
        builder.line(1, line),
        builder.line(1, {"t": 1, "event": "end"}),
    ]
    out = record_lines(stream, header).splitlines()
    assert [orjson.loads(x) for x in out] == [header, line, {"t": 1, "event": "end"}]


# -- the request checks -------------------------------------------------------------------------

TOKEN = "tok-123"


def head(target: str = f"/?token={TOKEN}", method: str = "GET", **headers: str) -> bytes:
    fields = {"Host": "127.0.0.1:8000", **{k.replace("_", "-"): v for k, v in headers.items()}}
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (head(), None),
        (head(f"/events?since=3&token={TOKEN}"), None),
        (head("/", Authorization=f"Bearer {TOKEN}"), None),
        (head("/"), 403),
        (head("/?token=tok-124"), 403),
        (head("/?token="), 403),
        (head(Host="localhost:8000"), None),
        (head(Host="[::1]:8000"), None),
        (head(Host="evil.example:8000"), 421),  # DNS rebinding
        (head(Host="127.0.0.1:9000"), 421),
        (head(Host="127.0.0.1"), 421),
        (head(Origin="http://127.0.0.1:8000"), None),
        (head(Origin="http://evil.example"), 403),
        (head(Origin="null"), 403),
        (head(Sec_Fetch_Site="cross-site"), 403),
        (head(Sec_Fetch_Site="same-origin"), None),
        (head(method="POST"), 405),
        (head(Host="10.1.2.3:8000"), 421),
    ],
)
def test_refusal(raw: bytes, status: int | None) -> None:
    request = parse_head(raw)
    assert request is not None
    refused = security.refusal(
        request, token=TOKEN, port=8000, names=["127.0.0.1"], allow_remote=False
    )
    assert (refused.status if refused else None) == status


def test_remote_hosts_need_allow_remote() -> None:
    request = parse_head(head(Host="10.1.2.3:8000"))
    assert request is not None
    assert security.refusal(request, token=TOKEN, port=8000, names=[], allow_remote=True) is None
    named = parse_head(head(Host="evil.example:8000"))
    assert named is not None
    refused = security.refusal(named, token=TOKEN, port=8000, names=[], allow_remote=True)
    assert refused is not None and refused.status == 421


@pytest.mark.parametrize(
    "raw", [b"", b"GET /\r\n\r\n", b"GET x HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\nbad\r\n\r\n"]
)
def test_malformed_heads(raw: bytes) -> None:
    assert parse_head(raw) is None


def test_the_ui_section_of_the_config(tmp_path: Any) -> None:
    from acp_proxy.config import ConfigError, load_config
    from acp_proxy.config.model import UiConfig

    path = tmp_path / "c.yaml"
    path.write_text("ui:\n  address: tcp://127.0.0.1:0\n  observer_bytes: 1MiB\n")
    config = load_config(str(path), {})
    assert config.ui == UiConfig(address="tcp://127.0.0.1:0", observer_bytes=1024 * 1024)
    assert load_config(None, {}).ui == UiConfig()
    path.write_text("ui:\n  max_observers: 0\n")
    with pytest.raises(ConfigError, match=r"ui\.max_observers"):
        load_config(str(path), {})


def test_ids_join_by_their_json_value() -> None:
    builder = events.StreamBuilder()
    builder.session(1, {"acp-proxy-record": 1})
    for n, request_id in enumerate(["7", 7, True, [1]]):
        builder.line(1, frame(C2A, {"jsonrpc": "2.0", "id": request_id, "method": f"m{n}"}))
    answers: list[Any] = [
        builder.line(1, frame(A2C, {"jsonrpc": "2.0", "id": response_id, "result": {}}))["info"]
        for response_id in (1, 7.0, "7", [1], True)
    ]
    # 1 answers nothing (the request true is not 1); 7.0 answers 7; "7" answers "7".
    assert [info.get("answers") for info in answers] == [None, "m1", "m0", "m3", "m2"]
