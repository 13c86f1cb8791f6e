"""``acp-proxy demo``: the bundled rules between a scripted ACP v2 client and a scripted agent.

Contract: owns the demo's scripted client and its report. It plays one session twice with the
scripted agent (``acp_proxy.demo.agent``): once directly, to record what the agent sends, and once
through the real CLI (``python -m acp_proxy --config <rules> -- python -m acp_proxy.demo.agent``),
to record what a client receives. It pairs the updates of the two runs, shows what the proxy
changed or inserted, and reduces both streams with the client model (``acp_proxy.meta.state``)
to the
metadata a client stores per entity, next to what a client would store if ``_meta`` objects
replaced the stored metadata whole (the rule before the v2 Metadata Patches RFD). It never
changes anything on disk and always ends its child processes (timeouts everywhere).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Final

import orjson

import acp_proxy
from acp_proxy import __version__
from acp_proxy.jsontypes import OMITTED, Field, JsonObject, JsonValue
from acp_proxy.meta.registry import EntityKey, UpsertSite, find_upsert
from acp_proxy.meta.state import ClientModel

PROTOCOL_VERSION: Final = 2
CLIENT_INFO: Final[JsonObject] = {
    "name": "acp-proxy-demo-client",
    "title": "acp-proxy demo client",
    "version": __version__,
}
DEMO_CWD: Final = "/workspace/project"
PROMPT_TEXT: Final = "Check config.yaml and run the tests."
DEFAULT_TIMEOUT_S: Final = 30.0
DEFAULT_PACE_MS: Final = 20
STDERR_TAIL_BYTES: Final = 16 * 1024


class DemoError(Exception):
    """The demo could not complete (the proxy failed, timed out or answered with an error)."""


# --------------------------------------------------------------------------------------------
# Running one session against a child process
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    """One line a peer wrote, without its newline, and its decoded JSON (``None`` if not JSON)."""

    raw: bytes
    message: JsonValue


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """Everything one run of the scripted session sent and received."""

    argv: tuple[str, ...]
    sent: tuple[JsonObject, ...]
    received: tuple[Frame, ...]
    session_id: str
    negotiated_version: int
    agent_info: JsonValue
    returncode: int | None
    stderr: str


class _Child:
    """A child speaking NDJSON on stdin/stdout, read by threads so every wait has a deadline."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], deadline: float) -> None:
        self.argv = tuple(argv)
        self._deadline = deadline
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        except OSError as exc:
            raise DemoError(f"cannot start {self.argv[0]}: {exc}") from exc
        assert self._proc.stdin is not None and self._proc.stdout is not None
        assert self._proc.stderr is not None
        self._stdin: IO[bytes] = self._proc.stdin
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._stderr = bytearray()
        self._stderr_lock = threading.Lock()
        self._eof = False
        self._threads = [
            threading.Thread(target=self._read_stdout, args=(self._proc.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(self._proc.stderr,), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read_stdout(self, stream: IO[bytes]) -> None:
        for line in iter(stream.readline, b""):
            self._lines.put(line)
        self._lines.put(None)

    def _read_stderr(self, stream: IO[bytes]) -> None:
        # Always drained, so a chatty proxy never blocks on a full pipe; only the tail is kept.
        # os.read returns what is there (a buffered read(n) would wait for n bytes or EOF).
        for chunk in iter(lambda: os.read(stream.fileno(), 65536), b""):
            with self._stderr_lock:
                self._stderr += chunk
                del self._stderr[:-STDERR_TAIL_BYTES]

    def stderr_text(self) -> str:
        with self._stderr_lock:
            return self._stderr.decode("utf-8", "replace")

    def send(self, message: JsonObject) -> None:
        try:
            self._stdin.write(orjson.dumps(message) + b"\n")
            self._stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise self._failure("stopped reading its input") from exc

    def next_frame(self, waiting_for: str) -> Frame:
        """The next line; raises ``DemoError`` at EOF or when the deadline passes."""
        if self._eof:
            raise self._failure(f"closed its output while the client waited for {waiting_for}")
        remaining = self._deadline - time.monotonic()
        try:
            line = self._lines.get(timeout=max(remaining, 0.0))
        except queue.Empty:
            raise DemoError(
                f"timed out waiting for {waiting_for} from: {' '.join(self.argv)}"
                + self._stderr_suffix()
            ) from None
        if line is None:
            self._eof = True
            raise self._failure(f"closed its output while the client waited for {waiting_for}")
        raw = line.rstrip(b"\r\n")
        try:
            message: JsonValue = orjson.loads(raw)
        except orjson.JSONDecodeError:
            message = None
        return Frame(raw, message)

    def close(self) -> int | None:
        """Close stdin (the client's EOF), then wait for the exit; kill past the deadline."""
        with contextlib.suppress(OSError, ValueError):
            self._stdin.close()
        remaining = max(self._deadline - time.monotonic(), 0.5)
        try:
            return self._proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            return None
        finally:
            for thread in self._threads:
                thread.join(timeout=1.0)

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5.0)

    def _stderr_suffix(self) -> str:
        tail = self.stderr_text().strip()
        return f"\n--- its stderr ---\n{tail}" if tail else ""

    def _failure(self, what: str) -> DemoError:
        code = self._proc.poll()
        if code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(timeout=2.0)
        status = f" (exit status {code})" if code is not None else ""
        return DemoError(f"{' '.join(self.argv)} {what}{status}" + self._stderr_suffix())


def client_messages(session_id: str) -> list[JsonObject]:
    """The three requests of the scripted client (``session/prompt`` needs the session id)."""
    return [
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            # v2 request shape: role-agnostic `info` and `capabilities` (acp-digest §2.3).
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "info": CLIENT_INFO,
                "capabilities": {},
            },
        },
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session/new",
            "params": {"cwd": DEMO_CWD, "mcpServers": []},
        },
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session/prompt",
            "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": PROMPT_TEXT}]},
        },
    ]


