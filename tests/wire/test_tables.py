"""Tests for acp_proxy.wire.connection.tables and connstate: the request tables and the state an
engine is given, used alone, without a ``Connection`` (the seam the engines see)."""

# ruff: noqa: E501 - wire bytes read best on one line each

from __future__ import annotations

import pytest

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.wire.chain import Chain, Direction
from acp_proxy.wire.connection.connstate import ConnState
from acp_proxy.wire.connection.tables import Requests, negotiated_version
from acp_proxy.wire.notes import Note, PendingFull, UnusualVersion, VersionNegotiated

A2C = Direction.AGENT_TO_CLIENT
C2A = Direction.CLIENT_TO_AGENT


def tables(max_pending: int = 8) -> tuple[ConnState, Requests]:
    state = ConnState(
        Chain([]), inspect_all=False, observe=False, watching=False, max_parse=1 << 20
    )
    return state, Requests(state, max_pending)


def req(rid: JsonValue, method: str) -> JsonObject:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": {}}


def initialized(version: JsonValue) -> JsonObject:
    return {
        "jsonrpc": "2.0",
        "id": 0,
        "result": {"protocolVersion": version, "agentCapabilities": {}},
    }


def test_a_request_is_admitted_and_its_response_takes_it_out() -> None:
    _, requests = tables()
    notes: list[Note] = []
    requests.track(
        C2A,
        req("p-1", "session/prompt"),
        notes,
        b'{"jsonrpc":"2.0","id":"p-1","method":"session/prompt","params":{}}',
    )
    requests.track(A2C, req(7, "session/request_permission"), notes, None)
    assert (requests.tracker.waiting(C2A), requests.tracker.waiting(A2C)) == (1, 1)
    requests.track(
        A2C, {"jsonrpc": "2.0", "id": "p-1", "result": {"stopReason": "end_turn"}}, notes, None
    )
    requests.track(
        C2A,
        {"jsonrpc": "2.0", "id": 7, "result": {"outcome": {"outcome": "cancelled"}}},
        notes,
        None,
    )
    assert (requests.tracker.waiting(C2A), requests.tracker.waiting(A2C)) == (0, 0)
    assert notes == []
    # A notification, and an id no request has, change nothing.
    requests.track(A2C, {"jsonrpc": "2.0", "method": "session/update", "params": {}}, notes, None)
    requests.track(A2C, {"jsonrpc": "2.0", "id": 99, "result": {}}, notes, None)
    assert (requests.tracker.waiting(C2A), requests.tracker.waiting(A2C)) == (0, 0)


def test_a_full_table_refuses_with_the_id_as_written_and_counts_it() -> None:
    state, requests = tables(max_pending=1)
    raw = b'{"jsonrpc":"2.0","id":"a","method":"session/prompt","params":{}}'
    assert requests.refuse_if_full(C2A, raw, req("a", "session/prompt")) is None
    requests.track(C2A, req("a", "session/prompt"), [], raw)
    second = b'{"jsonrpc":"2.0","id":1.50,"method":"session/prompt","params":{}}'
    refused = requests.refuse_if_full(C2A, second, req(1.5, "session/prompt"))
    assert refused is not None
    assert (
        refused.raw
        == b'{"jsonrpc":"2.0","id":1.50,"error":{"code":-32603,"message":"acp-proxy: too many requests awaiting an answer (limit 1); not forwarded"}}'
    )
    assert (state.stats.pending_refused, state.stats.replies, state.stats.errors_replied) == (
        1,
        1,
        1,
    )
    assert requests.full_note(C2A, req(1.5, "session/prompt")) == PendingFull(
        C2A, "session/prompt", 1
    )
    # The other direction has a table of its own.
    assert requests.refuse_if_full(A2C, second, req(1.5, "fs/read_text_file")) is None


def test_the_initialize_response_sets_the_version_on_the_state() -> None:
    state, requests = tables()
    notes: list[Note] = []
    requests.track(C2A, req(0, "initialize"), notes, None)
    assert requests.watched == {0: "initialize"}
    assert state.version is None
    requests.track(A2C, initialized(2), notes, None)
    assert notes == [VersionNegotiated(2)]
    assert state.version == 2
    contexts = (state.ctx_a2c, state.ctx_c2a, state.bctx_a2c, state.bctx_c2a)
    assert [c.protocol_version for c in contexts] == [2, 2, 2, 2]
    assert [(c.direction, c.in_batch) for c in contexts] == [
        (A2C, False),
        (C2A, False),
        (A2C, True),
        (C2A, True),
    ]
    assert state.chain_on is False  # no links: nothing runs, whatever the version
    # A second initialize is answered, and the session keeps the version negotiated first.
    notes.clear()
    requests.track(C2A, req(0, "initialize"), notes, None)
    requests.track(A2C, initialized(1), notes, None)
    assert state.version == 2
    assert notes == [
        UnusualVersion(
            "1", "a second initialize answered: the session keeps version 2, negotiated first"
        )
    ]


@pytest.mark.parametrize(
    ("version", "negotiated", "note"),
    [
        (1, 1, None),
        (2, 2, None),
        (2.0, 2, UnusualVersion("2.0", "treated as 2")),
        (
            "2",
            None,
            UnusualVersion(
                '"2"', "not a positive integer: no rule runs on this session, frames pass untouched"
            ),
        ),
        (
            0,
            None,
            UnusualVersion(
                "0", "not a positive integer: no rule runs on this session, frames pass untouched"
            ),
        ),
        (
            True,
            None,
            UnusualVersion(
                "true",
                "not a positive integer: no rule runs on this session, frames pass untouched",
            ),
        ),
        (
            2.5,
            None,
            UnusualVersion(
                "2.5", "not a positive integer: no rule runs on this session, frames pass untouched"
            ),
        ),
    ],
)
def test_negotiated_version(version: JsonValue, negotiated: int | None, note: Note | None) -> None:
    notes: list[Note] = []
    assert negotiated_version(initialized(version), notes) == negotiated
    assert notes == ([] if note is None else [note])


def test_an_error_response_negotiates_nothing() -> None:
    notes: list[Note] = []
    error = {"jsonrpc": "2.0", "id": 0, "error": {"code": -32603, "message": "no"}}
    assert negotiated_version(error, notes) is None  # type: ignore[arg-type]
    assert notes == []
