"""Redaction: secrets removed from a frame's text before it is recorded or logged.

Contract: pure. ``Redactor.frame`` takes a frame's bytes and gives the bytes to keep: a frame
with nothing to redact is returned as it is (byte-exact); otherwise each value under a secret
key (any depth, every occurrence of a duplicated key), each ``{"name": <secret key>, "value":
...}`` pair's value, each secret flag's value in a list of strings (``--api-key X``,
``--token=X``, ``API_KEY=X``) and each secret-looking substring becomes ``[REDACTED]``, the
shape kept (an MCP server's ``env`` stays a list of ``{name, value}``, ``headers`` too), so a
redacted frame stays valid JSON that its schema accepts. Frames that are not UTF-8 or start
with a byte order mark are redacted as well (their other bytes kept). The built-in patterns run
in linear time. The wire is never touched: the proxy forwards its own copy of each frame.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import field
from typing import Final

from acp_proxy.base.values import value

REDACTED: Final = "[REDACTED]"

# Key names whose values are never written (compared without case, `_` and `-`; a key matches
# when it is one of these or ends with one: ``accessToken``, ``x-api-key``, ``clientSecret``).
DEFAULT_REDACT_KEYS: Final[tuple[str, ...]] = (
    "env",
    "headers",
    "authorization",
    "apikey",
    "token",
    "password",
    "passwd",
    "secret",
    "cookie",
    "credential",
    "credentials",
    "privatekey",
)
# Secret-looking strings, replaced wherever they appear in a string value. Each runs in linear
# time: a token may start only where a run of its characters starts (the look-behind, placed
# after the literal prefix so that the engine still searches for that prefix first), and a run
# is never given back (possessive quantifiers), so a long run that is not a token costs one
# pass (a JWT pattern without both cost 20 s on 240,000 characters of "eyJ").
DEFAULT_REDACT_PATTERNS: Final[tuple[str, ...]] = (
    r"sk-(?<![A-Za-z0-9_\-]sk-)[A-Za-z0-9_\-]{20,}+",  # OpenAI / Anthropic style API keys
    r"gh[pousr]_(?<![A-Za-z0-9_]gh[pousr]_)[A-Za-z0-9]{30,}+",  # GitHub tokens
    r"github_pat_(?<![A-Za-z0-9_]github_pat_)[A-Za-z0-9_]{30,}+",
    r"xox[abprs]-(?<![A-Za-z0-9_\-]xox[abprs]-)[A-Za-z0-9\-]{10,}+",  # Slack
    r"AKIA[0-9A-Z]{16}",  # AWS access key ids
    r"AIza[0-9A-Za-z_\-]{35}",  # Google API keys
    r"(?:Bearer|bearer|BEARER)(?<![A-Za-z0-9_][Bb][Ee][Aa][Rr][Ee][Rr])\s++"
    r"[A-Za-z0-9._~+/\-]{16,}+=*+",
    r"eyJ(?<![A-Za-z0-9_\-]eyJ)[A-Za-z0-9_\-]{10,}+\.[A-Za-z0-9_\-]{10,}+\.[A-Za-z0-9_\-]{10,}+",
)

# What each built-in pattern cannot match without (a literal it holds): the screen looks for the
# literal first where the pattern's own search would not (an alternation has no literal prefix).
_GATES: Final[dict[str, tuple[bytes, ...]]] = {
    p: (b"earer", b"EARER") for p in DEFAULT_REDACT_PATTERNS if p.startswith("(?:Bearer|")
}
# ASCII letters lowered (what ``bytes.lower`` does), in one pass with the deletion of _ and -.
_LOWER: Final = bytes(c + 32 if 65 <= c <= 90 else c for c in range(256))
_JOIN: Final = b"\n"

# What a frame that needs redaction but cannot be walked (nested too deep) is recorded as.
UNREADABLE = b'"[REDACTED: a frame too deeply nested to redact key by key]"'
BOM: Final = b"\xef\xbb\xbf"


def _norm(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "")


class _Pairs(list[tuple[str, object]]):
    """A JSON object as its pairs, in order, duplicates kept."""


class _Number(str):
    """A JSON number that is not an integer, kept as written."""


def _parse(text: str) -> object:
    return json.loads(text, object_pairs_hook=_Pairs, parse_float=_Number, parse_constant=_Number)


def _dump(node: object, out: list[str]) -> None:
    if isinstance(node, _Pairs):
        out.append("{")
        for i, (key, item) in enumerate(node):
            out.append(("," if i else "") + json.dumps(key, ensure_ascii=False) + ":")
            _dump(item, out)
        out.append("}")
    elif isinstance(node, list):
        out.append("[")
        for i, item in enumerate(node):
            if i:
                out.append(",")
            _dump(item, out)
        out.append("]")
    elif isinstance(node, _Number):
        out.append(str.__str__(node))
    else:
        out.append(json.dumps(node, ensure_ascii=False))


@value
class Redactor:
    """Removes secrets from a frame's text before it is recorded or logged (see the module
    docstring). A frame that is not JSON gets the patterns only."""

    keys: frozenset[str]
    patterns: tuple[re.Pattern[str], ...]
    # The cheap screen that decides whether a frame needs parsing at all (most do not): each
    # key name followed by the quote that ends a JSON string (or by ``=``, a flag, when the
    # frame has one), looked for in the frame lowercased without ``_`` and ``-``; each pattern
    # on the bytes (separate searches: one alternation of them is several times slower, it
    # loses each pattern's literal prefix); a ``\u`` escape, which could hide either.
    _key_needles: tuple[bytes, ...] = field(repr=False)
    _flag_needles: tuple[bytes, ...] = field(repr=False)  # ``token=``: looked for after ``=``
    # Each pattern with the literals it cannot match without (empty: none known), split in the
    # built-in ones, which match in frames joined by newlines exactly where they match in one
    # of the frames (``clean``), and the configured ones, which may not (anchors, look-arounds).
    _joinable: tuple[tuple[tuple[bytes, ...], re.Pattern[bytes]], ...] = field(repr=False)
    _alone: tuple[re.Pattern[bytes], ...] = field(repr=False)

    @classmethod
    def build(cls, keys: Iterable[str] = (), patterns: Iterable[str] = ()) -> Redactor:
        """The redactor for the defaults plus ``keys`` and ``patterns`` (``re.error`` if bad)."""
        all_keys = frozenset(_norm(k) for k in (*DEFAULT_REDACT_KEYS, *keys) if k)
        extra = tuple(patterns)
        sources = (*DEFAULT_REDACT_PATTERNS, *extra)

        def compiled(source: str) -> re.Pattern[bytes]:
            return re.compile(source.encode("utf-8", "surrogateescape"))

        return cls(
            all_keys,
            tuple(re.compile(p) for p in sources),
            tuple(k.encode() + b'"' for k in sorted(all_keys)),
            tuple(k.encode() + b"=" for k in sorted(all_keys)),
            tuple((_GATES.get(p, ()), compiled(p)) for p in DEFAULT_REDACT_PATTERNS),
            tuple(compiled(p) for p in extra),
        )

    def needs_work(self, raw: bytes) -> bool:
        """Whether ``raw`` may hold something to redact (False: it certainly does not)."""
        return self._maybe(raw) or any(p.search(raw) for p in self._alone)

    def clean(self, raws: Sequence[bytes]) -> bool:
        """True when none of ``raws`` holds anything to redact (False: some may): the screen of
        ``needs_work`` run once on them all, joined by newlines, rather than once per frame.

        Exact: a key, a flag or a ``\\u`` found in a frame is found in the joined bytes, and so
        is a match of a built-in pattern (none has an anchor or a look-ahead, a newline ends
        each of their runs but the whitespace after ``Bearer``, which a token must follow, and
        a newline satisfies each look-behind as the start of the frame did); a configured
        pattern, which may not be so, still runs on each frame alone."""
        if not raws:
            return True
        joined = raws[0] if len(raws) == 1 else _JOIN.join(raws)
        if self._maybe(joined):
            return False
        alone = self._alone
        return not alone or not any(p.search(raw) for raw in raws for p in alone)

    def _maybe(self, raw: bytes) -> bool:
        """The screen of the keys, the flags, a ``\\u`` escape and the built-in patterns."""
        if b"\\u" in raw:
            return True
        norm = raw.translate(_LOWER, b"_-")
        for needle in self._key_needles:
            if needle in norm:
                return True
        if b"=" in norm:
            for needle in self._flag_needles:
                if needle in norm:
                    return True
        for gates, pattern in self._joinable:
            if gates and not any(gate in raw for gate in gates):
                continue
            if pattern.search(raw):
                return True
        return False

    def key_matches(self, key: str) -> bool:
        k = _norm(key)
        return any(k == name or k.endswith(name) for name in self.keys)

    def text(self, value: str) -> str:
        for pattern in self.patterns:
            value = pattern.sub(REDACTED, value)
        return value

    def frame(self, raw: bytes) -> tuple[bytes, bool]:
        """``raw`` with its secrets removed, and whether anything was."""
        if not self.needs_work(raw):
            return raw, False
        bom = raw.startswith(BOM)
        body = raw[len(BOM) :] if bom else raw
        # Bytes that are not UTF-8 stand for themselves (surrogate escapes), so the rest of
        # the frame is still read, redacted and written back as it was.
        text = body.decode("utf-8", "surrogateescape")
        try:
            parsed = _parse(text)
        except RecursionError:
            # Nested deeper than the parser goes, and it names a secret-looking key or holds a
            # secret-looking string: nothing of it is kept (still valid JSON: a string).
            return UNREADABLE, True
        except ValueError:
            cleaned = self.text(text)
            if cleaned == text:
                return raw, False
            return (BOM if bom else b"") + _encode(cleaned), True
        try:
            redacted, changed = self._value(parsed)
            if not changed:
                return raw, False
            out: list[str] = []
            _dump(redacted, out)
        except RecursionError:
            return UNREADABLE, True
        return (BOM if bom else b"") + _encode("".join(out)), True

    def _secret(self, node: object) -> tuple[object, bool]:
        """``node`` under a secret key: every string and number replaced, the shape kept."""
        if isinstance(node, _Pairs):
            out = _Pairs()
            changed = False
            pair = _is_pair(node)
            for key, item in node:
                if pair and key == "name":
                    out.append((key, item))
                    continue
                new, c = self._secret(item)
                out.append((key, new))
                changed = changed or c
            return out, changed
        if isinstance(node, list):
            items = [self._secret(item) for item in node]
            return [new for new, _ in items], any(c for _, c in items)
        if node is None or isinstance(node, bool):
            return node, False
        return REDACTED, True

    def _value(self, node: object) -> tuple[object, bool]:
        if isinstance(node, str) and not isinstance(node, _Number):
            cleaned = self.text(node)
            return cleaned, cleaned != node
        if isinstance(node, _Pairs):
            out = _Pairs()
            changed = False
            secret_pair = _is_pair(node) and self._secret_name(node)
            for key, item in node:
                if (self.key_matches(key) or (secret_pair and key == "value")) and item is not None:
                    new, c = self._secret(item)
                else:
                    new, c = self._value(item)
                out.append((key, new))
                changed = changed or c
            return out, changed
        if isinstance(node, list):
            items: list[object] = []
            changed = False
            secret_next = False
            for item in node:
                if secret_next and isinstance(item, str):
                    new, c = REDACTED, True
                    secret_next = False
                elif isinstance(item, str) and not isinstance(item, _Number):
                    new, c, secret_next = self._argument(item)
                else:
                    new, c = self._value(item)
                    secret_next = False
                items.append(new)
                changed = changed or c
            return items, changed
        return node, False

    def _secret_name(self, pair: _Pairs) -> bool:
        names = [item for key, item in pair if key == "name"]
        return any(isinstance(n, str) and self.key_matches(n) for n in names)

    def _argument(self, item: str) -> tuple[str, bool, bool]:
        """One string of a list, as a command line argument: ``(kept, changed, the next one is
        a secret)``. ``--token=X`` and ``API_KEY=X`` keep their name; ``--token`` alone makes
        the next argument the secret."""
        name, eq, _ = item.partition("=")
        flag = name.lstrip("-")
        if eq and flag and (name.startswith("-") or _ENV_NAME.fullmatch(name)):
            if self.key_matches(flag):
                return f"{name}={REDACTED}", True, False
        elif name.startswith("-") and flag and self.key_matches(flag):
            cleaned = self.text(item)
            return cleaned, cleaned != item, True
        cleaned = self.text(item)
        return cleaned, cleaned != item, False


_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _is_pair(node: _Pairs) -> bool:
    keys = {key for key, _ in node}
    return "name" in keys and "value" in keys


def _encode(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate from a ``\\ud800`` escape: keep it escaped
        return text.encode("utf-8", "backslashreplace")