def _response_to(frame: Frame, request_id: int) -> JsonObject | None:
    message = frame.message
    if isinstance(message, dict) and "method" not in message and message.get("id") == request_id:
        return message
    return None


def _is_idle(frame: Frame, session_id: str) -> bool:
    message = frame.message
    if not isinstance(message, dict) or message.get("method") != "session/update":
        return False
    params = message.get("params")
    if not isinstance(params, dict) or params.get("sessionId") != session_id:
        return False
    update = params.get("update")
    return (
        isinstance(update, dict)
        and update.get("sessionUpdate") == "state_update"
        and update.get("state") == "idle"
    )


def _result_of(response: JsonObject, method: str, argv: Sequence[str]) -> JsonObject:
    if "error" in response:
        error = orjson.dumps(response["error"]).decode()
        raise DemoError(f"{method} failed through {' '.join(argv)}: {error}")
    result = response.get("result")
    if not isinstance(result, dict):
        raise DemoError(f"{method}: the response has no result object: {response!r}")
    return result


def run_session(argv: Sequence[str], env: dict[str, str], timeout_s: float) -> SessionRecord:
    """Play the scripted client against ``argv``: initialize, session/new, session/prompt.

    Reads until the prompt response *and* the idle ``state_update`` have arrived (v2: the prompt
    response acknowledges the user message; the idle state ends the turn), then closes the
    child's stdin and waits for it to exit. Raises ``DemoError`` on any failure or timeout.
    """
    child = _Child(argv, env, time.monotonic() + timeout_s)
    received: list[Frame] = []
    sent: list[JsonObject] = []
    try:

        def request(message: JsonObject, until: Callable[[], bool], what: str) -> None:
            child.send(message)
            sent.append(message)
            while not until():
                received.append(child.next_frame(what))

        def answer(request_id: int) -> JsonObject | None:
            for frame in received:
                response = _response_to(frame, request_id)
                if response is not None:
                    return response
            return None

        init, new, _ = client_messages("")
        request(init, lambda: answer(0) is not None, "the initialize response")
        init_result = _result_of(answer(0) or {}, "initialize", argv)
        version = init_result.get("protocolVersion")
        if version != PROTOCOL_VERSION:
            raise DemoError(f"the agent negotiated protocolVersion {version!r}, not 2")
        request(new, lambda: answer(1) is not None, "the session/new response")
        session_id = _result_of(answer(1) or {}, "session/new", argv).get("sessionId")
        if not isinstance(session_id, str):
            raise DemoError("session/new returned no sessionId")
        prompt = client_messages(session_id)[2]
        request(
            prompt,
            lambda: answer(2) is not None and any(_is_idle(f, session_id) for f in received),
            "the session/prompt response and the idle state_update",
        )
        _result_of(answer(2) or {}, "session/prompt", argv)
    except BaseException:
        child.kill()
        raise
    returncode = child.close()
    return SessionRecord(
        argv=tuple(argv),
        sent=tuple(sent),
        received=tuple(received),
        session_id=session_id,
        negotiated_version=PROTOCOL_VERSION,
        agent_info=init_result.get("info"),
        returncode=returncode,
        stderr=child.stderr_text(),
    )


