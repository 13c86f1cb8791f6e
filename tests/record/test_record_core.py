"""The pure record package: redaction, line building, the transcript, the replay script.

Synchronous and table-driven; the shell tests (tests/record/test_record.py) run the real proxy.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from acp_proxy.meta.state import ClientModel
from acp_proxy.record.chunkrefs import ChunkRef, chunk_value
from acp_proxy.record.format import (
    UNREADABLE,
    RecordError,
    Redactor,
    delivered,
    event_line,
    frame_bytes,
    frame_line,
    parse_header,
    parse_line,
)
from acp_proxy.record.replay import ClientPlayer, Replayer, normalise
from acp_proxy.record.transcript import Transcript, meta_diff, render

R = Redactor.build()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"a":1}', b'{"a":1}'),
        (b'{"env":{"X":"1"},"n":null}', b'{"env":{"X":"[REDACTED]"},"n":null}'),
        (b'{"ENV":null}', b'{"ENV":null}'),  # null holds no secret: kept, frame exact
        (b'{"deep":[{"accessToken":"abc"}]}', b'{"deep":[{"accessToken":"[REDACTED]"}]}'),
        (b'{"t":"key sk-abcdefghijklmnopqrstuvwx end"}', b'{"t":"key [REDACTED] end"}'),
        (b'{"tokens":3,"tokenizer":"x"}', b'{"tokens":3,"tokenizer":"x"}'),
        (b'{"a":"AKIAABCDEFGHIJKLMNOP"}', b'{"a":"[REDACTED]"}'),
    ],
)
def test_redactor(raw: bytes, expected: bytes) -> None:
    assert R.frame(raw)[0] == expected


def test_frame_line_marks_what_the_proxy_did() -> None:
    line = frame_line(
        1.5, "agent_to_client", b'{"x":1}', R, sent=[b'{"x":2}', b"\xff"], changed_by=["r"]
    )
    assert orjson.loads(line) == {
        "t": 1.5,
        "dir": "agent_to_client",
        "raw": '{"x":1}',
        "sent": ['{"x":2}', {"b64": "/w=="}],
        "changed_by": ["r"],
    }
    entry = parse_line(line)
    assert entry is not None
    assert delivered(entry) == [b'{"x":2}', b"\xff"]
    binary = orjson.loads(frame_line(0, "client_to_agent", b"\xfe\n", R, generated=True))
    assert binary == {"t": 0, "dir": "client_to_agent", "raw_b64": "/go=", "generated": True}
    assert parse_line(b'{"t":1,"ev') is None  # a torn line
    assert orjson.loads(event_line(2.0, "lost", frames=3)) == {
        "t": 2.0,
        "event": "lost",
        "frames": 3,
    }


def test_parse_header_refuses_other_files_and_versions() -> None:
    with pytest.raises(RecordError, match='no "acp-proxy-record" key'):
        parse_header(b'{"jsonrpc":"2.0"}')
    with pytest.raises(RecordError, match="format version 2; this acp-proxy reads version 1"):
        parse_header(b'{"acp-proxy-record":2}')


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ({"_meta": {"a": 1}}, {"_meta": {"a": 1}}, []),
        ({}, {"_meta": {"a": 1}}, ["+ a: 1"]),
        ({"_meta": {"a": 1}}, {"_meta": {"a": 2}}, ["~ a: 1 -> 2"]),
        ({"_meta": {"a": 1}}, {"_meta": {"a": None}}, ["- a"]),
        ({"_meta": {"a": 1}}, {"_meta": {}}, ["- a"]),
        (
            {"params": {"update": {"_meta": {"k": "v"}}}},
            {"params": {"update": {"_meta": {"k": "v", "n": True}}}},
            ["+ n: true (params.update._meta)"],
        ),
    ],
)
def test_meta_diff(before: Any, after: Any, expected: list[str]) -> None:
    assert meta_diff(before, after) == expected


def _frame(t: float, direction: str, message: object, **extra: object) -> dict[str, Any]:
    return {"t": t, "dir": direction, "raw": json.dumps(message), **extra}


C, A = "client_to_agent", "agent_to_client"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
INIT_OK = {"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 2}}
PROMPT = {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": "s"}}
UPDATE = {
    "jsonrpc": "2.0",
    "method": "session/update",
    "params": {"sessionId": "s", "update": {"sessionUpdate": "plan", "entries": []}},
}
PROMPT_OK = {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}
RECORD = [
    _frame(0.0, C, INIT),
    _frame(0.1, C, PROMPT),  # pipelined: sent before the initialize response
    _frame(0.2, A, INIT_OK),
    _frame(0.3, A, UPDATE),
    _frame(0.4, A, PROMPT_OK),
]


def test_transcript_joins_responses_with_latency() -> None:
    transcript = Transcript()
    rows = [transcript.feed(e) for e in RECORD]
    text = [line for row in rows if row is not None for line in render(row)]
    assert text == [
        "     0.000  C→A initialize #1",
        "     0.100  C→A session/prompt #2",
        "     0.200  A→C response #1 to initialize after 200 ms",
        "     0.300  A→C session/update plan",
        "     0.400  A→C response #2 to session/prompt after 300 ms",
    ]


def test_replay_script_gates_agent_messages_by_the_requests_they_answer() -> None:
    replayer = Replayer.from_record(RECORD)
    assert replayer.ready() == []
    assert replayer.receive(json.dumps({**INIT, "id": "a"}).encode()) == []
    out = [json.loads(frame) for _, frame in replayer.ready()]
    assert out == [{**INIT_OK, "id": "a"}]  # the prompt has not come: the update waits
    assert replayer.receive(json.dumps({**PROMPT, "id": 7}).encode()) == []
    out = [json.loads(frame) for _, frame in replayer.ready()]
    assert out == [UPDATE, {**PROMPT_OK, "id": 7}]
    assert replayer.finish() == []


def test_replay_keeps_a_live_id_only_until_its_response_is_played() -> None:
    # A long record of request/response pairs: the table of live ids holds the requests whose
    # response is still to come, not one entry per request of the record.
    n = 1_000
    record = [_frame(0.0, C, INIT), _frame(0.1, A, INIT_OK)]
    for i in range(n):
        record.append(_frame(0.2, C, {**PROMPT, "id": 10 + i}))
        record.append(_frame(0.3, A, {**PROMPT_OK, "id": 10 + i}))
    replayer = Replayer.from_record(record)
    assert replayer.receive(json.dumps(INIT).encode()) == []
    assert len(replayer.ready()) == 1
    for i in range(n):
        assert replayer.receive(json.dumps({**PROMPT, "id": f"live-{i}"}).encode()) == []
        assert replayer.open_ids == 1
        [(_, frame)] = replayer.ready()
        assert json.loads(frame) == {**PROMPT_OK, "id": f"live-{i}"}
        assert replayer.open_ids == 0
    assert replayer.finish() == []


def test_replay_script_answers_a_diverging_client_with_errors() -> None:
    replayer = Replayer.from_record(RECORD)
    replies = replayer.receive(json.dumps({**INIT, "method": "authenticate"}).encode())
    assert [json.loads(r) for r in replies] == [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "error": {
                "code": -32603,
                "message": "acp-proxy replay: client message 1 diverges from the record: "
                "expected request initialize, got request authenticate",
            },
        }
    ]
    assert replayer.ready() == []
    assert len(replayer.receive(json.dumps(PROMPT).encode())) == 1  # every request from then on
    assert replayer.finish() == [
        "client message 1 diverges from the record: expected request initialize, got request "
        "authenticate"
    ]


def test_client_player_maps_agent_request_ids_and_normalises_times() -> None:
    ask = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "fs/read_text_file",
        "params": {"at": "2026-01-01T00:00:00Z"},
    }
    answer = {"jsonrpc": "2.0", "id": 5, "result": {"content": "x"}}
    player = ClientPlayer.from_record([_frame(0, C, INIT), _frame(0, A, ask), _frame(0, C, answer)])
    assert [json.loads(f) for f in player.due()] == [INIT]
    live = {**ask, "id": "agent-1", "params": {"at": "2026-12-03T07:00:00.5+00:00"}}
    player.agent_frame(json.dumps(live).encode())
    assert [json.loads(f) for f in player.due()] == [{**answer, "id": "agent-1"}]
    assert player.finish() == []
    assert normalise({"a": ["2026-01-01 10:00"]}) == {"a": ["<time>"]}


def test_a_frame_nested_too_deep_to_walk_is_redacted_whole() -> None:
    # Found in review: json.loads raised RecursionError (not ValueError) out of the recorder
    # for a hostile frame holding a secret-looking key.
    redactor = Redactor.build()
    raw = b'{"apiKey":"sk-live","d":' + b"[" * 2000 + b"]" * 2000 + b"}"
    assert redactor.frame(raw) == (UNREADABLE, True)
    assert json.loads(UNREADABLE).startswith("[REDACTED")


def test_final_state_streams_chunks_into_the_model_without_copies() -> None:
    # show --state feeds the client model line by line; chunks append in place (a copy per
    # chunk was quadratic) and the final state is the model's own, equal to its deep copy.
    def chunk(i: int) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": "s",
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "messageId": "m",
                    "content": {"type": "text", "text": f"part {i}"},
                },
            },
        }

    transcript = Transcript()
    model = ClientModel(2)
    transcript.feed({"t": 0.0, "event": "version", "protocolVersion": 2})
    for i in range(3):
        transcript.feed(_frame(0.1, A, chunk(i)))
        model.apply(chunk(i))
    state = transcript.final_state()
    assert state == model.snapshot()
    [entity] = state["entities"].values()
    assert [c["text"] for c in entity["fields"]["content"]] == ["part 0", "part 1", "part 2"]


def test_frame_bytes_never_raises_on_a_bad_field() -> None:
    # For readers that take parse_line's objects as they are (read_line says what is wrong).
    assert frame_bytes({"raw_b64": "%%%not base64"}) == b""
    assert frame_bytes({"raw": {"not": "a string"}}) == b""
    assert delivered({"sent": [{"b64": "x"}, 3, "ok"]}) == [b"", b"", b"ok"]


def test_state_with_chunks_left_in_the_file_reads_back_the_same_state() -> None:
    def chunk(i: int, kind: str = "agent_message_chunk") -> dict[str, Any]:
        update = {
            "sessionUpdate": kind,
            "messageId": "m",
            "content": {"type": "text", "text": f"p{i}"},
        }
        return {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": "s", "update": update},
        }

    lines = [
        _frame(0.0, A, chunk(0)),
        _frame(0.1, A, [chunk(1), chunk(2, "agent_thought_chunk")]),  # a batch
        # The proxy changed it: the client received the two frames of "sent".
        {**_frame(0.2, A, chunk(3)), "sent": [json.dumps(chunk(4)), json.dumps(chunk(5))]},
    ]
    encoded = [orjson.dumps(line) for line in lines]
    offsets = [sum(len(e) + 1 for e in encoded[:i]) for i in range(len(encoded))]
    at = dict(zip(offsets, encoded, strict=True))
    plain, placed = Transcript(version=2), Transcript(version=2)
    for line, offset in zip(lines, offsets, strict=True):
        plain.feed(line)
        placed.feed(line, offset)
    refs = 0

    def resolved(value: Any) -> Any:
        nonlocal refs
        if isinstance(value, ChunkRef):
            refs += 1
            return chunk_value(at[value.where[0]], value, placed.state_version())
        if isinstance(value, dict):
            return {k: resolved(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolved(v) for v in value]
        return value

    assert resolved(placed.final_state()) == plain.final_state()
    assert refs == 5  # every chunk the client received, none of the one it did not
