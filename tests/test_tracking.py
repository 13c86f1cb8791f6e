"""Tests for acp_proxy.wire.tracking: the bounded tables of requests awaiting an answer."""

from __future__ import annotations

from acp_proxy.wire.chain import Direction
from acp_proxy.wire.errors import error_bytes
from acp_proxy.wire.tracking import (
    ABORT_CHUNK,
    MAX_PENDING_ID_BYTES,
    RequestTracker,
)

C2A = Direction.CLIENT_TO_AGENT
A2C = Direction.AGENT_TO_CLIENT


def test_admit_answer_and_the_count_bound() -> None:
    t = RequestTracker(max_pending=2)
    assert t.admit(C2A, 1, "session/prompt", b"1")
    assert t.admit(C2A, "a", "session/new", b'"a"')
    assert t.full(C2A) and t.room(C2A) == 0
    assert not t.admit(C2A, 3, "x", b"3")  # refused, not tracked
    assert not t.admit(C2A, 1, "again", b"1")  # a reused id needs room too (it waits behind)
    assert t.room(A2C) == 2  # the other direction has its own table
    assert t.answer(C2A, 1) == ("session/prompt", b"1")
    assert t.answer(C2A, 1) is None
    assert t.waiting(C2A) == 1 and t.knows(C2A, "a") and not t.knows(A2C, "a")


def test_the_id_bytes_bound() -> None:
    t = RequestTracker(max_pending=10)
    big = b'"' + b"x" * (MAX_PENDING_ID_BYTES - 2) + b'"'
    assert t.admit(A2C, "big", "session/request_permission", big)
    assert not t.admit(C2A, 1, "x", b"1")  # both tables share the byte bound
    assert t.full(C2A) and t.room(C2A) == 0
    t.answer(A2C, "big")
    assert t.admit(C2A, 1, "x", b"1")


def test_abort_detaches_at_once_and_builds_lazily_with_the_ids_bytes() -> None:
    t = RequestTracker(max_pending=5000)
    for i in range(ABORT_CHUNK + 3):
        t.admit(C2A, i, "m", b"%d" % i)
    t.admit(C2A, 2**64, "m", b"18446744073709551616")
    chunks = t.abort(C2A, "gone")
    assert t.waiting(C2A) == 0  # forgotten before anything is built
    sizes = [(len(frames), n) for frames, n in chunks]
    assert sizes == [(ABORT_CHUNK, ABORT_CHUNK), (4, 4)]
    [(last, _)] = list(t.abort(C2A, "x")) or [((b"",), 0)]
    assert last == (b"",)  # nothing left to abort


def test_error_bytes_echo_the_id_exactly() -> None:
    assert error_bytes(b"1E2", -32603, 'a "b"') == (
        b'{"jsonrpc":"2.0","id":1E2,"error":{"code":-32603,"message":"a \\"b\\""}}'
    )