# --------------------------------------------------------------------------------------------
# Pairing what the agent sent with what the client received
# --------------------------------------------------------------------------------------------


def _update_of(frame: Frame) -> JsonObject | None:
    message = frame.message
    if not isinstance(message, dict) or message.get("method") != "session/update":
        return None
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    update = params.get("update")
    return update if isinstance(update, dict) else None


def entity_of(update: JsonObject, session_id: str) -> str:
    """A readable name for the entity an update is about (``tool call call_001``)."""
    kind = update.get("sessionUpdate")
    for key, label in (
        ("toolCallId", "tool call"),
        ("terminalId", "terminal"),
        ("messageId", "message"),
        ("compactionId", "compaction"),
    ):
        value = update.get(key)
        if isinstance(value, str):
            return f"{label} {value}"
    if kind == "plan_update":
        plan = update.get("plan")
        if isinstance(plan, dict) and isinstance(plan.get("planId"), str):
            return f"plan {plan['planId']}"
    if kind == "subagent_update" and isinstance(update.get("sessionId"), str):
        return f"session {update['sessionId']}"
    return f"session {session_id}"


def _without_meta(update: JsonObject) -> JsonObject:
    return {k: v for k, v in update.items() if k != "_meta"}


def _is_follow_up(candidate: JsonObject, original: JsonObject) -> bool:
    """True when ``candidate`` only restates fields of ``original`` and carries a ``_meta``.

    That is the shape of the update a proxy inserts after a kept clear (issue 2: "a second update
    for the same entity carrying only the annotation", with the entity key and required fields).
    """
    if "_meta" not in candidate or candidate.get("sessionUpdate") != original.get("sessionUpdate"):
        return False
    return all(original.get(k, OMITTED) == v for k, v in _without_meta(candidate).items())


@dataclass(slots=True)
class Row:
    """What the client received, and the agent update(s) it stands for."""

    kind: str
    entity: str
    # The agent's updates this row stands for: one, several when the proxy coalesced them (under
    # backpressure), none for an update the agent never sent as such.
    sent: list[tuple[bytes, JsonObject]] = field(default_factory=list)
    received: tuple[bytes, JsonObject] | None = None
    # Updates the proxy inserted right after this one (its keys after a kept clear).
    inserted: list[JsonObject] = field(default_factory=list)

    @property
    def status(self) -> str:
        """unchanged | rewritten | merged | extra | missing."""
        if self.received is None:
            return "missing"
        if not self.sent:
            return "extra"
        if len(self.sent) > 1:
            return "merged"
        return "unchanged" if self.sent[0][0] == self.received[0] else "rewritten"


