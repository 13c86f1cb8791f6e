"""The write gate's rules (``acp_proxy.wire.coalesce.gate``), as synchronous tables: looks at
given times, unread bytes and bytes sent, and what the gate answers to each."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.wire.coalesce.gate import (
    GATE_IDLE_MAX_S,
    GATE_MAX_S,
    GATE_MIN_S,
    GATE_PAUSED_S,
    GATE_UNREAD,
    STARVED_UNREAD,
    GateLook,
    WriteGate,
)
from acp_proxy.wire.coalesce.pace import RATE_WINDOW_S

U = GATE_UNREAD
W = RATE_WINDOW_S
D = U // 2 + 2 - STARVED_UNREAD  # what the peer of the "drained" table reads

# Each step: (now, unread, sent) -> (the look, the wait while the queue merges).
Step = tuple[tuple[float, int, int], tuple[GateLook, float | None]]

TABLES: dict[str, list[Step]] = {
    # A peer that reads nothing: the wait doubles from GATE_MIN_S to GATE_IDLE_MAX_S; it is
    # behind from the first look (more than half of GATE_UNREAD unread, never drained).
    "idle backoff": [
        ((0.000, 2 * U, 0), (GateLook(0, 0.0, None, True), GATE_MIN_S)),
        ((0.001, 2 * U, 0), (GateLook(0, 0.0, None, True), 2 * GATE_MIN_S)),
        ((0.002, 2 * U, 0), (GateLook(0, 0.0, None, True), 4 * GATE_MIN_S)),
        ((0.003, 2 * U, 0), (GateLook(0, 0.0, None, True), 8 * GATE_MIN_S)),
        ((0.004, 2 * U, 0), (GateLook(0, 0.0, None, True), GATE_IDLE_MAX_S)),
        # A rate window passed: the window closes with nothing read.
        ((0.005, 2 * U, 0), (GateLook(0, 0.0, (0, 0.005), True), GATE_IDLE_MAX_S)),
        # It reads 10,000 bytes: its pace (over the new window) sets the wait.
        (
            (0.006, 2 * U - 10_000, 0),
            (GateLook(10_000, 10_000 / 0.001, None, True), (U - 10_000) / (10_000 / 0.001)),
        ),
    ],
    # A fast reader: within the bound, write now; the pace is measured all the same.
    "within the bound": [
        ((0.0, U, 0), (GateLook(0, 0.0, None, True), None)),
        (
            (0.010, U // 2, 4096),
            (GateLook(U // 2 + 4096, (U // 2 + 4096) / 0.010, (U // 2 + 4096, 0.010), None), None),
        ),
    ],
    # It read nearly everything: it waits for the proxy (no merging); behind again only after
    # a rate window with more than half of GATE_UNREAD unread.
    "drained": [
        ((0.000, U // 2 + 1, 0), (GateLook(0, 0.0, None, True), None)),
        # It read all but STARVED_UNREAD - 1: drained (pace over the open window).
        ((0.001, STARVED_UNREAD - 1, 0), (GateLook(D, D / 0.001, None, False), None)),
        # Given D more, it reads none of it: more than half unread, but for less than a rate
        # window since it drained: no word.
        ((0.002, U // 2 + 1, D), (GateLook(0, D / 0.002, None, None), None)),
        # A rate window after it drained: behind.
        ((0.0015 + W, U // 2 + 1, D), (GateLook(0, D / (0.0015 + W), (D, 0.0015 + W), True), None)),
    ],
    # A look long after the last, with little unread: the pace starts afresh, but what the
    # peer read meanwhile still says it drained (a paused peer that resumed is fed at once).
    "stale look": [
        ((0.0, 8 * U, 0), (GateLook(0, 0.0, None, True), GATE_MIN_S)),
        ((0.1, 8 * U, 0), (GateLook(0, 0.0, (0, 0.1), True), 2 * GATE_MIN_S)),
        ((3.0, 0, 0), (GateLook(8 * U, 0.0, None, False), None)),
    ],
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_the_gate_answers_each_look_as_its_rules_say(name: str) -> None:
    gate = WriteGate()
    for (now, unread, sent), (look, wait) in TABLES[name]:
        got = gate.look(now, unread, sent)
        assert (got.read, got.peer_waits) == (look.read, look.peer_waits), (name, now)
        assert got.rate == pytest.approx(look.rate), (name, now)
        assert (got.consumed is None) == (look.consumed is None), (name, now)
        if got.consumed is not None and look.consumed is not None:
            assert got.consumed == pytest.approx(look.consumed), (name, now)
        expected = None if wait is None else pytest.approx(wait)
        assert gate.wait(unread, got.rate, merging=True) == expected, (name, now)
        assert gate.wait(unread, got.rate, merging=False) is None


def test_paused_after_reading_nothing_for_the_paused_time() -> None:
    gate = WriteGate()
    gate.look(0.0, 2 * U, 0)
    assert not gate.paused(0.0)
    gate.look(0.01, 2 * U, 0)  # read nothing since the look at 0.0
    assert not gate.paused(GATE_PAUSED_S - 0.001)
    assert gate.paused(GATE_PAUSED_S)
    assert gate.paused(0.05, paused_s=0.05)
    gate.look(0.2, 2 * U - 1, 0)  # it read a byte
    assert not gate.paused(10.0)


looks = st.lists(
    st.tuples(st.floats(0.0, 0.05), st.integers(0, 4 * U), st.integers(0, U)), max_size=40
)


@settings(max_examples=200, deadline=None)
@given(looks, st.booleans())
def test_the_gate_s_answers_stay_within_their_bounds(
    steps: list[tuple[float, int, int]], merging: bool
) -> None:
    """Whatever the peer does: a wait is None or within GATE_MIN_S .. GATE_MAX_S, None within
    the unread bound; what it read is never negative; "drained" only after it read."""
    gate = WriteGate()
    now = 0.0
    sent = 0
    for dt, unread, wrote in steps:
        now += dt
        sent += wrote
        look = gate.look(now, unread, sent)
        assert look.read >= 0 and look.rate >= 0.0
        if look.peer_waits is False:
            assert look.read > 0 and unread < STARVED_UNREAD
        wait = gate.wait(unread, look.rate, merging)
        if unread <= U or not merging:
            assert wait is None
        else:
            assert wait is not None and GATE_MIN_S <= wait <= GATE_MAX_S
