"""What a detachable session remembers across client connections (``detach_grace``).

Contract: owns the bookkeeping of one agent kept alive across client connections (pure, no
I/O): which sessions it holds, its ``initialize`` answer, the requests in flight each way, the
frames the agent sent while no client was attached (bounded in bytes and frames; past the bound
the buffer is marked overflowed and a reattach is refused, never replayed with a gap), and what a
reattach writes, in order. The shell (``shell.sockets.detach``) moves the bytes and keeps the
clock; this module only reads and writes whole NDJSON lines (without their newline).

The rules (docs/sockets.md, "What survives a disconnect"):

* A reattach (``session/load`` or ``session/resume`` naming a held session) is answered by the
  proxy: the agent's requests the old client never answered are sent again, then the frames
  buffered since the detach, in order, then the session goes live.
* The response of the prompt that was in flight for that session is delivered as the response to
  the reattaching request (its result or its error, verbatim, with the new request's id): the
  load ends when the turn ends (a prompt's result is a valid ``LoadSessionResponse``: an object
  whose other keys are allowed). With no turn in flight, the load is answered ``{}`` at once
  after the replay.
* Answers to the old connection's other requests are dropped (counted): no client asked for them.
* A new client's request whose id is still in flight from an earlier connection is sent to the
  agent under a proxy id, and its answer is given back the client's id.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from acp_proxy.base.jsontypes import JsonValue

DEFAULT_BUFFER_BYTES: Final = 4 * 1024 * 1024
DEFAULT_BUFFER_FRAMES: Final = 10_000
_ID: Final = b'"id"'
_NONE: Final = object()  # no entry (an id may be null)
PERMISSION: Final = "session/request_permission"
REATTACH_METHODS: Final = frozenset({"session/load", "session/resume"})


def _key(rid: JsonValue) -> Any:
    """A hashable key of a JSON-RPC id (1 and "1" stay apart)."""
    return (type(rid).__name__, rid) if isinstance(rid, (str, int, float)) else orjson.dumps(rid)


def parse(line: bytes) -> dict[str, Any] | None:
    """The line's object when it may be a request or a response (it has an ``"id"`` key
    somewhere), else ``None`` (a notification, or not JSON: passed as it is)."""
    if _ID not in line:
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and "id" in obj else None


def response(rid: JsonValue, result: JsonValue) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result})


def error(rid: JsonValue, code: int, message: str, data: JsonValue = None) -> bytes:
    err: dict[str, JsonValue] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "error": err})


def _session_id(obj: dict[str, Any], part: str = "params") -> str | None:
    inner = obj.get(part)
    sid = inner.get("sessionId") if isinstance(inner, dict) else None
    return sid if isinstance(sid, str) else None


@dataclass(slots=True)
class _Request:
    method: str
    session: str | None
    generation: int


@dataclass(slots=True)
class Replay:
    """What a reattach writes to the new client, in order, and what it replayed."""

    frames: list[bytes]
    redelivered: int  # agent requests the old client left unanswered, sent again
    buffered: int  # frames the agent sent while detached
    answered: bool  # the reattaching request is answered in ``frames`` (no turn in flight)


@dataclass(slots=True)
class Ledger:
    """One held agent's memory; see the module's rules. ``generation`` counts attachments."""

    max_bytes: int = DEFAULT_BUFFER_BYTES
    max_frames: int = DEFAULT_BUFFER_FRAMES
    generation: int = 1
    attached: bool = True
    sessions: set[str] = field(default_factory=set)
    init_result: Any = None  # the agent's initialize result, once answered
    load_session: bool = False  # agentCapabilities.loadSession
    _init_key: Any = None
    _client: dict[Any, _Request] = field(default_factory=dict)  # client requests in flight
    _agent: dict[Any, bytes] = field(default_factory=dict)  # agent requests in flight
    _delivered: set[Any] = field(default_factory=set)  # agent requests the client was sent
    _remap: dict[Any, JsonValue] = field(default_factory=dict)  # proxy id key -> client's id
    _retarget: dict[Any, JsonValue] = field(default_factory=dict)  # prompt key -> load id
    # prompt key -> (its session, its answer), answered while detached
    _ended: dict[Any, tuple[str | None, bytes]] = field(default_factory=dict)
    # Answers returned by ``to_client`` and not ``written`` yet: (key, request, the agent's line).
    _unconfirmed: dict[bytes, tuple[Any, _Request, bytes]] = field(default_factory=dict)
    _swallow: set[Any] = field(default_factory=set)  # answers nobody is owed (a proxy init)
    buffer: deque[bytes] = field(default_factory=deque)
    buffered_bytes: int = 0
    overflowed: bool = False
    lost: int = 0  # frames not buffered past the bound
    dropped: int = 0  # answers to an old connection's requests nobody asked for now
    _next: int = 0

    # -- client -> agent ---------------------------------------------------------------------

    def from_client(self, line: bytes) -> bytes:
        """A whole line from the attached client, on its way to the agent (rewritten when its
        id is still in flight from an earlier connection)."""
        obj = parse(line)
        if obj is None:
            return line
        rid = obj["id"]
        key = _key(rid)
        method = obj.get("method")
        if not isinstance(method, str):  # the client's answer to an agent request
            self._agent.pop(key, None)
            self._delivered.discard(key)
            return line
        old = self._client.get(key)
        if old is not None and old.generation != self.generation:
            self._next += 1
            proxy_id = f"acp-proxy/reattach/{self.generation}/{self._next}"
            self._remap[_key(proxy_id)] = rid
            obj["id"] = proxy_id
            key = _key(proxy_id)
            line = orjson.dumps(obj)
        sid = _session_id(obj)
        if sid is not None:
            self.sessions.add(sid)
        if method == "initialize" and self._init_key is None:
            self._init_key = key
        self._client[key] = _Request(method, sid, self.generation)
        return line

    # -- agent -> client ---------------------------------------------------------------------

    def to_client(self, line: bytes) -> bytes | None:
        """A whole line from the agent: what to write to the attached client (``None``:
        nothing), or, while detached, buffered (``None``)."""
        obj = parse(line)
        if obj is None:
            return self._out(line)
        key = _key(obj["id"])
        if isinstance(obj.get("method"), str):  # an agent request
            self._agent[key] = line
            out = self._out(line)
            if self.attached:
                self._delivered.add(key)
            return out
        request = self._client.pop(key, None)
        if request is None:
            return self._out(line)
        if request.method == "initialize" and key == self._init_key:
            self._learn_init(obj)
        elif request.method == "session/new":
            sid = _session_id(obj, "result")
            if sid is not None:
                self.sessions.add(sid)
        if key in self._swallow:
            self._swallow.discard(key)
            return None
        target = self._retarget.pop(key, _NONE)
        client_id = self._remap.pop(key, _NONE)
        if self.attached and (target is not _NONE or request.generation == self.generation):
            if target is not _NONE or client_id is not _NONE:
                obj["id"] = target if target is not _NONE else client_id
                out = orjson.dumps(obj)
            else:
                out = line
            self._unconfirmed[out] = (key, request, line)
            return out
        self._unanswered(key, request, line)
        return None

    def _unanswered(self, key: Any, request: _Request, line: bytes) -> None:
        """The agent's answer to ``request`` that no attached client asked for: a prompt's is
        kept for whoever reattaches its session (while detached), any other is dropped."""
        if not self.attached and request.method == "session/prompt":
            self._ended[key] = (request.session, line)
        else:
            self.dropped += 1

    def _out(self, line: bytes) -> bytes | None:
        if self.attached:
            return line
        if self.overflowed:
            self.lost += 1
            return None
        size = len(line) + 1
        if len(self.buffer) + 1 > self.max_frames or self.buffered_bytes + size > self.max_bytes:
            self.overflowed = True
            self.lost += 1 + len(self.buffer)
            self.buffer.clear()
            self.buffered_bytes = 0
            return None
        self.buffer.append(line)
        self.buffered_bytes += size
        return None

    def _learn_init(self, obj: dict[str, Any]) -> None:
        result = obj.get("result")
        if isinstance(result, dict):
            self.init_result = result
            caps = result.get("agentCapabilities")
            self.load_session = isinstance(caps, dict) and caps.get("loadSession") is True

    # -- attachments -------------------------------------------------------------------------

    def swallow(self, rid: JsonValue) -> None:
        """The agent's answer to ``rid`` goes to nobody (the proxy answered it already)."""
        self._swallow.add(_key(rid))

    def detach(self) -> None:
        self.attached = False

    def reattach(self, rid: JsonValue, method: str, session: str) -> Replay:
        """A new client attaches with request ``rid`` (``method`` naming ``session``): the
        frames to write it, in order (see the module's rules). Only when not overflowed."""
        assert not self.overflowed
        self.generation += 1
        self.attached = True
        frames = [raw for key, raw in self._agent.items() if key in self._delivered]
        redelivered = len(frames)
        buffered = len(self.buffer)
        frames.extend(self.buffer)
        self._delivered = set(self._agent)
        self.buffer.clear()
        self.buffered_bytes = 0
        answered = True
        for sid, raw in self._ended.values():
            obj = orjson.loads(raw)
            if answered and sid in (session, None):
                obj["id"] = rid
                frames.append(orjson.dumps(obj))
                answered = False
            else:
                self.dropped += 1
        self._ended.clear()
        if answered:
            for key, request in self._client.items():
                if request.method == "session/prompt" and request.session == session:
                    self._retarget[key] = rid
                    answered = False
                    break
        if answered:
            frames.append(response(rid, {}))
        return Replay(frames, redelivered, buffered, answered)

    def written(self) -> None:
        """The answers ``to_client`` returned reached the client's socket."""
        self._unconfirmed.clear()

    def requeue(self, line: bytes) -> None:
        """A line ``to_client`` returned that the client did not get (its connection broke while
        it was written; call after ``detach``): kept for the next client, like one the agent
        sent after the detach (a prompt's answer for the load that reattaches its session)."""
        answered = self._unconfirmed.pop(line, None)
        if answered is not None:
            self._unanswered(*answered)
            return
        obj = parse(line)
        if obj is not None and isinstance(obj.get("method"), str):
            self._delivered.discard(_key(obj["id"]))
        self._out(line)

    def forward_after_overflow(self) -> None:
        """The overflowed buffer is given up (a reattach forwarded to the agent, which replays
        the conversation itself): later frames are buffered again."""
        self.overflowed = False
        self.generation += 1
        self.attached = True
        self._delivered = set(self._agent)
        self._ended.clear()

    def expire(self) -> list[bytes]:
        """The grace time is over: the answers the client owes the agent (``cancelled`` for a
        permission request, an error for the others), as if it had sent them."""
        out: list[bytes] = []
        for raw in self._agent.values():
            obj = orjson.loads(raw)
            rid = obj["id"]
            if obj.get("method") == PERMISSION:
                out.append(response(rid, {"outcome": {"outcome": "cancelled"}}))
            else:
                out.append(
                    error(rid, -32603, "acp-proxy: the client detached and did not come back")
                )
        self._agent.clear()
        return out


def reattach_request(line: bytes) -> tuple[JsonValue, str, str] | None:
    """``(id, method, sessionId)`` when ``line`` is a ``session/load`` or ``session/resume``
    request naming a session, else ``None``."""
    obj = parse(line)
    if obj is None or obj.get("method") not in REATTACH_METHODS:
        return None
    sid = _session_id(obj)
    return None if sid is None else (obj["id"], obj["method"], sid)


def initialize_request(line: bytes) -> tuple[JsonValue, JsonValue] | None:
    """``(id, protocolVersion)`` of an ``initialize`` request, else ``None``."""
    obj = parse(line)
    if obj is None or obj.get("method") != "initialize":
        return None
    params = obj.get("params")
    version = params.get("protocolVersion") if isinstance(params, dict) else None
    return obj["id"], version