def pair_updates(direct: SessionRecord, proxied: SessionRecord) -> list[Row]:
    """Align the agent's updates (direct run) with the client's (proxied run).

    Rows follow the client's receive order. Per entity, a received update stands for the agent's
    next update(s) of that entity whose fields, applied in order, equal the received fields
    (``_meta`` aside): one update, unless the proxy coalesced several (see ``_absorbed``). After
    a received ``_meta: null``, an update that only restates fields of that update plus a
    ``_meta`` object is the follow-up the proxy inserted to carry its keys after the kept clear.
    """
    session_id = direct.session_id
    pending: dict[str, list[tuple[bytes, JsonObject]]] = {}
    for frame in direct.received:
        update = _update_of(frame)
        if update is not None:
            pending.setdefault(entity_of(update, session_id), []).append((frame.raw, update))
    got = [
        (frame.raw, update, entity_of(update, session_id))
        for frame in proxied.received
        if (update := _update_of(frame)) is not None
    ]
    rows: list[Row] = []
    last_row: dict[str, Row] = {}
    for index, (raw, update, entity) in enumerate(got):
        previous = last_row.get(entity)
        if (
            previous is not None
            and previous.sent
            and previous.received is not None
            and previous.received[1].get("_meta", OMITTED) is None
            and not previous.inserted
            and _is_follow_up(update, previous.sent[-1][1])
            and not _may_stand_for(update, pending.get(entity, []))
        ):
            # Only a kept clear calls for a follow-up: no single `_meta` object can say "clear,
            # then set k" (acp-digest §7.3).
            previous.inserted.append(update)
            continue
        queue_ = pending.get(entity, [])
        following = next((u for _r, u, e in got[index + 1 :] if e == entity), None)
        taken = _absorbed(queue_, update, following)
        row = Row(str(update.get("sessionUpdate")), entity, queue_[:taken], (raw, update))
        del queue_[:taken]
        rows.append(row)
        last_row[entity] = row
    for entity, left in pending.items():
        rows.extend(Row(str(u.get("sessionUpdate")), entity, [(r, u)]) for r, u in left)
    return rows


def _may_stand_for(received: JsonObject, queue_: list[tuple[bytes, JsonObject]]) -> bool:
    """True when ``received`` may be the agent's next update of the entity, annotated.

    Same fields, and a ``_meta`` holding at least the keys the agent's ``_meta`` object names.
    """
    if not queue_ or _without_meta(queue_[0][1]) != _without_meta(received):
        return False
    sent_meta = queue_[0][1].get("_meta", OMITTED)
    got_meta = received.get("_meta", OMITTED)
    if not isinstance(sent_meta, dict):
        return sent_meta is got_meta or sent_meta == got_meta
    return isinstance(got_meta, dict) and all(k in got_meta for k in sent_meta)


def _field_matches(queue_: list[tuple[bytes, JsonObject]], received: JsonObject) -> list[int]:
    """Each ``n`` such that the first ``n`` updates' fields, applied in order, equal ``received``'s.

    v2 patch fields: a later value replaces an earlier one (``_meta`` aside).
    """
    target = _without_meta(received)
    fields: JsonObject = {}
    out: list[int] = []
    for count, (_raw, update) in enumerate(queue_, 1):
        if update.get("sessionUpdate") != received.get("sessionUpdate"):
            break
        fields.update(_without_meta(update))
        if fields == target:
            out.append(count)
    return out


