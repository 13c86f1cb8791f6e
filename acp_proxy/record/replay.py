"""``acp-proxy replay FILE``: act as the agent of a record. The pure script.

Contract: pure. ``Replayer`` turns a record into a script of steps in recorded order: the
client's messages (as the client wrote them) and the messages the client received (what the
proxy delivered: ``sent`` where it changed a frame, plus the frames it generated). Fed the live
client's frames one at a time, it says what to write back: the recorded agent messages, in
order, each once the client messages it waited for have arrived (``Replayer.from_record``);
each client message must be the one recorded at that position (same method; a response to the
same agent request), and the recorded response to a request goes back with the live id. A
client that diverges gets a JSON-RPC error for each request from then on,
and ``problems`` says where it diverged. No I/O and no clock: the shell sleeps for ``t``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.record.format import AGENT_TO_CLIENT, CLIENT_TO_AGENT, delivered, frame_bytes
from acp_proxy.wire.errors import INTERNAL_ERROR, INVALID_REQUEST, error_bytes, error_object
from acp_proxy.wire.framing import Oversize, read_request_id, scan_head


def _loads(raw: bytes) -> JsonValue | None:
    try:
        return json.loads(raw)  # type: ignore[no-any-return]
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return None


def _dumps(value: JsonValue) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _key(value: JsonValue) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except RecursionError:
        return repr(value)


def _shape(message: Mapping[str, JsonValue]) -> str:
    method = message.get("method")
    if isinstance(method, str):
        return f"{'request' if 'id' in message else 'notification'} {method}"
    return f"response #{_key(message.get('id'))}"


@dataclass(frozen=True, slots=True)
class ClientStep:
    t: float
    message: dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class AgentStep:
    t: float
    raw: bytes  # one frame as the client received it
    value: JsonValue  # its parse when it holds a response (its id is mapped), else None
    # Client messages that must have arrived before it is due (see ``from_record``).
    need: int
    gate_t: float = 0.0  # the recorded time of client message ``need`` (0: none)


# The agent frames ``Replayer.ready`` gives at once, in bytes (past the first).
READY_BYTES = 1 << 20
# Requests of the recorded client still unanswered, remembered to gate the agent's answers:
# past this, the oldest is forgotten (its answer then waits for every client message before).
MAX_OPEN_REQUESTS = 100_000


def _messages_of(value: JsonValue) -> list[JsonValue]:
    return value if isinstance(value, list) else [value]


def client_steps(entries: Iterable[Mapping[str, JsonValue]]) -> Iterator[ClientStep]:
    """The recorded client's messages, in order, as it wrote them."""
    for entry in entries:
        if entry.get("dir") == CLIENT_TO_AGENT and not entry.get("generated"):
            t = _t(entry)
            for message in _messages_of(_loads(frame_bytes(entry))):
                if isinstance(message, dict):
                    yield ClientStep(t, message)


def agent_steps(entries: Iterable[Mapping[str, JsonValue]]) -> Iterator[AgentStep]:
    """The frames the recorded client received, in order, each with the client messages it
    waits for (see ``Replayer.from_record``); only the open requests are kept, not the rest."""
    open_requests: dict[str, tuple[int, float]] = {}  # recorded id -> (client count, its t)
    count = 0
    last_t = 0.0
    need, need_t = 0, 0.0
    for entry in entries:
        direction = entry.get("dir")
        t = _t(entry)
        if direction == CLIENT_TO_AGENT and not entry.get("generated"):
            for message in _messages_of(_loads(frame_bytes(entry))):
                if isinstance(message, dict):
                    count += 1
                    last_t = t
                    if isinstance(message.get("method"), str) and "id" in message:
                        key = _key(message["id"])
                        open_requests.pop(key, None)
                        open_requests[key] = (count, t)
                        if len(open_requests) > MAX_OPEN_REQUESTS:
                            del open_requests[next(iter(open_requests))]
        elif direction == AGENT_TO_CLIENT:
            for frame in delivered(entry):
                value = _loads(frame)
                gate, gate_t = 0, 0.0
                for m in _messages_of(value):
                    if isinstance(m, dict) and "method" not in m and "id" in m:
                        got = open_requests.pop(_key(m["id"]), (0, 0.0))
                    elif open_requests:
                        got = max(open_requests.values())
                    else:
                        got = (count, last_t)
                    if got[0] > gate:
                        gate, gate_t = got
                if gate > need:
                    need, need_t = gate, gate_t
                # Only a response's id is mapped: the parse of anything else is not kept.
                answers = any(
                    isinstance(m, dict) and "method" not in m and "id" in m
                    for m in _messages_of(value)
                )
                yield AgentStep(t, frame, value if answers else None, need, need_t)


