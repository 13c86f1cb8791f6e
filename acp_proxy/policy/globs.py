"""Path patterns: a glob compiled once, a path normalised, a path matched against a glob.

Contract: pure string work (no file system: resolving links is the caller's, see
``policy.requests``). A glob is absolute (``/etc/**``), starts with ``{cwd}`` (the session's
working directory) or ``~`` (the proxy user's home, given at compile time), or starts with
``**`` (any directory, at any depth). ``*`` and ``?`` never cross a ``/``; ``**`` does (a
trailing ``/**`` also matches the directory itself); ``[abc]`` / ``[!abc]`` are character
classes. The regex built has no back-references or look-arounds, and a path is at most
``MAX_PATH_CHARS`` long, which bounds a match's time.

Each glob is translated once and compiled twice: ``Glob.regex`` matches a whole path (the
reference, ``glob_matches``), and ``Glob.fast`` is the same pattern, unanchored at its end, for
the decision's fast path (``policy.fastdecide``), which joins many of them in one alternation.
There a glob that starts with ``**`` (``**/.env``, ``**/*.pem``) is written for the path read
backwards (``Glob.reverse``): it then starts with its literal end, so each alternative that
does not match fails at its first characters instead of trying every ``/`` of the path.
"""

from __future__ import annotations

import posixpath
import re

from acp_proxy.policy.model import Glob

CWD = "{cwd}"
# A path longer than this is not matched (the decision is "ask"): Linux's PATH_MAX.
MAX_PATH_CHARS = 4096


class GlobError(ValueError):
    """A pattern that is not a valid glob (the message says why)."""


class Undecidable(Exception):
    """A condition that cannot be evaluated (a ``{cwd}`` glob in a session whose cwd is
    unknown, a path too long): the request is forwarded to the editor (``ask``)."""


def compile_glob(source: str, home: str | None) -> Glob:
    """The glob ``source`` compiled; ``home`` replaces a leading ``~``. Raises ``GlobError``."""
    if not source:
        raise GlobError("a path glob must not be empty")
    anchor = "/"
    body = source
    if source.startswith(CWD):
        anchor = CWD
        body = source[len(CWD) :]
        if body and not body.startswith("/"):
            raise GlobError(f'"{CWD}" must be followed by "/" or end the glob')
    elif source.startswith("~"):
        if source != "~" and not source.startswith("~/"):
            raise GlobError('"~" is the proxy user\'s home: write "~/..." (not "~user")')
        if not home:
            raise GlobError('"~" needs HOME to be set in the environment')
        body = home.rstrip("/") + source[1:] if home != "/" else source[1:] or "/"
    elif not source.startswith(("/", "**")):
        raise GlobError(
            'a path glob must be absolute, or start with "{cwd}", "~" or "**" '
            f'(for a path in the session\'s directory: "{CWD}/{source}")'
        )
    if CWD in body:
        raise GlobError(f'"{CWD}" may only start a glob')
    units = _units(body)
    reverse = anchor == "/" and bool(units) and units[0][0] == _DSTAR
    fast = units[::-1] if reverse else units
    return Glob(
        source, re.compile(_emit(units) + r"\Z", re.DOTALL), anchor, _emit(fast), reverse,
        _key(fast, reverse),
    )  # fmt: skip


def _key(units: list[_Unit], backward: bool) -> str | None:
    """What a text must start with for the fast regex of ``units`` to match it (``None``: it
    may start with anything): read backwards, its first character; read forwards (a path, or
    the rest after the cwd), its whole first component (``/etc`` for ``/etc/**``), when the
    glob spells it out."""
    literal: list[str] = []
    n = len(units)
    spelled = True  # forwards: the literal reaches the end of the first component
    for i, (kind, text) in enumerate(units):
        if kind != _CHAR:
            spelled = False  # a wildcard: forwards, the first component is not spelled out
            break
        if text == "/" and i + 2 == n and units[i + 1][0] == _DSTAR:
            break  # the final "/**" matches the empty string too: the component ends here
        if text == "/" and i > 0 and not backward:
            break
        literal.append(text)
    if backward:
        return literal[0] if literal else None
    return "".join(literal) if literal and spelled else None