def _absorbed(
    queue_: list[tuple[bytes, JsonObject]], received: JsonObject, following: JsonObject | None
) -> int:
    """How many of the entity's next agent updates ``received`` stands for (0: none).

    Several runs can match when updates carry only a ``_meta``; the run must end the way the
    received ``_meta`` does (a received clear ends with the agent's clear: the RFD keeps "clear,
    then object" as two updates), and it must leave the entity's next received update something
    to stand for. Among those, the longest.
    """
    counts = _field_matches(queue_, received)
    received_meta: Field = received.get("_meta", OMITTED)

    def last_meta(count: int) -> Field:
        metas = [u["_meta"] for _r, u in queue_[:count] if "_meta" in u]
        return metas[-1] if metas else OMITTED

    consistent = [n for n in counts if (last_meta(n) is None) == (received_meta is None)] or counts
    if following is not None:
        leaving = [n for n in consistent if _field_matches(queue_[n:], following)]
        if leaving:
            return leaving[-1]
    return consistent[-1] if consistent else 0


# --------------------------------------------------------------------------------------------
# What the client stores
# --------------------------------------------------------------------------------------------


def _session_messages(record: SessionRecord) -> list[JsonObject]:
    return [f.message for f in record.received if isinstance(f.message, dict)]


def _upserts(record: SessionRecord) -> Iterator[tuple[JsonObject, UpsertSite]]:
    """Each received message that upserts an entity's metadata, with where its `_meta` sits."""
    for message in _session_messages(record):
        site = find_upsert(message, record.negotiated_version)
        if site is not None:
            yield message, site


def final_meta(record: SessionRecord) -> dict[str, JsonValue]:
    """The metadata a v2 client stores per entity after this stream (RFD patch rule).

    Reduces every received message with the client model ``acp_proxy.meta.state.ClientModel``.
    Entities are named as ``entity_of`` names them; ``None`` means no stored metadata (RFD:
    "Stored metadata with no keys is the same as no metadata").
    """
    return _reduce(_session_messages(record), record)


def _reduce(messages: list[JsonObject], record: SessionRecord) -> dict[str, JsonValue]:
    model = ClientModel(record.negotiated_version)
    names: dict[str, EntityKey] = {}
    for message in messages:
        model.apply(message)
        site = find_upsert(message, record.negotiated_version)
        if site is not None:
            names.setdefault(entity_of(site.obj, record.session_id), site.entity)
    return {name: model.meta(key) or None for name, key in names.items()}


def naive_meta(record: SessionRecord) -> dict[str, JsonValue]:
    """What a client stores if a ``_meta`` object replaced the stored object whole.

    That was the rule for v2 upserts before the Metadata Patches RFD (acp-digest §7.1:
    ``if !update.meta.is_undefined() { self.meta = update.meta; }``). Under it, a proxy that adds
    its key to an update sent without ``_meta`` erases the agent's stored keys.
    """
    stored: dict[str, JsonValue] = {}
    for _message, site in _upserts(record):
        name = entity_of(site.obj, record.session_id)
        stored.setdefault(name, None)
        meta: Field = site.obj.get("_meta", OMITTED)
        if meta is not OMITTED:
            stored[name] = meta if isinstance(meta, dict) and meta else None
    return stored


def naive_proxy_meta(record: SessionRecord) -> dict[str, JsonValue]:
    """What the client stores if the proxy had written its keys into the agent's clear.

    Replaces each kept ``_meta: null`` that the proxy followed with its keys by those keys
    alone, as a proxy that "fills in" `_meta` would. The RFD forbids it: "Intermediaries that
    combine updates MUST keep removals and clears"; without the clear, stale keys survive.
    """
    messages: list[JsonObject] = []
    cleared: dict[EntityKey, int] = {}  # entity -> index in messages of its kept clear
    for message in _session_messages(record):
        site = find_upsert(message, record.negotiated_version)
        meta: Field = site.obj.get("_meta", OMITTED) if site is not None else OMITTED
        if site is not None and site.entity in cleared and isinstance(meta, dict):
            index = cleared.pop(site.entity)
            clear = messages[index]
            clear_site = find_upsert(clear, record.negotiated_version)
            if clear_site is not None and _is_follow_up(site.obj, clear_site.obj):
                messages[index] = _with_update_meta(clear, meta)
                continue
        if site is not None:
            cleared.pop(site.entity, None)
            if meta is None:
                cleared[site.entity] = len(messages)
        messages.append(message)
    return _reduce(messages, record)


