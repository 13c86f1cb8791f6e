"""Terminal-safe text: what a record holds, made visible instead of executed.

Contract: pure. ``visible`` turns a string from a record (an agent's method name, an error
message, an id, a file name) into text that a terminal prints as it is: every control character
(C0, DEL, C1), the Unicode bidirectional controls and the line/paragraph separators become a
visible escape (``\\x1b``, ``\\u202e``), so ESC/OSC/CSI sequences never move the cursor, set the
title or clear lines. ``safe_json`` is ``json.dumps`` whose output holds none of them raw (they
are ``\\uXXXX`` escapes in the JSON strings, still the same JSON value). Nothing else changes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Final

# C0 (with TAB, LF and CR: a record's string never spans terminal lines), DEL, C1; the bidi
# embeddings, overrides and isolates and the marks (which reorder what a reader sees); the
# Unicode line and paragraph separators.
_UNSAFE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


# What ``json.dumps`` leaves raw in strings (it escapes C0 there; its own indentation is C0).
_UNSAFE_IN_JSON: Final = re.compile(
    "[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def _hex(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def visible(text: str) -> str:
    """``text`` with each unsafe character written as a visible escape."""
    return _UNSAFE.sub(_hex, text) if _UNSAFE.search(text) else text


def safe_json(value: Any, **kwargs: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **kwargs)`` with no unsafe character left raw.

    In that output the C0 controls are already escaped; the others (DEL, C1, bidi controls,
    separators) can only stand inside strings, where ``\\uXXXX`` means the same character.
    """
    text = json.dumps(value, ensure_ascii=False, **kwargs)
    return _UNSAFE_IN_JSON.sub(_json_escape, text) if _UNSAFE_IN_JSON.search(text) else text


def safe_json_chunks(value: Any, **kwargs: Any) -> Iterator[str]:
    """``safe_json`` in pieces, for writing a large value without building its whole text."""
    encoder = json.JSONEncoder(ensure_ascii=False, **kwargs)
    for chunk in encoder.iterencode(value):
        yield _UNSAFE_IN_JSON.sub(_json_escape, chunk) if _UNSAFE_IN_JSON.search(chunk) else chunk
