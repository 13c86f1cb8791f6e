"""``wire.attach.Ledger``: what a held agent remembers across client connections (pure)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from acp_proxy.wire.attach import Ledger, initialize_request, reattach_request


def req(rid: object, method: str, params: object = None) -> bytes:
    message: dict[str, object] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        message["params"] = params
    return orjson.dumps(message)


def ok(rid: object, result: object) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result})


def note(i: int) -> bytes:
    return orjson.dumps(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": "s",
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": f"n{i}", "_meta": {"id": i}},
                },
            },
        }
    )


PROMPT = req(3, "session/prompt", {"sessionId": "s", "prompt": []})


def opened() -> Ledger:
    ledger = Ledger(max_bytes=1 << 20, max_frames=100)
    assert ledger.from_client(req(0, "initialize", {"protocolVersion": 1})) is not None
    init = {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}
    assert ledger.to_client(ok(0, init)) == ok(0, init)
    ledger.from_client(req(1, "session/new", {"cwd": "/", "mcpServers": []}))
    assert ledger.to_client(ok(1, {"sessionId": "s"})) == ok(1, {"sessionId": "s"})
    return ledger


def test_it_learns_the_initialize_answer_and_the_sessions() -> None:
    ledger = opened()
    assert ledger.init_result == {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}
    assert ledger.load_session is True
    assert ledger.sessions == {"s"}


@given(
    count=st.integers(0, 12),
    cut=st.data(),
)
def test_every_frame_reaches_a_client_exactly_once_and_the_turn_ends_on_the_load(
    count: int, cut: st.DataObject
) -> None:
    # The agent sends ``count`` notifications, then the prompt's answer; the client detaches
    # after ``detach`` of them and a new one reattaches after ``back``: what the old client got,
    # the replay and what came live are every notification once, in order, and the turn's end
    # reaches the new client on the id it reattached with.
    detach = cut.draw(st.integers(0, count))
    back = cut.draw(st.integers(detach, count + 1))
    ledger = opened()
    assert ledger.from_client(PROMPT) == PROMPT
    frames = [note(i) for i in range(count)] + [ok(3, {"stopReason": "end_turn"})]
    old: list[bytes] = []
    new: list[bytes] = []
    for i, frame in enumerate(frames):
        if i == detach:
            ledger.detach()
        if i == back:
            replay = ledger.reattach("load", "session/load", "s")
            new += replay.frames
        out = ledger.to_client(frame)
        if out is not None:
            (old if i < detach else new).append(out)
    if back == len(frames):
        replay = ledger.reattach("load", "session/load", "s")
        new += replay.frames
    answers = [ok(3, {"stopReason": "end_turn"}), ok("load", {"stopReason": "end_turn"})]
    if detach == len(frames):  # the turn ended before the drop: the load is answered {}
        assert old == frames
        assert new == [ok("load", {})]
    else:
        assert old == frames[:detach]
        assert new == frames[detach:-1] + answers[1:]
    assert answers[0] not in new


def test_agent_requests_the_old_client_left_open_are_sent_again_first() -> None:
    ledger = opened()
    ledger.from_client(PROMPT)
    ask = req("perm-1", "session/request_permission", {"sessionId": "s"})
    assert ledger.to_client(ask) == ask
    ledger.detach()
    assert ledger.to_client(note(1)) is None
    replay = ledger.reattach(9, "session/load", "s")
    assert replay.frames == [ask, note(1)]
    assert (replay.redelivered, replay.buffered, replay.answered) == (1, 1, False)
    # Answered by the new client: not sent again at the next reattach.
    ledger.from_client(ok("perm-1", {"outcome": {"outcome": "cancelled"}}))
    ledger.detach()
    assert ledger.reattach(10, "session/load", "s").redelivered == 0


def test_a_new_clients_id_still_in_flight_from_the_old_one_goes_under_a_proxy_id() -> None:
    ledger = opened()
    ledger.from_client(PROMPT)  # id 3, in flight
    ledger.detach()
    ledger.reattach(1, "session/load", "s")
    sent = ledger.from_client(req(3, "session/set_mode", {"sessionId": "s"}))
    proxy_id = orjson.loads(sent)["id"]
    assert proxy_id == "acp-proxy/reattach/2/1"
    # The old prompt's answer goes to the load; the new request's to its own id.
    assert ledger.to_client(ok(proxy_id, {})) == ok(3, {})
    assert ledger.to_client(ok(3, {"stopReason": "end_turn"})) == ok(1, {"stopReason": "end_turn"})


def test_past_the_bound_the_buffer_is_dropped_and_counted() -> None:
    ledger = opened()
    ledger.max_frames = 2
    ledger.detach()
    for i in range(5):
        assert ledger.to_client(note(i)) is None
    assert ledger.overflowed
    assert (ledger.lost, len(ledger.buffer), ledger.buffered_bytes) == (5, 0, 0)


def test_grace_over_answers_the_agent_for_the_client() -> None:
    ledger = opened()
    ledger.to_client(req("p", "session/request_permission", {"sessionId": "s"}))
    ledger.to_client(req(7, "fs/read_text_file", {"sessionId": "s", "path": "/x"}))
    ledger.detach()
    assert ledger.expire() == [
        ok("p", {"outcome": {"outcome": "cancelled"}}),
        orjson.dumps(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "error": {
                    "code": -32603,
                    "message": "acp-proxy: the client detached and did not come back",
                },
            }
        ),
    ]


def test_answers_to_the_old_connections_other_requests_are_dropped() -> None:
    ledger = opened()
    ledger.from_client(req(5, "session/set_mode", {"sessionId": "s"}))
    ledger.detach()
    assert ledger.to_client(ok(5, {})) is None
    assert ledger.dropped == 1
    assert ledger.reattach(1, "session/load", "s").frames == [ok(1, {})]


def test_the_opening_requests_are_recognised() -> None:
    assert initialize_request(req(0, "initialize", {"protocolVersion": 2})) == (0, 2)
    assert initialize_request(req(0, "session/new")) is None
    assert reattach_request(req(1, "session/load", {"sessionId": "s"})) == (
        1,
        "session/load",
        "s",
    )
    assert reattach_request(req(1, "session/resume", {"sessionId": "s"})) == (
        1,
        "session/resume",
        "s",
    )
    assert reattach_request(req(1, "session/load", {})) is None


def test_a_prompt_answer_the_socket_lost_goes_to_the_next_load() -> None:
    ledger = opened()
    ledger.from_client(PROMPT)
    out = ledger.to_client(ok(3, {"stopReason": "end_turn"}))
    assert out == ok(3, {"stopReason": "end_turn"})
    ledger.detach()  # the write of ``out`` failed: the connection was gone
    assert out is not None
    ledger.requeue(out)
    assert ledger.reattach(8, "session/load", "s").frames == [ok(8, {"stopReason": "end_turn"})]


def test_a_turn_that_outlives_two_clients_ends_on_the_last_load() -> None:
    ledger = opened()
    ledger.from_client(PROMPT)
    ledger.detach()
    assert ledger.reattach(8, "session/load", "s").answered is False
    ledger.detach()  # the second client leaves before the turn ends
    assert ledger.to_client(ok(3, {"stopReason": "end_turn"})) is None
    assert ledger.reattach(9, "session/load", "s").frames == [ok(9, {"stopReason": "end_turn"})]


def test_a_v2_resume_reattaches_like_a_load() -> None:
    ledger = opened()
    ledger.detach()
    ledger.to_client(note(1))
    replay = ledger.reattach("r", "session/resume", "s")
    assert replay.frames == [note(1), ok("r", {})]
    assert (replay.buffered, replay.answered) == (1, True)
