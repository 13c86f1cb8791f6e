"""The audit file's lines: one hash-chained JSON line per decision, and the chain's check.

Contract: pure. ``audit_line`` builds a line (without its newline) from a decision, the time
the shell read and the SHA-256 of the line before (``GENESIS`` for the first line of a file);
``verify`` walks a file's lines and names the first one that breaks the chain: not a JSON
object, no ``prev``, or a ``prev`` that is not the SHA-256 of the line before it (exactly its
bytes, without the newline). A line changed, removed or inserted breaks the chain at the line
after it; the last line is covered by nothing after it, so ``verify`` reports its hash, to be
kept elsewhere (a ticket, a log) when the end of the file must be provable too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import orjson

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.base.values import value

GENESIS = "0" * 64


def line_hash(line: bytes) -> str:
    """The SHA-256 (hex) of one line's bytes, without its newline."""
    return hashlib.sha256(line).hexdigest()


def audit_line(entry: JsonObject, *, time: str, policy: str, prev: str) -> bytes:
    """One audit line: ``time`` first, the entry's fields, the policy's hash, ``prev`` last."""
    return orjson.dumps({"time": time, **entry, "policy": policy, "prev": prev})


@value
class Checked:
    """What ``verify`` found: ``broken`` is the 1-based number of the first line that breaks
    the chain (``None``: intact), with ``reason``; ``lines`` read; ``last``: the hash of the
    last intact line (``GENESIS`` for an empty file)."""

    broken: int | None
    reason: str
    lines: int
    last: str


def verify(lines: Iterable[bytes]) -> Checked:
    """Check the chain of an audit file's ``lines`` (each with or without its newline)."""
    expected = GENESIS
    count = 0
    for number, raw in enumerate(lines, 1):
        count = number
        line = raw[:-1] if raw.endswith(b"\n") else raw
        try:
            parsed = orjson.loads(line)
        except orjson.JSONDecodeError:
            return Checked(number, "not a JSON line", number - 1, expected)
        if not isinstance(parsed, dict) or not isinstance(parsed.get("prev"), str):
            return Checked(number, 'not an audit line (no "prev")', number - 1, expected)
        if parsed["prev"] != expected:
            what = "the start of the chain" if number == 1 else f"line {number - 1}"
            return Checked(number, f'"prev" is not the SHA-256 of {what}', number - 1, expected)
        expected = line_hash(line)
    return Checked(None, "", count, expected)


def last_hash(tail: bytes) -> str | None:
    """The hash a new line must name as ``prev`` after ``tail``, the end of an existing file
    (at least its whole last line); ``None``: the file does not end with a whole line."""
    if not tail:
        return GENESIS
    if not tail.endswith(b"\n"):
        return None
    body = tail[:-1]
    start = body.rfind(b"\n") + 1
    return line_hash(body[start:])
