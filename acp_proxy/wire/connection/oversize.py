"""Oversize frames: what a frame over the size limit (``framing.Oversize``) becomes.

Contract: the frame itself is never forwarded (only its head was kept). A request whose id can
be read from the head is answered with a -32600 error to its sender; a response whose id answers
a tracked request is replaced by a -32603 error toward its receiver, so no request hangs; the
rest is only reported (an ``OversizeFrame`` note). Pure, no I/O.
"""

from __future__ import annotations

from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.connstate import ConnState
from acp_proxy.wire.connection.tables import Requests
from acp_proxy.wire.errors import INTERNAL_ERROR, INVALID_REQUEST, error_bytes, error_object
from acp_proxy.wire.framing import (
    HEAD_BYTES,
    Oversize,
    read_request_id,
    read_response_id,
    scan_head,
)
from acp_proxy.wire.notes import OversizeFrame, Result

_A2C = Direction.AGENT_TO_CLIENT


def oversize(state: ConnState, requests: Requests, direction: Direction, event: Oversize) -> Result:
    """The result of an oversize frame read from the side ``direction`` starts at."""
    stats = state.stats
    stats.oversize += 1
    if direction is _A2C:
        stats.agent_to_client_in += 1
    else:
        stats.client_to_agent_in += 1
    limit = f"the {event.limit}-byte limit" if event.limit else "the frame size limit"
    head = event.head[:HEAD_BYTES]
    is_request, rid = read_request_id(head)
    if is_request:
        # The sender would otherwise wait forever for an answer that cannot come.
        text = f"acp-proxy: message of {event.size} bytes exceeds {limit}; not forwarded"
        response = error_object(rid, INVALID_REQUEST, text)
        id_bytes = scan_head(head).id_bytes
        data = error_bytes(id_bytes, INVALID_REQUEST, text)
        stats.replies += 1
        stats.errors_replied += 1
        note = OversizeFrame(event.size, rid, replied=True, limit=event.limit)
        return Result((), (OutFrame(data, response, state.version),), (note,))
    is_response, rid = read_response_id(head)
    # The sender of a response is the receiver of its request: the request's sender is on the
    # other side, and it only gets an error if we know it is waiting for this id.
    entry = requests.answered(direction, rid) if is_response else None
    if entry is not None:
        id_bytes = entry[1]
        text = f"acp-proxy: the response was {event.size} bytes, over {limit}; dropped"
        response = error_object(rid, INTERNAL_ERROR, text)
        stats.errors_replied += 1
        state.count_out(direction, 1)
        note = OversizeFrame(event.size, rid, answered=True, limit=event.limit)
        frame = OutFrame(error_bytes(id_bytes, INTERNAL_ERROR, text), response, state.version)
        return Result((frame,), (), (note,))
    return Result((), (), (OversizeFrame(event.size, None, limit=event.limit),))