# The units of a glob: one character, ``*``, ``**`` (two stars or more), ``?``, a class.
_CHAR, _STAR, _DSTAR, _ONE, _CLASS = range(5)
_Unit = tuple[int, str]


def _units(body: str) -> list[_Unit]:
    """``body`` as units (a class as its regex). Reading them backwards reads the glob
    backwards: each unit matches the same text either way round."""
    out: list[_Unit] = []
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch == "*":
            j = i
            while j < n and body[j] == "*":
                j += 1
            out.append((_DSTAR if j - i > 1 else _STAR, ""))
            i = j
            continue
        if ch == "?":
            out.append((_ONE, ""))
        elif ch == "[":
            start = i + 1
            if body.startswith("!", start):
                start += 1
            if body.startswith("]", start):  # a "]" first in a class is literal
                start += 1
            end = body.find("]", start)
            if end < 0:
                out.append((_CHAR, ch))
            else:
                inner = body[i + 1 : end]
                negate = inner.startswith("!")
                if negate:
                    inner = inner[1:]
                inner = inner.replace("\\", "\\\\").replace("^", "\\^").replace("[", "\\[")
                out.append((_CLASS, f"[{'^/' if negate else ''}{inner}]"))
                i = end
        else:
            out.append((_CHAR, ch))
        i += 1
    return out


def _emit(units: list[_Unit]) -> str:
    """The regex of ``units``: ``*`` and ``?`` stay within one path component; ``**`` does
    not; ``/**`` at the end is the directory itself and all in it, ``**/`` any directories
    (none too)."""
    out: list[str] = []
    i, n = 0, len(units)
    while i < n:
        kind, text = units[i]
        if kind == _CHAR and text == "/" and i + 2 == n and units[i + 1][0] == _DSTAR:
            out.append("(?:/.*)?")
            break
        if kind == _DSTAR:
            if i + 1 < n and units[i + 1] == (_CHAR, "/"):
                out.append("(?:.*/)?")
                i += 2
                continue
            out.append(".*")
        elif kind == _STAR:
            out.append("[^/]*")
        elif kind == _ONE:
            out.append("[^/]")
        elif kind == _CLASS:
            out.append(text)
        else:
            out.append(re.escape(text))
        i += 1
    return "".join(out)


def normalise(path: str, cwd: str | None) -> str | None:
    """``path`` made absolute against ``cwd`` and normalised (``..``, ``.``, ``//``), without
    touching the file system; ``None`` when it cannot be (relative with no cwd, empty)."""
    if not path:
        return None
    if path[0] == "/" and "//" not in path and "/." not in path and path[-1] != "/":
        return path  # already normal (no "//", ".", ".." nor trailing "/")
    if not path.startswith("/"):
        if cwd is None or not cwd.startswith("/"):
            return None
        path = posixpath.join(cwd, path)
    out = posixpath.normpath(path)
    return "/" + out.lstrip("/") if out.startswith("//") else out


def rest_of(path: str, cwd: str) -> str | None:
    """The part of the absolute normalised ``path`` after ``cwd`` (``""``: the cwd itself,
    ``"/..."`` below it); ``None``: not under it."""
    base = cwd.rstrip("/")
    if path in (cwd, base):
        return ""
    if path.startswith(base + "/"):
        return path[len(base) :]
    return None


def glob_matches(glob: Glob, path: str, cwd: str | None) -> bool:
    """Whether the absolute normalised ``path`` matches ``glob`` in a session whose working
    directory is ``cwd``. Raises ``Undecidable`` (a ``{cwd}`` glob with no cwd, a path over
    ``MAX_PATH_CHARS``)."""
    if len(path) > MAX_PATH_CHARS:
        raise Undecidable(f"a path of {len(path)} characters")
    if glob.anchor == "/":
        return glob.regex.match(path) is not None
    if cwd is None:
        raise Undecidable(f"{glob.source}: the session's cwd is not known")
    rest = rest_of(path, cwd)
    return rest is not None and glob.regex.match(rest) is not None