def _t(entry: Mapping[str, JsonValue]) -> float:
    raw_t = entry.get("t")
    return float(raw_t) if isinstance(raw_t, int | float) else 0.0


T = TypeVar("T")


class _Ahead(Generic[T]):
    """An iterator with its next item looked at (one item held, never more)."""

    __slots__ = ("_done", "_items", "_next")

    def __init__(self, items: Iterator[T]) -> None:
        self._items = items
        self._next: T | None = None
        self._done = False

    def peek(self) -> T | None:
        if self._next is None and not self._done:
            self._next = next(self._items, None)
            self._done = self._next is None
        return self._next

    def pop(self) -> T:
        item = self.peek()
        assert item is not None
        self._next = None
        return item

    def rest(self) -> int:
        """How many items are left (read through)."""
        left = 1 if self.peek() is not None else 0
        self._next = None
        left += sum(1 for _ in self._items)
        self._done = True
        return left


@dataclass(slots=True)
class Replayer:
    """The replay state machine (see the module docstring). It reads the record twice, once
    for each side's messages, each as it needs the next one: memory holds the open requests
    and two messages, never the record."""

    client: _Ahead[ClientStep]
    agent: _Ahead[AgentStep]
    matched: int = 0  # client messages matched so far
    diverged: str | None = None
    problems: list[str] = field(default_factory=list)
    _ids: dict[str, JsonValue] = field(default_factory=dict)  # recorded id -> live id

    @classmethod
    def from_record(cls, entries: Iterable[Mapping[str, JsonValue]]) -> Replayer:
        """The script of a record's frame lines (header and events are skipped); ``entries``
        is iterated twice (a list, or an object that reads the file again on each ``iter``).

        When is an agent message due? In recorded order, and: a response once the request it
        answers has arrived; anything else once the client requests still unanswered at that
        point of the record have arrived (the turn it belongs to), or, with none open, every
        client message recorded before it. So a record of a client that sent several requests
        at once still replays to a client that waits for each response (no deadlock), and a
        record of an interactive client replays exactly in its order.
        """
        return cls(_Ahead(client_steps(entries)), _Ahead(agent_steps(entries)))

    @property
    def client_steps_left(self) -> int:
        return self.client.rest()

    def ready(
        self, limit: int = 256, max_bytes: int = READY_BYTES
    ) -> list[tuple[AgentStep, bytes]]:
        """The agent frames due now, in order, each with its step (for its timing): at most
        ``limit`` of them and, past the first, ``max_bytes`` of frames (call again until it
        gives none): what is held at once does not grow with the size of the frames."""
        out: list[tuple[AgentStep, bytes]] = []
        if self.diverged is not None:
            return out
        size = 0
        while (
            len(out) < limit
            and (not out or size < max_bytes)
            and (step := self.agent.peek()) is not None
            and step.need <= self.matched
        ):
            self.agent.pop()
            frame = self._mapped(step)
            size += len(frame)
            out.append((step, frame))
        return out

    def gate_t(self, step: AgentStep) -> float:
        """The recorded time of the client message ``step`` waited for (0: none)."""
        return step.gate_t

    def _mapped(self, step: AgentStep) -> bytes:
        value = step.value
        messages = value if isinstance(value, list) else [value]
        changed = False
        for i, message in enumerate(messages):
            if isinstance(message, dict) and "method" not in message and "id" in message:
                # A request has one response: its live id is not needed after it (kept, the
                # table would grow by one entry per request of the whole record).
                live = self._ids.pop(_key(message["id"]), message["id"])
                if live != message["id"] or type(live) is not type(message["id"]):
                    messages[i] = {**message, "id": live}
                    changed = True
        if not changed:
            return step.raw  # byte-exact: the same ids as recorded
        return _dumps(cast(JsonValue, messages) if isinstance(value, list) else messages[0])

    def receive(self, raw: bytes) -> list[bytes]:
        """Feed one live client frame; returns the error replies it gets (if it diverges)."""
        value = _loads(raw)
        messages = value if isinstance(value, list) else [value]
        replies: list[bytes] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            if self.diverged is None:
                self._match(message)
            if self.diverged is not None and "method" in message and "id" in message:
                replies.append(
                    # "Internal error": the request is well-formed, the replayed agent cannot
                    # answer it.
                    _dumps(
                        error_object(
                            message["id"], INTERNAL_ERROR, f"acp-proxy replay: {self.diverged}"
                        )
                    )
                )
        return replies

    def oversize(self, event: Oversize) -> list[bytes]:
        """A live client line over the frame size limit (its bytes were not kept): the client
        diverges there; a request whose id can be read from the line's head gets the -32600
        error the proxy gives such a request (its id echoed as written)."""
        text = (
            f"acp-proxy: message of {event.size} bytes exceeds the {event.limit}-byte limit; "
            "not forwarded"
        )
        if self.diverged is None:
            self._diverge(
                f"client message {self.matched + 1} of {event.size} bytes exceeds the "
                f"{event.limit}-byte limit (--max-frame-bytes); not read"
            )
        is_request, _ = read_request_id(event.head)
        if not is_request:
            return []
        return [error_bytes(scan_head(event.head).id_bytes, INVALID_REQUEST, text)]

    def _match(self, message: dict[str, JsonValue]) -> None:
        position = self.matched + 1
        step = self.client.peek()
        if step is None:
            self._diverge(f"client message {position} ({_shape(message)}) is beyond the record")
            return
        expected = step.message
        if "method" in expected:
            same = expected.get("method") == message.get("method") and (
                ("id" in expected) == ("id" in message)
            )
        else:  # a response to one of the agent's requests (sent with the recorded ids)
            same = "method" not in message and _key(message.get("id")) == _key(expected.get("id"))
        if not same:
            self._diverge(
                f"client message {position} diverges from the record: expected "
                f"{_shape(expected)}, got {_shape(message)}"
            )
            return
        self.client.pop()
        self.matched += 1
        if "method" in expected and "id" in expected:
            self._ids[_key(expected["id"])] = message["id"]
            if len(self._ids) > MAX_OPEN_REQUESTS:  # never answered in the record: forgotten
                del self._ids[next(iter(self._ids))]

    @property
    def open_ids(self) -> int:
        """Live ids of requests whose recorded response is still to come (bounded)."""
        return len(self._ids)

    def _diverge(self, reason: str) -> None:
        self.diverged = reason
        self.problems.append(reason)

    def finish(self) -> list[str]:
        """At the client's EOF: every problem of the replay (empty: it matched the record)."""
        left = self.client_steps_left
        if self.diverged is None and left:
            self.problems.append(
                f"the client closed after {self.matched} messages; the record has {left} more"
            )
        return self.problems


