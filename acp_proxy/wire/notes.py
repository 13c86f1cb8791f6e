"""What the pipeline reports: the notes the shell logs, the result of one frame, the counters.

Contract: frozen values only (style.md habit 3), built by the connection
(``acp_proxy.wire.connection.pipeline``) and the engines it calls, and read by the shell (logging,
the exit
summary, recording, metrics, tracing). No behaviour, no I/O.
"""

from __future__ import annotations

from typing import TypeAlias

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.base.values import field_names, value
from acp_proxy.wire.chain import Direction, MiddlewareFailure
from acp_proxy.wire.coalesce.queue import OutFrame


@value
class VersionNegotiated:
    """The ``initialize`` response fixed the connection's protocol version."""

    version: int


@value
class NonJson:
    """An agent stdout line that is not a JSON-RPC message (or an escape prefix before one)."""

    kind: str  # KIND_ANSI or KIND_TEXT
    size: int  # bytes of the diverted (or forwarded) part
    sample: bytes  # its first SAMPLE_BYTES bytes
    first_of_kind: bool  # the first line of this kind on this connection: warn; later ones: count
    forwarded: bool = False  # NonJsonPolicy.FORWARD: it was forwarded, not diverted


@value
class OversizeFrame:
    """A frame over the size limit was discarded."""

    size: int
    request_id: JsonValue  # the id of the request (or of the answered request); None if unknown
    replied: bool = False  # the sender got a JSON-RPC error for ``request_id``
    answered: bool = False  # it was a response: the receiver got an error for ``request_id``
    limit: int = 0


@value
class MiddlewareFailed:
    """A middleware raised; the chain isolated it (fail-open or fail-closed)."""

    failure: MiddlewareFailure


@value
class Rewritten:
    """Middleware changed a message (``method`` is ``None`` for a response); with
    ``inspect_all`` only (it feeds debug logging; ``stats.rewritten`` always counts)."""

    method: str | None
    changed_by: tuple[str, ...]
    # Messages it became: more than one when the proxy inserted frames after it (the
    # follow-up of a v2 ``_meta: null`` clear, RFD Metadata Patches).
    count: int = 1


@value
class SkippedV1:
    """Entity rules matched a v1 update but ``v1.mode: safe`` did not apply them: the update
    carries no ``_meta`` object, and adding one would erase the agent's metadata (a v1 receiver
    replaces ``_meta`` whole). With ``inspect_all`` only (the debug log)."""

    method: str | None
    update_kind: str | None
    rules: tuple[str, ...]


@value
class Dropped:
    """A middleware dropped a message (or answered it with a ``Reply``)."""

    method: str | None
    dropped_by: str


@value
class FrameInfo:
    """Per-message debug information (only with ``inspect_all``); one per batch entry."""

    direction: Direction
    method: str | None
    id: JsonValue  # None also when the message has no id
    update_kind: str | None  # ``params.update.sessionUpdate`` of a ``session/update``
    size: int  # bytes of the frame it came in
    changed_by: tuple[str, ...]
    # A response: the method of the request it answers (None: no such request was waiting).
    answers: str | None = None
    # What the links marked the message with (``Outcome.marks``: the policy's decisions).
    marks: tuple[object, ...] = ()


@value
class Observed:
    """One input frame and what the proxy did with it (``observe=True`` only): what recording,
    metrics and tracing see. One per frame read, after its other notes.

    ``sent`` is ``None`` when the frame left exactly as it came; otherwise the frames written
    toward the other side instead, in order (``()``: dropped or diverted). ``replies`` are the
    frames the proxy wrote back to the sender because of it. ``messages`` describes each message
    of the frame (one for a single message, one per entry of a batch; none for a line that is
    not a message or was not parsed).
    """

    direction: Direction
    raw: bytes
    sent: tuple[bytes, ...] | None
    replies: tuple[bytes, ...]
    messages: tuple[FrameInfo, ...]
    kind: str  # "message", "batch", "non-json", "oversize", "unparsed"


@value
class Passed:
    """Frames forwarded exactly as they came (``watch=True`` only, see ``Connection``): one note
    for each run of them in a read, the cheapest report of the fast paths. ``parts`` are their
    bytes as read, each one frame or several joined with ``\\n`` (``count`` frames in all): what
    the core did not parse, a reader that wants to know what they are parses itself
    (``acp_proxy.wire.connection.observe.passed_kind``)."""

    direction: Direction
    parts: tuple[bytes, ...]
    count: int


@value
class NotParsed:
    """A frame something needed to parse was forwarded untouched instead (never dropped): it is
    over the parse budget, or neither parser can read it (``reason`` says which)."""

    direction: Direction
    size: int
    reason: str
    first_of_kind: bool  # the first such frame on this connection: warn; later ones: count


@value
class UnusualVersion:
    """The ``initialize`` response's ``protocolVersion`` is not a positive integer."""

    value: str  # its JSON text
    action: str  # what the proxy does about it


@value
class PendingFull:
    """A request was answered with an error instead of being forwarded: the table of requests
    awaiting an answer in its direction is full (``limit`` requests or their id bytes)."""

    direction: Direction
    method: str
    limit: int


Note: TypeAlias = (
    VersionNegotiated
    | NonJson
    | OversizeFrame
    | MiddlewareFailed
    | Rewritten
    | Dropped
    | FrameInfo
    | NotParsed
    | UnusualVersion
    | PendingFull
    | Observed
    | Passed
    | SkippedV1
)


@value
class Result:
    """What to do with one input frame."""

    forward: tuple[OutFrame, ...] = ()  # toward the other side, in order
    reply: tuple[OutFrame, ...] = ()  # back to the sender, in order
    notes: tuple[Note, ...] = ()  # for the shell to log


EMPTY = Result()
# ``Connection.handle_line``'s answer for a request or response that goes on exactly as it came,
# tracked: ``Result((OutFrame(line, None, version),))`` without building it (the round trip's
# hot path). Compared by identity (``is AS_CAME``): a ``Result`` of its own, never ``EMPTY``.
AS_CAME = Result()


@value(frozen=False)
class PipelineStats:
    """Counters for the exit summary (the shell reads them; only this module writes them)."""

    client_to_agent_in: int = 0  # frames (and oversize lines) received from the client
    client_to_agent_out: int = 0  # frames forwarded to the agent
    agent_to_client_in: int = 0
    agent_to_client_out: int = 0
    rewritten: int = 0  # messages changed by middleware
    dropped: int = 0  # messages dropped or answered by middleware
    diverted: int = 0  # non-JSON agent lines (or prefixes) sent to the log
    oversize: int = 0  # frames over the size limit
    middleware_failures: int = 0
    replies: int = 0  # frames the proxy sent back to a sender
    errors_replied: int = 0  # JSON-RPC error responses the proxy generated (replies and aborts)
    not_parsed: int = 0  # frames forwarded untouched because they could not be parsed
    pending_refused: int = 0  # requests answered with an error: too many in flight

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in field_names(self)}
