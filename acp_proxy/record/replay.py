"""``acp-proxy replay FILE``: act as the agent of a record (issue 11). The pure script.

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
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import cast

from acp_proxy.jsontypes import JsonValue
from acp_proxy.record.format import AGENT_TO_CLIENT, CLIENT_TO_AGENT, delivered, frame_bytes

# JSON-RPC "Internal error": the request is well-formed, the replayed agent cannot answer it.
DIVERGED_CODE = -32603


def _loads(raw: bytes) -> JsonValue | None:
    try:
        return json.loads(raw)  # type: ignore[no-any-return]
    except ValueError:
        return None


def _dumps(value: JsonValue) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _key(value: JsonValue) -> str:
    return json.dumps(value, sort_keys=True)


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
    value: JsonValue
    # Client messages that must have arrived before it is due (see ``from_record``).
    need: int


@dataclass(slots=True)
class Replayer:
    """The replay state machine (see the module docstring)."""

    client: deque[ClientStep]
    agent: deque[AgentStep]
    client_t: list[float]  # recorded time of each client message, in order
    matched: int = 0  # client messages matched so far
    diverged: str | None = None
    problems: list[str] = field(default_factory=list)
    _ids: dict[str, JsonValue] = field(default_factory=dict)  # recorded id -> live id

    @classmethod
    def from_record(cls, entries: Iterable[Mapping[str, JsonValue]]) -> Replayer:
        """The script of a record's frame lines (header and events are skipped).

        When is an agent message due? In recorded order, and: a response once the request it
        answers has arrived; anything else once the client requests still unanswered at that
        point of the record have arrived (the turn it belongs to), or, with none open, every
        client message recorded before it. So a record of a client that sent several requests
        at once still replays to a client that waits for each response (no deadlock), and a
        record of an interactive client replays exactly in its order.
        """
        client: deque[ClientStep] = deque()
        agent: deque[AgentStep] = deque()
        open_requests: dict[str, int] = {}  # recorded id -> client messages up to it
        need = 0
        for entry in entries:
            direction = entry.get("dir")
            raw_t = entry.get("t")
            t = float(raw_t) if isinstance(raw_t, int | float) else 0.0
            if direction == CLIENT_TO_AGENT and not entry.get("generated"):
                value = _loads(frame_bytes(entry))
                for message in value if isinstance(value, list) else [value]:
                    if isinstance(message, dict):
                        client.append(ClientStep(t, message))
                        if isinstance(message.get("method"), str) and "id" in message:
                            open_requests[_key(message["id"])] = len(client)
            elif direction == AGENT_TO_CLIENT:
                for frame in delivered(entry):
                    value = _loads(frame)
                    messages = value if isinstance(value, list) else [value]
                    gate = 0
                    for m in messages:
                        if isinstance(m, dict) and "method" not in m and "id" in m:
                            gate = max(gate, open_requests.pop(_key(m["id"]), 0))
                        else:
                            gate = max(gate, max(open_requests.values(), default=len(client)))
                    need = max(need, gate)
                    agent.append(AgentStep(t, frame, value, need))
        return cls(client, agent, [s.t for s in client])

    @property
    def client_steps_left(self) -> int:
        return len(self.client)

    def ready(self) -> list[tuple[AgentStep, bytes]]:
        """The agent frames due now, in order, each with its step (for its timing)."""
        out: list[tuple[AgentStep, bytes]] = []
        if self.diverged is not None:
            return out
        while self.agent and self.agent[0].need <= self.matched:
            step = self.agent.popleft()
            out.append((step, self._mapped(step)))
        return out

    def gate_t(self, step: AgentStep) -> float:
        """The recorded time of the client message ``step`` waited for (0: none)."""
        return self.client_t[step.need - 1] if step.need else 0.0

    def _mapped(self, step: AgentStep) -> bytes:
        value = step.value
        messages = value if isinstance(value, list) else [value]
        changed = False
        for i, message in enumerate(messages):
            if isinstance(message, dict) and "method" not in message and "id" in message:
                live = self._ids.get(_key(message["id"]), message["id"])
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
                    _dumps(
                        {
                            "jsonrpc": "2.0",
                            "id": message["id"],
                            "error": {
                                "code": DIVERGED_CODE,
                                "message": f"acp-proxy replay: {self.diverged}",
                            },
                        }
                    )
                )
        return replies

    def _match(self, message: dict[str, JsonValue]) -> None:
        position = self.matched + 1
        if not self.client:
            self._diverge(f"client message {position} ({_shape(message)}) is beyond the record")
            return
        step = self.client[0]
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
        self.client.popleft()
        self.matched += 1
        if "method" in expected and "id" in expected:
            self._ids[_key(expected["id"])] = message["id"]

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


@dataclass(slots=True)
class ClientPlayer:
    """Plays a record's client side to a real agent and compares what the agent writes.

    A client message is due once the agent messages recorded before it have arrived. The
    agent's requests may carry other ids than recorded: the recorded client's response to a
    request goes back with the live id. Agent messages are compared in order, with the request
    ids (of both sides) and timestamps normalised.
    """

    steps: deque[PlayStep]
    expected: list[JsonValue]  # the agent's messages as recorded, in order
    got: int = 0
    differences: list[str] = field(default_factory=list)
    _agent_ids: dict[str, JsonValue] = field(default_factory=dict)  # recorded id -> live id

    @classmethod
    def from_record(cls, entries: Iterable[Mapping[str, JsonValue]]) -> ClientPlayer:
        steps: deque[PlayStep] = deque()
        expected: list[JsonValue] = []
        for entry in entries:
            raw_t = entry.get("t")
            t = float(raw_t) if isinstance(raw_t, int | float) else 0.0
            if entry.get("generated"):
                continue  # the proxy's own frames: neither side wrote them
            if entry.get("dir") == CLIENT_TO_AGENT:
                # What the agent received: a regression run feeds the agent the same input.
                for frame in delivered(entry):
                    value = _loads(frame)
                    for message in value if isinstance(value, list) else [value]:
                        if isinstance(message, dict):
                            steps.append(PlayStep(message, len(expected), t))
            elif entry.get("dir") == AGENT_TO_CLIENT:
                value = _loads(frame_bytes(entry))  # what the agent wrote
                for message in value if isinstance(value, list) else [value]:
                    if message is not None:
                        expected.append(message)
        return cls(steps, expected)

    def due(self) -> list[bytes]:
        """The client frames to send now."""
        out: list[bytes] = []
        while self.steps and self.steps[0].need <= self.got:
            message = self.steps.popleft().message
            if "method" not in message and "id" in message:
                live = self._agent_ids.get(_key(message["id"]), message["id"])
                message = {**message, "id": live}
            out.append(_dumps(message))
        return out

    def agent_frame(self, raw: bytes) -> None:
        """One frame the agent wrote."""
        value = _loads(raw)
        if value is None:
            self.differences.append(f"agent wrote a line that is not JSON: {raw[:200]!r}")
            return
        for message in value if isinstance(value, list) else [value]:
            self._compare(message)

    def _compare(self, message: JsonValue) -> None:
        index = self.got
        self.got += 1
        if index >= len(self.expected):
            self.differences.append(
                f"agent message {index + 1} is beyond the record: {_short(message)}"
            )
            return
        want = self.expected[index]
        if (
            isinstance(message, dict)
            and isinstance(want, dict)
            and isinstance(message.get("method"), str)
            and "id" in message
            and "id" in want
        ):
            # An agent request: its id is the agent's to choose; remember it for the answer.
            self._agent_ids[_key(want["id"])] = message["id"]
            message = {**message, "id": want["id"]}
        if normalise(message) != normalise(want):
            self.differences.append(
                f"agent message {index + 1} differs: expected {_short(want)}, got {_short(message)}"
            )

    def finish(self) -> list[str]:
        """Every difference (empty: the agent wrote what the record says)."""
        if self.got < len(self.expected):
            self.differences.append(
                f"the agent wrote {self.got} messages; the record has {len(self.expected)}"
            )
        if self.steps:
            self.differences.append(f"{len(self.steps)} client messages were never due")
        return self.differences


def _short(value: JsonValue, limit: int = 300) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"
