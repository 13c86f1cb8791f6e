"""Non-JSON agent output: what an agent line that cannot be a frame becomes.

Contract: owns the fate of agent stdout lines that cannot be a frame (``prefilter.FRAME_STARTS``,
``rawjson.could_be_frame``): diverted to the log (a ``NonJson`` note, ``first_of_kind`` so the
shell warns once per kind and then counts) or forwarded as they are, per ``NonJsonPolicy``. A
line that is terminal escape sequences followed by a JSON message is split: the escape prefix
is diverted and the message goes on (to the line path's ``parsed``). Client frames are never
diverted (the agent answers a malformed one with -32700, ACP digest §1.2). Pure, no I/O.
"""

from __future__ import annotations

import re
from typing import Protocol

from acp_proxy.wire.chain import Direction
from acp_proxy.wire.coalesce.queue import OutFrame
from acp_proxy.wire.connection.connstate import ConnState
from acp_proxy.wire.connection.unparsed import ParseBudget
from acp_proxy.wire.core_settings import NonJsonPolicy
from acp_proxy.wire.notes import NonJson, Note, Result
from acp_proxy.wire.raw import rawjson

# How much of a diverted non-JSON line a note carries for the log.
SAMPLE_BYTES = 200

# Kinds of non-JSON agent output (``NonJson.kind``).
KIND_ANSI = "ansi-escape"  # contains a terminal escape sequence (ESC, 0x1b)
KIND_TEXT = "text"  # anything else that cannot be a frame: a banner, a log line, a scalar


# A leading run of terminal escape sequences (CSI, OSC, two-byte ESC) and whitespace.
_ANSI_PREFIX = re.compile(
    rb"(?:\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|[ \t\r])+"
)
_A2C = Direction.AGENT_TO_CLIENT


class ParsedPath(Protocol):
    """Where a parsed frame goes on (``lines.Lines.parsed``)."""

    def __call__(
        self,
        direction: Direction,
        raw: bytes,
        parsed: object,
        interested: tuple[bool, ...] | None,
        notes: tuple[Note, ...],
    ) -> Result: ...


class Diversion:
    """The non-JSON policy of one connection and the kinds it has already reported."""

    __slots__ = ("_budget", "_kinds_seen", "_parsed", "_policy", "_state", "_stats")

    def __init__(
        self, state: ConnState, budget: ParseBudget, policy: NonJsonPolicy, parsed: ParsedPath
    ) -> None:
        self._state = state
        self._budget = budget
        self._parsed = parsed  # where a message found behind escape sequences goes on
        self._policy = policy
        self._stats = state.stats
        self._kinds_seen: set[str] = set()

    def odd_line(self, raw: bytes) -> Result:
        """An agent line that cannot be a frame (``rawjson.could_be_frame``): diverted, no parse.

        One exception: terminal escape sequences followed by a frame (a coloured logger that
        wrapped a message); the escapes are diverted and the message goes on.
        """
        if b"\x1b" in raw:
            if self._policy is NonJsonPolicy.LOG:
                match = _ANSI_PREFIX.match(raw)
                rest = raw[match.end() :] if match else b""
                if rawjson.could_be_frame(rest):
                    parsed = self._budget.parse(rest)
                    if isinstance(parsed, (dict, list)):
                        # An escape sequence before the JSON: divert it, keep the message.
                        prefix = raw[: len(raw) - len(rest)]
                        note = self._note(KIND_ANSI, prefix, forwarded=False)
                        self._stats.diverted += 1
                        interested = self._state.interested(rest)
                        return self._parsed(_A2C, rest, parsed, interested, (note,))
            return self._non_json(raw, KIND_ANSI, ())
        return self._non_json(raw, KIND_TEXT, ())

    def _non_json(self, raw: bytes, kind: str, notes: tuple[Note, ...]) -> Result:
        forwarded = self._policy is NonJsonPolicy.FORWARD
        note = self._note(kind, raw, forwarded=forwarded)
        if forwarded:
            self._stats.agent_to_client_out += 1
            return Result((OutFrame(raw, None, self._state.version),), (), (*notes, note))
        self._stats.diverted += 1
        return Result((), (), (*notes, note))

    def _note(self, kind: str, raw: bytes, *, forwarded: bool) -> NonJson:
        first = kind not in self._kinds_seen
        if first:
            self._kinds_seen.add(kind)
        return NonJson(kind, len(raw), raw[:SAMPLE_BYTES], first, forwarded)
