"""The live view's memory bound, counted deterministically (tracemalloc), not timed.

A session far faster than the view (the hub drains one slice now and then) taps a 5 MiB frame
and 6,000 small updates; what the hub allocates on top of the frames the session holds
anyway stays within its stated bound (``bound_bytes``) plus what one slice's work allocates for
a moment, and every frame tapped is either published or counted as lost, in its place.
"""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import orjson
import pytest

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.shell import ui_hub
from acp_proxy.shell.ui_hub import HubLimits, UiHub
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.notes import Observed

KIB = 1024
MIB = 1024 * KIB
SLICE_ALLOCATES = 8 * MIB  # one slice's events, a shown frame's copies, while it is built


def _update(i: int) -> bytes:
    if i % 2:
        update = {
            "sessionUpdate": "tool_call_update",
            "toolCallId": f"call_{i % 3000}",
            "title": "t" * 40,
            "_meta": {f"k{j}": "v" * 20 for j in range(4)},
        }
    else:
        content = {"type": "text", "text": f"chunk {i} " + "w" * 60}
        update = {"sessionUpdate": "agent_message_chunk", "content": content}
    params = {"sessionId": "s", "update": update}
    return orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params})


class _Session:
    config = SimpleNamespace(source=None, rule_names=(), middleware=())


def test_the_hub_holds_no_more_than_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ui_hub, "INGEST_BYTES", 128 * KIB)
    monkeypatch.setattr(ui_hub, "VIEWS_BYTES", 512 * KIB, raising=False)
    hub = UiHub(mode="live", limits=HubLimits(history_bytes=MIB))
    session = _Session()
    tap = hub.session_observer(session)
    text = b"x" * (5 * MIB)
    big = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
    big += b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"'
    big += text + b'"}}}}'
    frames = [big] + [_update(i) for i in range(6_000)]  # what the session holds anyway
    notes = [Observed(Direction.AGENT_TO_CLIENT, f, None, (), (), "message") for f in frames]
    published = {"frames": 0, "lost": 0, "lost_events": 0}
    publish = hub.publish
    first: dict[str, object] = {}

    def counting(event: JsonObject) -> None:
        if "dir" in event:
            if not published["frames"]:
                first.update(event)
            published["frames"] += 1
        elif event.get("event") == "lost":
            frames = event["frames"]
            assert isinstance(frames, int)
            published["lost"] += frames
            published["lost_events"] += 1
        publish(event)

    monkeypatch.setattr(hub, "publish", counting)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for start in range(0, len(notes), 500):
            tap.on_notes(tuple(notes[start : start + 500]), tap.start + start / 1000)
            hub.drain(ui_hub.DRAIN_SLICE)  # the view falls behind: the queue fills, drops
        while hub.drain(ui_hub.DRAIN_SLICE):
            pass
        held = tracemalloc.get_traced_memory()[0] - base
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    bound = hub.bound_bytes()
    assert bound == MIB + 128 * KIB + 512 * KIB
    assert hub.held_bytes() <= bound
    assert held <= bound + MIB  # (the builder's and joiner's own small state)
    assert peak <= bound + SLICE_ALLOCATES
    # Every frame was published or counted lost, in its session, where it was dropped (one
    # event for each run of drops).
    assert hub.ingest_lost > 0
    assert published["frames"] + published["lost"] == len(frames)
    assert published["lost"] == hub.ingest_lost
    assert published["lost_events"] < len(notes) // 500 * 2
    # The big frame's first bytes are shown, and how much of it was left out.
    assert first["truncated"] == len(big) - ui_hub.FRAME_SHOWN
    assert first["raw"] == big[: ui_hub.FRAME_SHOWN].decode()
