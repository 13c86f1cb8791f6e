"""v1 chunks without a ``messageId``: one message per turn, in ``show``, ``show --state``, the
live view and the client model (a `session/prompt` request, or its response, ends the messages
without an id)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from acp_proxy.cli import show_command as show
from acp_proxy.meta.state import ClientModel, MessageTurns
from acp_proxy.record.format import Redactor, event_line, frame_line, header
from acp_proxy.ui.entities import EntityView

R = Redactor.build()
C, A = "client_to_agent", "agent_to_client"


def prompt(request_id: int, session: str = "s") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "session/prompt",
        "params": {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]},
    }


def done(request_id: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}}


def chunk(text: str, session: str = "s", kind: str = "agent_message_chunk") -> dict[str, Any]:
    update = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": session, "update": update},
    }


def record(tmp_path: Path, frames: list[tuple[str, dict[str, Any]]]) -> Path:
    lines = [
        header(
            started="2026-12-03T00:00:00.000+00:00",
            version="test",
            agent=["agent"],
            connect=None,
            config=None,
            rules=[],
            middleware=[],
            conn=None,
            redactor=R,
        ),
        event_line(0.0, "version", protocolVersion=1),
    ]
    for i, (direction, message) in enumerate(frames):
        lines.append(frame_line(0.1 * (i + 1), direction, json.dumps(message).encode(), R))
    path = tmp_path / "v1.jsonl"
    path.write_bytes(b"".join(lines))
    return path


TWO_TURNS = [
    (C, prompt(1)),
    (A, chunk("Hel")),
    (A, chunk("lo")),
    (A, done(1)),
    (C, prompt(2)),
    (A, chunk("Bye")),
    (A, done(2)),
]


def test_show_labels_a_v1_chunk_by_its_message_of_the_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert show.main(["--color", "never", str(record(tmp_path, TWO_TURNS))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if "session/update" in line] == [
        "     0.200  A→C session/update agent_message_chunk agent_message:#1",
        "     0.300  A→C session/update agent_message_chunk agent_message:#1",
        "     0.600  A→C session/update agent_message_chunk agent_message:#2",
    ]


def test_show_state_keeps_one_v1_message_per_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert show.main(["--state", str(record(tmp_path, TWO_TURNS))]) == 0
    state = json.loads(capsys.readouterr().out)
    assert [(e["entity"], e["fields"]) for e in state["entities"]] == [
        (
            ["agent_message", "s", None, "#1"],
            {"content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]},
        ),
        (["agent_message", "s", None, "#2"], {"content": [{"type": "text", "text": "Bye"}]}),
    ]


def test_show_entity_filter_takes_the_message_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(record(tmp_path, TWO_TURNS))
    assert show.main(["--state", "--entity", "agent_message:#2", path]) == 0
    state = json.loads(capsys.readouterr().out)
    assert [e["entity"] for e in state["entities"]] == [["agent_message", "s", None, "#2"]]


def test_the_response_alone_ends_the_turn_and_sessions_and_kinds_count_apart() -> None:
    turns = MessageTurns()
    model = ClientModel(1, turns)
    for direction, message in [
        (A, chunk("a", "s")),
        (A, chunk("x", "t")),
        (A, chunk("think", "s", "agent_thought_chunk")),
        (C, prompt(7, "s")),
        (A, chunk("b", "s")),
        (A, done(7)),  # the end of the turn: the next chunk starts a message
        (A, chunk("c", "s")),
        (A, chunk("y", "t")),  # another session's turn did not end
        (A, done(7)),  # no prompt waits for it: not a boundary
        (A, chunk("d", "s")),
    ]:
        turns.see(direction, message)
        if direction == A:
            model.apply(message)
    texts = {
        key: [c["text"] for c in value["fields"]["content"]]
        for key, value in model.snapshot()["entities"].items()
    }
    assert texts == {
        ("agent_message", "s", None, "#1"): ["a"],
        ("agent_message", "t", None, "#1"): ["x", "y"],
        ("agent_thought", "s", None, "#1"): ["think"],
        ("agent_message", "s", None, "#2"): ["b"],
        ("agent_message", "s", None, "#3"): ["c", "d"],
    }


def test_chunks_with_an_id_keep_their_id() -> None:
    turns = MessageTurns()
    assert turns.key(("agent_message", "s", "m1")) == ("agent_message", "s", "m1")
    assert turns.key(("session_plan", "s")) == ("session_plan", "s")


def test_the_live_view_shows_one_v1_message_per_turn() -> None:
    view = EntityView()
    view.feed({"event": "version", "protocolVersion": 1})
    for seq, (direction, message) in enumerate(TWO_TURNS, start=1):
        event = json.loads(frame_line(0.1 * seq, direction, json.dumps(message).encode(), R))
        view.feed({**event, "seq": seq})
    entities: Any = view.snapshot()["entities"]
    assert [(e["kind"], e["id"], e["first_seq"], e["fields"]) for e in entities] == [
        (
            "agent_message",
            "#1",
            2,
            {"content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]},
        ),
        ("agent_message", "#2", 6, {"content": [{"type": "text", "text": "Bye"}]}),
    ]