# --- the other way round: the recorded client against a real agent (--as-client) -----------------

_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$")


def normalise(value: JsonValue) -> JsonValue:
    """``value`` with what legitimately differs between two runs of a deterministic agent made
    equal: timestamps (ISO 8601 strings) become ``"<time>"``."""
    if isinstance(value, str):
        return "<time>" if _TIME.match(value) else value
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class PlayStep:
    message: dict[str, JsonValue]
    need: int  # agent messages that must have arrived before it is sent
    t: float


def play_steps(entries: Iterable[Mapping[str, JsonValue]]) -> Iterator[PlayStep]:
    """What the recorded agent received, in order, each due once the agent messages recorded
    before it have arrived."""
    agent_messages = 0
    for entry in entries:
        if entry.get("generated"):
            continue  # the proxy's own frames: neither side wrote them
        if entry.get("dir") == CLIENT_TO_AGENT:
            # What the agent received: a regression run feeds the agent the same input.
            t = _t(entry)
            for frame in delivered(entry):
                for message in _messages_of(_loads(frame)):
                    if isinstance(message, dict):
                        yield PlayStep(message, agent_messages, t)
        elif entry.get("dir") == AGENT_TO_CLIENT:
            agent_messages += sum(
                1 for m in _messages_of(_loads(frame_bytes(entry))) if m is not None
            )


