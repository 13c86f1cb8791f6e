"""The redaction screen (``Redactor.needs_work`` and ``Redactor.clean``, the batch screen of the
live view): it may say "look closer" where nothing is secret, never "nothing to redact" where
the screen it replaced (kept here as the reference) found something."""

from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from acp_proxy.record.redact import DEFAULT_REDACT_PATTERNS, Redactor

R = Redactor.build()
EXTRA = Redactor.build(keys=["sessionKey"], patterns=[r"^zz[0-9]{3}", r"(?<=\n)q{4}\b"])


def reference(redactor: Redactor, raw: bytes) -> bool:
    """The screen as it was: lowered, ``_`` and ``-`` removed, each needle, each pattern."""
    if b"\\u" in raw:
        return True
    norm = raw.lower().replace(b"_", b"").replace(b"-", b"")
    keys = sorted(redactor.keys)
    if any(k.encode() + b'"' in norm for k in keys):
        return True
    if b"=" in norm and any(k.encode() + b"=" in norm for k in keys):
        return True
    return any(re.compile(p.pattern.encode()).search(raw) for p in redactor.patterns)


# Frames built from the pieces secrets are made of: key names in every case and spelling,
# flags, the patterns' prefixes and runs of their characters, quotes, escapes, newlines.
PIECES = [
    '"',
    "=",
    "\\u",
    "\n",
    " ",
    "-",
    "_",
    ":",
    ".",
    "{",
    "}",
    "[",
    "]",
    ",",
    "env",
    "ENV",
    "Env",
    "api_key",
    "API-KEY",
    "apiKey",
    "token",
    "Token",
    "access_token",
    "pass_word",
    "passwd",
    "secret",
    "cookie",
    "credentials",
    "private-key",
    "headers",
    "authorization",
    "session_key",
    "sk-",
    "ghp_",
    "gho_",
    "github_pat_",
    "xoxb-",
    "AKIA",
    "AIza",
    "Bearer",
    "bearer",
    "BEARER",
    "eyJ",
    "zz",
    "qqqq",
    "123",
    "A" * 20,
    "b" * 12,
    "0123456789" * 4,
    "x",
    "é",
    "\x00",
]
frames = st.lists(st.sampled_from(PIECES), max_size=14).map(lambda parts: "".join(parts).encode())


@settings(max_examples=600, deadline=None)
@given(st.lists(frames, min_size=1, max_size=6))
@example([b'{"x":"Bearer ' + b"a" * 20 + b'"}'])
@example([b"sk-" + b"a" * 20, b"b" * 5])
@example([b"ab", b"zz123"])  # an anchored configured pattern: true for the frame alone only
@example([b"ab", b"qqqq"])  # a look-behind on a newline: true for the joined frames only
def test_the_screens_never_miss_what_the_old_one_found(batch: list[bytes]) -> None:
    for redactor in (R, EXTRA):
        old = [reference(redactor, raw) for raw in batch]
        for raw, found in zip(batch, old, strict=True):
            assert redactor.needs_work(raw) == found  # the same answer, frame by frame
        if any(old):
            assert not redactor.clean(batch)


def test_clean_says_clean_for_ordinary_frames() -> None:
    batch = [
        b'{"jsonrpc":"2.0","id":%d,"method":"_bench/echo","params":{"text":"payload"}}' % i
        for i in range(256)
    ]
    assert R.clean(batch)
    assert R.clean([])
    assert not R.clean([*batch, b'{"apiKey":"x"}'])
    assert not EXTRA.clean([*batch, b"zz123"])


def test_every_built_in_pattern_is_screened() -> None:
    samples = [
        "sk-" + "a" * 24,
        "ghp_" + "b" * 36,
        "github_pat_" + "c" * 30,
        "xoxb-" + "d" * 12,
        "AKIA" + "E" * 16,
        "AIza" + "f" * 35,
        "Bearer " + "g" * 20,
        "eyJ" + "h" * 10 + "." + "i" * 10 + "." + "j" * 10,
    ]
    assert len(samples) == len(DEFAULT_REDACT_PATTERNS)
    for sample in samples:
        assert not R.clean([b"{}", sample.encode(), b"{}"])