def _with_update_meta(message: JsonObject, meta: JsonObject) -> JsonObject:
    """A copy of a `session/update` message whose ``update._meta`` is ``meta``."""
    params = message["params"]
    assert isinstance(params, dict)
    update = params["update"]
    assert isinstance(update, dict)
    return {**message, "params": {**params, "update": {**update, "_meta": meta}}}


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


def _compact(value: JsonValue) -> str:
    return orjson.dumps(value).decode()


def _meta_changes(sent: Field, received: Field) -> list[str]:
    """Readable differences between two ``_meta`` fields (omitted, null or object)."""
    if received is OMITTED:
        return ["_meta dropped"] if sent is not OMITTED else []
    if received is None:
        return [] if sent is None else ["_meta: null (a clear)"]
    if not isinstance(received, dict):
        return [f"_meta: {_compact(received)}"]
    before = sent if isinstance(sent, dict) else {}
    out: list[str] = []
    if sent is OMITTED:
        out.append("the agent sent no _meta: a patch with only these keys leaves its keys alone")
    elif sent is None:
        out.append("the clear became an object: stale keys survive")
    for key, value in received.items():
        removal = " (removed)" if value is None else ""
        if key not in before:
            out.append(f"{'-' if removal else '+'} {key}: {_compact(value)}{removal}")
        elif before[key] != value:
            out.append(f"~ {key}: {_compact(before[key])} -> {_compact(value)}{removal}")
    out.extend(f"- {key} (dropped from the update)" for key in before if key not in received)
    return out


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def yellow(self, text: str) -> str:
        return self._wrap("33", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)


def _meta_text(value: JsonValue) -> str:
    return "(none)" if value is None else _compact(value)


def render_text(report: JsonObject, color: bool) -> str:
    """The terminal report of ``build_report``'s content (ANSI colors only when ``color``)."""
    s = _Style(color)
    lines: list[str] = []
    add = lines.append
    add(s.bold("acp-proxy demo") + ": a scripted ACP v2 client and agent, acp-proxy in between")
    add(f"  rules  {report['config']}")
    add(f"  run    {' '.join(map(str, _as_list(report['proxy_command'])))}")
    add("")
    add(f"initialize      protocolVersion {report['protocolVersion']}")
    add(f"session/new     {report['sessionId']}")
    add(f'session/prompt  "{PROMPT_TEXT}"')
    add("")
    add(s.bold("Updates") + "  (agent: what the agent wrote; client: what the client read)")
    rows = [_obj(r) for r in _as_list(report["updates"])]
    width = max((len(str(r["kind"])) for r in rows), default=10)
    for number, row in enumerate(rows, 1):
        add("")
        add(f"{number:>2}  {s.bold(str(row['kind']).ljust(width))}  {row['entity']}")
        for sent in _as_list(row["sent"]):
            add(f"    agent   {_compact(sent)}")
        received = row["received"]
        status = row["status"]
        if status == "unchanged":
            note = "same bytes"
            if isinstance(received, dict) and received.get("_meta", OMITTED) is None:
                note += " (the clear is kept)"
            elif row["kind"] == "plan_update":
                note += " (plan_update is a snapshot, not a patch: left alone)"
            add(f"    client  {s.green(note)}")
        elif status == "missing":
            add(f"    client  {s.red('(not received)')}")
        elif status == "rewritten" and isinstance(received, dict):
            meta = _compact(received["_meta"]) if "_meta" in received else "omitted"
            add(f"    client  {s.yellow('same update, _meta')} {meta}")
            for change in _as_list(row.get("meta_changes", [])):
                add(f"            {s.yellow(str(change))}")
        else:
            add(f"    client  {_compact(received)}")
            if status == "merged":
                merged = f"^ {len(_as_list(row['sent']))} agent updates coalesced into one"
                add(f"            {s.dim(merged)}")
        for inserted in _as_list(row["inserted"]):
            add(f"    client+ {_compact(inserted)}")
            add(
                f"            {s.yellow('^ inserted by the proxy: its keys, after the kept clear')}"
            )
    add("")
    add(s.bold("Stored _meta per entity") + " (client model: acp_proxy.meta.state.ClientModel)")
    final = _obj(report["final_meta"])
    direct = _obj(report["direct_meta"])
    naive = _obj(report["naive_meta"])
    naive_proxy = _obj(report["naive_proxy_meta"])
    for entity, correct in final.items():
        add(f"  {s.bold(entity)}")
        add(f"    agent alone    {_meta_text(direct.get(entity))}")
        add(f"    via acp-proxy  {s.green(_meta_text(correct))}")
        for label, other in (("naive client", naive), ("naive proxy ", naive_proxy)):
            verdict = _naive_verdict(correct, other.get(entity))
            shown = f"    {label}   {_meta_text(other.get(entity))}"
            add(shown + ("  " + s.red(verdict) if verdict else s.dim("  (same)")))
    add("")
    add(
        s.dim("naive client: replaces the stored _meta whole with each object (the rule before the")
    )
    add(
        s.dim("  RFD), so the proxy's keys on an update sent without _meta erase the agent's keys.")
    )
    add(s.dim("naive proxy: writes its keys into the agent's `_meta: null` instead of keeping the"))
    add(s.dim("  clear and following it, so the keys the clear removed survive."))
    summary = _obj(report["summary"])
    add("")
    add(
        f"{summary['agent_updates']} updates from the agent, {summary['client_updates']} to the "
        f"client: {summary['unchanged']} byte-exact, {summary['rewritten']} annotated, "
        f"{summary['inserted']} inserted, {summary['merged']} coalesced."
    )
    return "\n".join(lines) + "\n"


