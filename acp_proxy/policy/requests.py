"""Request summaries: what a decision reads, built from ACP messages and the state before them.

Contract: owns the per-connection state a summary needs (the agent's name from ``initialize``,
each session's cwd from ``session/new`` / ``session/load`` / ``session/resume``, and the tool
calls' state from ``session/update``: ``kind``, ``title``, ``rawInput``, ``locations``), within
stated bounds (``MAX_SESSIONS``, ``MAX_TOOL_CALLS``: past them the oldest entry goes), and the
summary of each decided method. Pure: resolving links in a path is the ``resolve`` function the
caller passes (the shell gives ``os.path.realpath``; tests give the identity). A message that
cannot be summarised gives ``None``: it is forwarded (``ask``), never dropped.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.policy.globs import normalise
from acp_proxy.policy.model import Request

PERMISSION = "session/request_permission"
READ = "fs/read_text_file"
WRITE = "fs/write_text_file"
TERMINAL = "terminal/create"
# The tool kind each client method stands for, so ``kind:`` rules guard them too.
METHOD_KINDS = {READ: "read", WRITE: "edit", TERMINAL: "execute"}
# Bounds on what peers can make the policy keep: sessions with a known cwd, and tool calls
# whose state is kept.
MAX_SESSIONS = 1024
MAX_TOOL_CALLS = 4096
# ``rawInput`` keys that name a file (Claude's ``file_path``, Gemini's ``absolute_path``...).
PATH_KEYS = ("path", "file_path", "filePath", "absolute_path", "abs_path", "notebook_path")
COMMAND_KEYS = ("command", "cmd")
_TRACKED_FIELDS = ("kind", "title", "rawInput", "locations")
_TRACKED = frozenset(_TRACKED_FIELDS)
# A tool call update with one of these statuses shows that the call ran.
RAN = frozenset({"in_progress", "completed", "failed"})

Resolve = Callable[[str], str]
# What only shlex splits right: quotes, a backslash, and the whitespace it does not split on
# (``str.split`` splits on every Unicode space, shlex on " \t\r\n" only).
_SHELL_SYNTAX = re.compile(r"['\"\\]|[^\S \t\r\n]")


def split_command(command: JsonValue) -> tuple[str, ...] | None:
    """A command as argv: a list of strings as it is, a string shlex-split; ``None`` when it
    is neither or does not split (an unclosed quote)."""
    if isinstance(command, list):
        if command and all(isinstance(c, str) for c in command):
            return tuple(command)  # type: ignore[arg-type]
        return None
    if isinstance(command, str):
        if _SHELL_SYNTAX.search(command) is None:
            argv = tuple(command.split())  # no quote, backslash or odd space: as shlex splits
        else:
            try:
                argv = tuple(shlex.split(command))
            except ValueError:
                return None
        return argv or None
    return None


class Summaries:
    """The state of one connection that summaries need, and the summaries themselves."""

    __slots__ = ("_asked", "_calls", "_pending_new", "_resolve", "_sessions", "agent")

    def __init__(self, resolve: Resolve) -> None:
        self._resolve = resolve
        self.agent: str | None = None
        self._sessions: dict[str, str] = {}  # sessionId -> resolved cwd
        self._pending_new: dict[JsonValue, str] = {}  # session/new request id -> cwd
        self._calls: dict[tuple[str, str], JsonObject] = {}  # (session, toolCallId) -> state
        # Tool calls the agent asked about, or already reported as run without asking.
        self._asked: dict[tuple[str, str], None] = {}

    # -- state

    def initialized(self, response: JsonObject) -> None:
        result = response.get("result")
        if isinstance(result, dict):
            info = result.get("agentInfo", result.get("info"))  # v1 ``agentInfo``, v2 ``info``
            if isinstance(info, dict) and isinstance(info.get("name"), str):
                self.agent = info["name"]  # type: ignore[assignment]

    def _cwd(self, params: JsonObject) -> str | None:
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            return None
        path = normalise(cwd, None)
        return None if path is None else self._resolve(path)

    def session_request(self, message: JsonObject) -> None:
        """A client's ``session/new`` (cwd kept until its response names the session),
        ``session/load`` or ``session/resume`` (the session named)."""
        params = message.get("params")
        if not isinstance(params, dict):
            return
        cwd = self._cwd(params)
        if cwd is None:
            return
        sid = params.get("sessionId")
        if message.get("method") == "session/new":
            _put(self._pending_new, message.get("id"), cwd, MAX_SESSIONS)
        elif isinstance(sid, str):
            _put(self._sessions, sid, cwd, MAX_SESSIONS)

    def waits_for(self, rid: JsonValue) -> bool:
        return rid in self._pending_new

    def session_response(self, message: JsonObject) -> None:
        """The response to a ``session/new``: its session takes the request's cwd."""
        cwd = self._pending_new.pop(message.get("id"), None)
        result = message.get("result")
        if cwd is None or not isinstance(result, dict):
            return
        sid = result.get("sessionId")
        if isinstance(sid, str):
            _put(self._sessions, sid, cwd, MAX_SESSIONS)

    def tool_update(
        self, params: JsonObject, may_deny: Callable[[str | None], bool]
    ) -> Request | None:
        """A ``tool_call`` / ``tool_call_update``: its fields merged into the call's state.
        Returns the call's summary (as a permission request) when this update shows it running
        or done (``status`` ``in_progress``, ``completed`` or ``failed``), the agent never
        asked about it and a deny rule may decide a call of its kind (``may_deny``: else no
        summary is built, its paths are not resolved); once per call."""
        sid, update = params.get("sessionId"), params.get("update")
        if not isinstance(sid, str) or not isinstance(update, dict):
            return None
        state = self._merge(sid, update)
        tid = update.get("toolCallId")
        if update.get("status") not in RAN or not isinstance(tid, str):
            return None
        if (sid, tid) in self._asked:
            return None
        _put(self._asked, (sid, tid), None, MAX_TOOL_CALLS)
        kind = state.get("kind")
        if not may_deny(kind if type(kind) is str else None):
            return None
        return self._tool_call(PERMISSION, sid, state, self._sessions.get(sid), False)

    def asked(self, sid: str, tid: JsonValue) -> None:
        """The agent asked about the tool call ``tid``."""
        if type(tid) is str:
            _put(self._asked, (sid, tid), None, MAX_TOOL_CALLS)

    def _merge(self, sid: str, update: JsonObject) -> JsonObject:
        tid = update.get("toolCallId")
        if not isinstance(tid, str):
            return update
        key = (sid, tid)
        state = self._calls.pop(key, None)
        changes = (
            [n for n in _TRACKED_FIELDS if n in update and update[n] is not None]
            if update.keys() & _TRACKED  # (a request naming the call by its id only: none)
            else ()
        )
        if changes or state is None:  # a new state (a stored one is never changed in place)
            merged: JsonObject = dict(state) if state is not None else {}
            for name in changes:
                merged[name] = update[name]
            state = merged
        calls = self._calls  # ``_put``, inline (the key was popped above)
        calls[key] = state
        if len(calls) > MAX_TOOL_CALLS:
            del calls[next(iter(calls))]
        return state

    def session_cwd(self, sid: JsonValue) -> str | None:
        return self._sessions.get(sid) if isinstance(sid, str) else None

    # -- summaries

    def _paths(self, raw: list[str], cwd: str | None) -> tuple[str, ...]:
        if len(raw) == 1:  # the usual request: one path
            normal = normalise(raw[0], cwd)
            return () if normal is None else (self._resolve(normal),)
        out: list[str] = []
        for path in raw:
            normal = normalise(path, cwd)
            if normal is not None:
                out.append(self._resolve(normal))
        return tuple(dict.fromkeys(out))

    def _tool_call(
        self, method: str, sid: str, call: JsonObject, cwd: str | None, merge: bool
    ) -> Request:
        state = self._merge(sid, call) if merge else call
        raw_input = state.get("rawInput")
        found: list[str] = []
        argv = None
        if isinstance(raw_input, dict):
            for key in PATH_KEYS:
                if isinstance(raw_input.get(key), str):
                    found.append(raw_input[key])  # type: ignore[arg-type]
            for key in COMMAND_KEYS:
                if key in raw_input:
                    argv = split_command(raw_input[key])
                    break
        locations = state.get("locations")
        if isinstance(locations, list):
            for loc in locations:
                if isinstance(loc, dict) and isinstance(loc.get("path"), str):
                    found.append(loc["path"])  # type: ignore[arg-type]
        kind, title = state.get("kind"), state.get("title")
        return Request(
            method,
            kind if isinstance(kind, str) else None,
            argv,
            self._paths(found, cwd),
            title if isinstance(title, str) else None,
            self.agent,
            cwd,
        )

    def summary(self, message: JsonObject) -> Request | None:
        """The summary of an agent's request this policy decides; ``None``: one that cannot be
        read (forwarded as it is). v2 permission requests: the ``subject`` (``tool_call`` or
        ``command``) when present; an unknown subject type gives ``None``."""
        method = message.get("method")
        params = message.get("params")
        if not isinstance(method, str) or not isinstance(params, dict):
            return None
        sid = params.get("sessionId")
        if not isinstance(sid, str):
            return None
        cwd = self._sessions.get(sid)
        if method == PERMISSION:
            if "subject" not in params:  # v1: the tool call
                call = params.get("toolCall")
                if type(call) is not dict:
                    return None
                self.asked(sid, call.get("toolCallId"))
                return self._tool_call(PERMISSION, sid, call, cwd, True)
            return self._permission(params, sid, cwd)
        if method in (READ, WRITE):
            path = params.get("path")
            if not isinstance(path, str):
                return None
            return Request(
                method, METHOD_KINDS[method], None, self._paths([path], cwd), None, self.agent, cwd
            )
        if method == TERMINAL:
            command, args = params.get("command"), params.get("args", [])
            if not isinstance(command, str) or not isinstance(args, list):
                return None
            argv = (command, *args) if args else split_command(command)
            if argv is None or not all(isinstance(a, str) for a in argv):
                return None
            where = params.get("cwd")
            run_in = where if isinstance(where, str) else cwd
            paths = self._paths([run_in], cwd) if run_in else ()
            return Request(method, "execute", argv, paths, None, self.agent, cwd)  # type: ignore[arg-type]
        return None

    def _permission(self, params: JsonObject, sid: str, cwd: str | None) -> Request | None:
        subject = params.get("subject", None)
        if "subject" in params and subject is not None:
            if not isinstance(subject, dict):
                return None
            kind = subject.get("type")
            if kind == "tool_call" and isinstance(subject.get("toolCall"), dict):
                self.asked(sid, subject["toolCall"].get("toolCallId"))  # type: ignore[union-attr]
                return self._tool_call(PERMISSION, sid, subject["toolCall"], cwd, True)  # type: ignore[arg-type]
            if kind == "command":
                self.asked(sid, subject.get("toolCallId"))
                argv = split_command(subject.get("command"))
                where = subject.get("cwd")
                if argv is None or not isinstance(where, str):
                    return None
                title = params.get("title")
                return Request(
                    PERMISSION,
                    "execute",
                    argv,
                    self._paths([where], cwd),
                    title if isinstance(title, str) else None,
                    self.agent,
                    cwd,
                )
            return None  # an unknown subject: the editor decides
        call = params.get("toolCall")
        if isinstance(call, dict):
            self.asked(sid, call.get("toolCallId"))
            return self._tool_call(PERMISSION, sid, call, cwd, True)
        return None


def _put(table: dict, key: object, value: object, bound: int) -> None:  # type: ignore[type-arg]
    """``table[key] = value``, the oldest entry dropped past ``bound`` (insertion order)."""
    table.pop(key, None)
    table[key] = value
    if len(table) > bound:
        del table[next(iter(table))]
