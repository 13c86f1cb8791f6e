"""Path patterns: a glob compiled once, a path normalised, a path matched against a glob.

Contract: pure string work (no file system: resolving links is the caller's, see
``policy.requests``). A glob is absolute (``/etc/**``), starts with ``{cwd}`` (the session's
working directory) or ``~`` (the proxy user's home, given at compile time), or starts with
``**`` (any directory, at any depth). ``*`` and ``?`` never cross a ``/``; ``**`` does (a
trailing ``/**`` also matches the directory itself); ``[abc]`` / ``[!abc]`` are character
classes. The regex built has no back-references or look-arounds, and a path is at most
``MAX_PATH_CHARS`` long, which bounds a match's time.
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
    return Glob(source, re.compile(_translate(body), re.DOTALL), anchor)


def _translate(body: str) -> str:
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch == "/" and body[i + 1 :].strip("*") == "" and body.startswith("/**", i):
            out.append("(?:/.*)?")  # "dir/**": the directory itself and everything in it
            break
        if ch == "*":
            if body.startswith("**", i):
                i += 2
                while i < n and body[i] == "*":  # "***" is "**"
                    i += 1
                if i < n and body[i] == "/":
                    out.append("(?:.*/)?")
                    i += 1
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            start = i + 1
            if body.startswith("!", start):
                start += 1
            if body.startswith("]", start):  # a "]" first in a class is literal
                start += 1
            end = body.find("]", start)
            if end < 0:
                out.append(re.escape(ch))
            else:
                inner = body[i + 1 : end]
                negate = inner.startswith("!")
                if negate:
                    inner = inner[1:]
                inner = inner.replace("\\", "\\\\").replace("^", "\\^").replace("[", "\\[")
                out.append(f"[{'^/' if negate else ''}{inner}]")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out) + r"\Z"


def normalise(path: str, cwd: str | None) -> str | None:
    """``path`` made absolute against ``cwd`` and normalised (``..``, ``.``, ``//``), without
    touching the file system; ``None`` when it cannot be (relative with no cwd, empty)."""
    if not path:
        return None
    if not path.startswith("/"):
        if cwd is None or not cwd.startswith("/"):
            return None
        path = posixpath.join(cwd, path)
    out = posixpath.normpath(path)
    return "/" + out.lstrip("/") if out.startswith("//") else out


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
    base = cwd.rstrip("/")
    if path in (cwd, base):
        rest = ""
    elif path.startswith(base + "/"):
        rest = path[len(base) :]
    else:
        return False
    return glob.regex.match(rest) is not None