def _naive_verdict(correct: JsonValue, naive: JsonValue) -> str:
    if correct == naive:
        return ""
    ok = correct if isinstance(correct, dict) else {}
    bad = naive if isinstance(naive, dict) else {}
    parts = [f"loses {k}" for k in ok if k not in bad]
    for key, value in bad.items():
        if key not in ok:
            parts.append(f"stores {key}: null" if value is None else f"keeps stale {key}")
        elif value != ok[key]:
            parts.append(f"wrong {key}")
    return "<- " + ", ".join(parts)


def _as_list(value: JsonValue) -> list[JsonValue]:
    return value if isinstance(value, list) else []


def _obj(value: JsonValue) -> JsonObject:
    return value if isinstance(value, dict) else {}


def build_report(
    config: str, proxy_command: Sequence[str], direct: SessionRecord, proxied: SessionRecord
) -> JsonObject:
    """The machine-readable transcript (``--json``); ``render_text`` prints the same content."""
    rows = pair_updates(direct, proxied)
    updates: list[JsonValue] = []
    for row in rows:
        sent: list[JsonValue] = [u for _raw, u in row.sent]
        received = row.received[1] if row.received is not None else None
        item: JsonObject = {
            "kind": row.kind,
            "entity": row.entity,
            "status": row.status,
            "sent": sent,
            "received": received,
            "inserted": list(row.inserted),
        }
        if row.status == "rewritten" and received is not None:
            before: Field = row.sent[0][1].get("_meta", OMITTED)
            item["meta_changes"] = list(_meta_changes(before, received.get("_meta", OMITTED)))
        updates.append(item)
    summary: JsonObject = {
        "agent_updates": sum(len(r.sent) for r in rows),
        "client_updates": sum((r.received is not None) + len(r.inserted) for r in rows),
        "unchanged": sum(r.status == "unchanged" for r in rows),
        "rewritten": sum(r.status == "rewritten" for r in rows),
        "inserted": sum(len(r.inserted) for r in rows),
        "merged": sum(len(r.sent) for r in rows if r.status == "merged"),
    }
    final = final_meta(proxied)
    return {
        "config": config,
        "proxy_command": list(proxy_command),
        "protocolVersion": proxied.negotiated_version,
        "sessionId": proxied.session_id,
        "updates": updates,
        "final_meta": dict(final),
        "direct_meta": dict(final_meta(direct)),
        "naive_meta": dict(naive_meta(proxied)),
        "naive_proxy_meta": dict(naive_proxy_meta(proxied)),
        "summary": summary,
        "transcript": {
            "client_sent": list(proxied.sent),
            "agent_sent": [_frame_json(f) for f in direct.received],
            "client_received": [_frame_json(f) for f in proxied.received],
        },
        "proxy_exit_code": proxied.returncode,
    }


