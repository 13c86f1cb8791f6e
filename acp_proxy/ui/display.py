"""Text from a session made safe to display: bidirectional controls shown, not obeyed.

Contract: pure functions. A peer's strings may carry the Unicode controls that reorder the
text around them (the embeddings and overrides U+202A to U+202E, the isolates U+2066 to
U+2069, the marks U+200E and U+200F): shown as they are, ``"\\u202e"`` makes a method name read
as another (Trojan Source, CVE-2021-42574). What the view serves for display (the timeline's
``info``, stderr lines, the entity panel, the session list) has each of them replaced by its
visible escape, the six characters ``\\u202e``; the frame's exact bytes (``raw``, ``sent``),
the exports and the record keep them, and the page escapes them again wherever it shows text.
"""

from __future__ import annotations

from typing import Final

BIDI_CONTROLS: Final = "\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_VISIBLE: Final = {ord(c): f"\\u{ord(c):04x}" for c in BIDI_CONTROLS}
# In encoded JSON the controls appear only inside strings (its syntax is ASCII), as UTF-8;
# their visible escape there is a backslash (escaped: two) and the code point.
_JSON_VISIBLE: Final = tuple(
    (c.encode("utf-8"), f"\\\\u{ord(c):04x}".encode("ascii")) for c in BIDI_CONTROLS
)
_LEAD: Final = b"\xe2"  # the first UTF-8 byte of every one of them


def shown(text: str) -> str:
    """``text`` with each bidirectional control replaced by its visible escape."""
    return text.translate(_VISIBLE)


def shown_json(data: bytes) -> bytes:
    """Encoded JSON whose strings show each bidirectional control as its visible escape."""
    if _LEAD not in data:
        return data
    for raw, visible in _JSON_VISIBLE:
        if raw in data:
            data = data.replace(raw, visible)
    return data
