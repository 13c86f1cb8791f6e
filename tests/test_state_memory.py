"""``show --state`` holds 8 bytes per chunk and per event, whatever their text: the references
are kept packed in arrays (``record.chunkrefs.RefList``), not as objects, and an event (a notice,
an unknown kind, kept whole by the client) stays in the file like a chunk's text.

Measured with ``tracemalloc`` in process (exact, no timing), and end to end under an address
space cap smaller than the events' text."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_record_read import INIT, WRITE_OK, A, capped, client_lines, frame, session

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.record.chunkrefs import ChunkRef
from acp_proxy.record.transcript import Transcript

PER_REFERENCE = 10  # bytes of memory per chunk or event: 8, and the arrays' spare room


def _update(update: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": "s", "update": update},
    }


def _chunk(i: int) -> dict[str, Any]:
    content = {"type": "text", "text": f"word {i} "}
    return _update({"sessionUpdate": "agent_message_chunk", "messageId": "m", "content": content})


def _event(i: int, size: int = 200) -> dict[str, Any]:
    return _update({"sessionUpdate": "_vendor_progress", "n": i, "text": "z" * size})


def _grown_per_message(messages: list[dict[str, Any]]) -> float:
    """Bytes the transcript's state grew by per message fed (each a line of its own, at a
    known offset), over the second half of ``messages`` (the first made the state's tables)."""
    lines: list[dict[str, JsonValue]] = [
        {"t": 0.5, "dir": A, "raw": orjson.dumps(m).decode()} for m in messages
    ]
    half = len(lines) // 2
    transcript = Transcript(version=2)
    tracemalloc.start()
    try:
        for i, line in enumerate(lines[:half]):
            transcript.feed(line, 1000 * i)
        before = tracemalloc.get_traced_memory()[0]
        for i, line in enumerate(lines[half:], half):
            transcript.feed(line, 1000 * i)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert transcript.final_state()["entities"] or transcript.final_state()["events"]
    return grown / (len(lines) - half)


def test_a_chunk_costs_8_bytes_of_state() -> None:
    assert _grown_per_message([_chunk(i) for i in range(2_000)]) < PER_REFERENCE


def test_an_event_costs_8_bytes_of_state_whatever_its_text() -> None:
    assert _grown_per_message([_event(i) for i in range(2_000)]) < PER_REFERENCE


_values = st.one_of(
    st.integers(0, (1 << 40) - 1).map(lambda o: ChunkRef.at((o, o % 3, o % 5))),
    st.text(max_size=3),
    st.none(),
    st.lists(st.integers(), max_size=2),
)


@given(st.lists(_values, max_size=30), st.lists(_values, max_size=5))
def test_a_ref_list_is_the_list_of_what_was_appended(appended: list[Any], base: list[Any]) -> None:
    from acp_proxy.record.chunkrefs import RefList

    refs = RefList.of(base, appended[0]) if appended else RefList(base)
    for value in appended[1:]:
        refs.append(value)
    plain = [*base, *appended]
    assert list(refs) == plain and refs == plain and len(refs) == len(plain)
    assert bool(refs) is bool(plain)
    assert json.loads(json.dumps(refs, default=lambda r: r.hex())) == json.loads(
        json.dumps(plain, default=lambda r: r.hex())
    )
    # An encoder that reads a list subclass's own storage fails, never writes it empty.
    with pytest.raises(TypeError):
        orjson.dumps(refs)


def test_an_event_list_keeps_a_reference_only_while_a_place_is_set() -> None:
    from acp_proxy.record.chunkrefs import EventList, EventRef

    events = EventList()
    events.append({"a": 1})
    events.place = (123, 1, 2)
    events.append({"b": 2})
    events.place = (1 << 50, 0, 0)  # past what a reference can say: kept as it is
    events.append({"c": 3})
    first, second, third = events
    assert first == {"a": 1} and third == {"c": 3}
    assert type(second) is EventRef and second.where == (123, 1, 2)


def test_state_of_events_bigger_than_the_address_space_reads_them_back(tmp_path: Path) -> None:
    # 500 unknown-kind updates of 64 KiB (32 MiB of text) in a process that may map 40 MiB:
    # kept as parsed values they do not fit; each is 8 bytes of state and read back as the
    # state is printed.
    n, size = 500, 64 * 1024
    record = tmp_path / "events.jsonl"
    with record.open("wb") as f:
        f.write(session(end=False))
        for i in range(n):
            f.write(frame(0.5, A, _event(i, size)))
    stdin = tmp_path / "client.jsonl"
    stdin.write_bytes(client_lines(INIT, WRITE_OK))
    done = capped(40, stdin, "show", "--state", str(record))
    assert (done.returncode, done.stderr) == (0, b"")
    events = json.loads(done.stdout)["events"]
    assert events == [
        {"sessionId": "s", "update": _event(i, size)["params"]["update"]} for i in range(n)
    ]


def test_a_state_that_does_not_fit_stops_with_a_clear_message(tmp_path: Path) -> None:
    # 3,000 tool calls whose latest fields hold 16 KiB each (the client keeps them all), in a
    # process that may map 40 MiB: no line is reported unreadable for want of memory and no
    # partial state is printed as if it were the client's.
    record = tmp_path / "entities.jsonl"
    with record.open("wb") as f:
        f.write(session(end=False))
        for i in range(3_000):
            update = {
                "sessionUpdate": "tool_call_update",
                "toolCallId": f"t{i}",
                "status": "completed",
                "rawOutput": {"text": "y" * 16384},
            }
            f.write(frame(0.5, A, _update(update)))
    stdin = tmp_path / "client.jsonl"
    stdin.write_bytes(client_lines(INIT, WRITE_OK))
    done = capped(40, stdin, "show", "--state", str(record))
    assert (done.returncode, done.stdout) == (1, b"")
    assert (
        done.stderr
        == (
            f"acp-proxy show: {record}: out of memory; stopped (--state holds 8 bytes per chunk "
            "and per event, the latest fields of each entity, and one line of the record at a "
            "time)\n"
        ).encode()
    )