def _frame_json(frame: Frame) -> JsonValue:
    return frame.message if frame.message is not None else frame.raw.decode("utf-8", "replace")


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _bundled_config() -> Iterator[Path]:
    ref = resources.files("acp_proxy") / "data" / "default.yaml"
    with resources.as_file(ref) as path:
        if not path.is_file():
            raise DemoError(f"the bundled rules file is missing: {path}")
        yield path


def _child_env() -> dict[str, str]:
    """The inherited environment, with this very package first on the children's import path."""
    env = dict(os.environ)
    package_parent = str(Path(acp_proxy.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    return env


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acp-proxy demo",
        description=(
            "Run the bundled example rules between a scripted ACP v2 client and a scripted ACP v2 "
            "agent, and show what the agent sent, what the client received, and the metadata the "
            "client stores per entity."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print a machine-readable transcript")
    parser.add_argument(
        "--config", metavar="FILE", help="use these rules instead of the bundled default.yaml"
    )
    parser.add_argument(
        "--pace-ms",
        type=int,
        default=DEFAULT_PACE_MS,
        metavar="N",
        help=(
            "the agent waits N ms after each update so the proxy is never under backpressure "
            f"(default {DEFAULT_PACE_MS}); 0 sends a burst, which the proxy may coalesce"
        ),
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up on a run after this long (default {DEFAULT_TIMEOUT_S:g})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 on success, 1 when the proxy or the agent failed (message on stderr)."""
    args = _parser().parse_args(argv)
    agent = [sys.executable, "-m", "acp_proxy.demo.agent", "--pace-ms", str(args.pace_ms)]
    env = _child_env()
    try:
        with contextlib.ExitStack() as stack:
            if args.config is not None:
                config = Path(args.config)
                if not config.is_file():
                    raise DemoError(f"no such rules file: {config}")
            else:
                config = stack.enter_context(_bundled_config())
            proxy = [sys.executable, "-m", "acp_proxy", "--config", str(config), "--", *agent]
            direct = run_session(agent, env, args.timeout)
            proxied = run_session(proxy, env, args.timeout)
            if proxied.returncode not in (0, None):
                raise DemoError(
                    f"the proxy exited with status {proxied.returncode}"
                    + (f"\n--- its stderr ---\n{proxied.stderr.strip()}" if proxied.stderr else "")
                )
            shown = [
                "acp-proxy",
                "--config",
                _display_path(config),
                "--",
                "python",
                "-m",
                *agent[2:],
            ]
            report = build_report(_display_path(config), shown, direct, proxied)
    except DemoError as exc:
        print(f"acp-proxy demo: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        sys.stdout.write(render_text(report, color))
    sys.stdout.flush()
    return 0


def _display_path(path: Path) -> str:
    """The rules file as shown: relative to the package for the bundled one (stable output)."""
    package = Path(acp_proxy.__file__).resolve().parent
    with contextlib.suppress(ValueError):
        return str(Path("acp_proxy") / path.resolve().relative_to(package))
    return str(path)


if __name__ == "__main__":
    raise SystemExit(main())