def agent_messages(entries: Iterable[Mapping[str, JsonValue]]) -> Iterator[JsonValue]:
    """What the recorded agent wrote, message by message, in order."""
    for entry in entries:
        if entry.get("dir") == AGENT_TO_CLIENT and not entry.get("generated"):
            for message in _messages_of(_loads(frame_bytes(entry))):
                if message is not None:
                    yield message


@dataclass(slots=True)
class ClientPlayer:
    """Plays a record's client side to a real agent and compares what the agent writes.

    A client message is due once the agent messages recorded before it have arrived. The
    agent's requests may carry other ids than recorded: the recorded client's response to a
    request goes back with the live id. Agent messages are compared in order, with the request
    ids (of both sides) and timestamps normalised. Like ``Replayer``, it reads the record twice,
    each side as it needs it.
    """

    steps: _Ahead[PlayStep]
    expected: _Ahead[JsonValue]  # the agent's messages as recorded, in order
    got: int = 0
    differences: list[str] = field(default_factory=list)
    _agent_ids: dict[str, JsonValue] = field(default_factory=dict)  # recorded id -> live id

    @classmethod
    def from_record(cls, entries: Iterable[Mapping[str, JsonValue]]) -> ClientPlayer:
        """The player of a record's frame lines (``entries`` is iterated twice)."""
        return cls(_Ahead(play_steps(entries)), _Ahead(agent_messages(entries)))

    @property
    def done(self) -> bool:
        """Whether every client message was sent."""
        return self.steps.peek() is None

    def due(self) -> list[bytes]:
        """The client frames to send now."""
        return [frame for _, frame in self.due_timed()]

    def due_timed(self) -> list[tuple[float, bytes]]:
        """The client frames to send now, each with its recorded time."""
        out: list[tuple[float, bytes]] = []
        while (step := self.steps.peek()) is not None and step.need <= self.got:
            self.steps.pop()
            message = step.message
            if "method" not in message and "id" in message:
                live = self._agent_ids.pop(_key(message["id"]), message["id"])
                message = {**message, "id": live}
            out.append((step.t, _dumps(message)))
        return out

    def agent_frame(self, raw: bytes) -> None:
        """One frame the agent wrote."""
        value = _loads(raw)
        if value is None:
            self.differences.append(f"agent wrote a line that is not JSON: {raw[:200]!r}")
            return
        for message in _messages_of(value):
            self._compare(message)

    def _compare(self, message: JsonValue) -> None:
        index = self.got
        self.got += 1
        want = self.expected.peek()
        if want is None:
            self.differences.append(
                f"agent message {index + 1} is beyond the record: {_short(message)}"
            )
            return
        self.expected.pop()
        if (
            isinstance(message, dict)
            and isinstance(want, dict)
            and isinstance(message.get("method"), str)
            and "id" in message
            and "id" in want
        ):
            # An agent request: its id is the agent's to choose; remember it for the answer.
            self._agent_ids[_key(want["id"])] = message["id"]
            if len(self._agent_ids) > MAX_OPEN_REQUESTS:
                del self._agent_ids[next(iter(self._agent_ids))]
            message = {**message, "id": want["id"]}
        if normalise(message) != normalise(want):
            self.differences.append(
                f"agent message {index + 1} differs: expected {_short(want)}, got {_short(message)}"
            )

    def finish(self) -> list[str]:
        """Every difference (empty: the agent wrote what the record says)."""
        left = self.expected.rest()
        if left:
            self.differences.append(
                f"the agent wrote {self.got} messages; the record has {self.got + left}"
            )
        steps = self.steps.rest()
        if steps:
            self.differences.append(f"{steps} client messages were never due")
        return self.differences


def _short(value: JsonValue, limit: int = 300) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"
