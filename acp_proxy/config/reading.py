"""Reading a config file safely: config files are data unless they say otherwise.

Contract: the file must be a regular file of at most 1 MiB (checked before and after opening,
without blocking on a FIFO or a device); YAML is loaded with a bounded loader (aliases counted and
their expansion bounded, recursion refused, only the core tags); PyYAML's errors are translated
into plain words with the line and a hint. Every refusal is a ``ConfigError``, never a traceback.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any, Final

import yaml
from yaml.nodes import Node

from acp_proxy.config.model import ConfigError, _quote, _size_text

# The YAML core schema's tags (JSON's types), and how an error names a value of each.
_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL = (_TAG + t for t in ("str", "int", "float", "bool", "null"))
_TIMESTAMP = _TAG + "timestamp"
_TAG_NAMES: Final = {
    _STR: "a string",
    _INT: "an integer",
    _FLOAT: "a number",
    _BOOL: "a boolean",
    _TIMESTAMP: "a date",
}

# --- reading the file safely ----------------------------------------------------------------------

# A config file is small: these bounds stop hostile or mistaken input (a YAML "billion laughs", a
# device, a huge file) before it costs memory or time, each with a plain error instead of a
# traceback. Generous for any real config.
MAX_CONFIG_BYTES: Final = 1024 * 1024
MAX_ALIASES: Final = 1000  # alias uses (``*name``) in one file
MAX_ALIAS_NODES: Final = 100_000  # values the aliases add once expanded
MAX_DEPTH: Final = 100  # nesting of mappings and lists
# The longest number (an unquoted int or float) accepted, in characters: no setting needs more
# (a size in bytes fits in 20 digits), and longer ones end in Python's own errors (an int of
# over 4,300 digits cannot be converted; one of over 308 is no float).
MAX_NUMBER_CHARS: Final = 64
_NUMBER_TAGS: Final = frozenset((_TAG + "int", _TAG + "float"))
# Explicit tags allowed: the YAML core schema (JSON's types). Anything else (``!!python/...``,
# ``!!binary``, ``!local``) is refused rather than ignored or constructed.
_CORE_TAGS: Final = frozenset(
    _TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map")
)


class _Refused(Exception):
    """A YAML construct the loader refuses; translated into a ConfigError with its line."""

    def __init__(self, mark: Any, reason: str) -> None:  # a yaml.Mark (two classes) or None
        super().__init__(reason)
        self.mark, self.reason = mark, reason


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader's composer with bounded aliases and nesting, and only the core tags.

    PyYAML composes an alias as a shared reference to the anchored node, so a few hundred bytes
    can describe billions of values once walked, and ``&a [*a]`` describes an infinite one. Here
    each anchored node's expanded size is measured as it is composed; every alias adds it to a
    budget, and an alias to a node still being composed (a cycle) is refused.
    """

    def __init__(self, stream: str) -> None:
        # PyYAML's reader checks the whole text for characters YAML does not allow as it is
        # constructed; its error (no line, a traceback to the caller) is kept for the first
        # read instead, with its line.
        self._unreadable: _Refused | None = None
        try:
            super().__init__(stream)
        except yaml.reader.ReaderError as exc:
            self._unreadable = _unreadable(stream, exc)
        self._aliases = 0
        self._values = 0  # values composed so far, counting each alias at its expanded size
        self._alias_values = 0  # the part the aliases added
        self._sizes: dict[str, int] = {}  # anchor -> expanded size of its node
        self._open: set[str] = set()  # anchors whose node is being composed
        self._depth = 0

    def get_single_node(self) -> Node | None:
        if self._unreadable is not None:
            raise self._unreadable
        return super().get_single_node()

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.ScalarEvent) and len(event.value) > MAX_NUMBER_CHARS:
            self._check_number(event)
        if isinstance(event, yaml.AliasEvent):
            anchor = event.anchor
            if anchor in self._open:
                raise _Refused(
                    event.start_mark,
                    f'recursive alias "*{anchor}": it is inside the value its anchor "&{anchor}" '
                    "names, so the value would be infinite",
                )
            if anchor in self._sizes:
                self._aliases += 1
                if self._aliases > MAX_ALIASES:
                    raise _Refused(
                        event.start_mark,
                        f"too many aliases: more than {MAX_ALIASES} uses of *name in one file",
                    )
                size = self._sizes[anchor]
                self._values += size
                self._alias_values += size
                if self._alias_values > MAX_ALIAS_NODES:
                    raise _Refused(
                        event.start_mark,
                        f"the aliases expand to more than {MAX_ALIAS_NODES} values (a YAML "
                        '"billion laughs"?): write the values out, or use fewer nested aliases',
                    )
            return super().compose_node(parent, index)
        tag = getattr(event, "tag", None)
        if tag is not None and tag != "!" and tag not in _CORE_TAGS:
            shown = "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag
            raise _Refused(
                event.start_mark,
                f"unknown tag {shown}: only the standard YAML tags (!!str, !!int, !!float, "
                "!!bool, !!null, !!seq, !!map) are allowed; remove the tag",
            )
        anchor = getattr(event, "anchor", None)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(
                event.start_mark,
                f"nested too deeply: more than {MAX_DEPTH} levels of lists and mappings",
            )
        start = self._values
        self._values += 1
        if anchor is not None:
            self._open.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open.discard(anchor)
        if anchor is not None:
            self._sizes[anchor] = self._values - start
        return node

    def _check_number(self, event: yaml.ScalarEvent) -> None:
        """Refuse a long unquoted number before PyYAML converts it (a ValueError or an
        OverflowError later, far from its line)."""
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolve(yaml.ScalarNode, event.value, event.implicit)  # type: ignore[no-untyped-call]
        if tag in _NUMBER_TAGS:
            mark = event.start_mark
            column = f" (column {mark.column + 1})" if mark is not None else ""
            raise _Refused(
                mark,
                f"a number written with {len(event.value)} characters{column}: no setting "
                f"takes a number longer than {MAX_NUMBER_CHARS} characters; quote it if it "
                "is meant as text",
            )


def _unreadable(text: str, exc: yaml.reader.ReaderError) -> _Refused:
    """PyYAML's refusal of a character, at its line and column."""
    position = min(max(exc.position, 0), len(text))
    line = text.count("\n", 0, position)
    column = position - (text.rfind("\n", 0, position) + 1)
    code = exc.character if isinstance(exc.character, int) else 0
    what = "a control character" if code < 0x20 or 0x7F <= code <= 0x9F else "a character"
    return _Refused(
        yaml.Mark("<config>", position, line, column, "", 0),
        f"{what} (U+{code:04X}) at column {column + 1}: YAML allows no control "
        "characters but tab, line feed and carriage return; remove it",
    )


def _mark_char(mark: Any) -> str:
    """The character at a YAML mark (a string buffer), or "" when unknown."""
    buffer, pointer = getattr(mark, "buffer", None), getattr(mark, "pointer", None)
    if isinstance(buffer, str) and isinstance(pointer, int) and 0 <= pointer < len(buffer):
        return buffer[pointer]
    return ""


def _plain_yaml_error(exc: yaml.MarkedYAMLError) -> tuple[Any, str] | None:
    """PyYAML's message in plain words with a hint, and the mark to report it at; None when
    the message is not one we know (then it is shown as PyYAML words it)."""
    problem, context = exc.problem or "", exc.context or ""
    mark, start = exc.problem_mark, exc.context_mark
    column = f" (column {mark.column + 1})" if mark is not None else ""
    since = f" on line {start.line + 1}" if start is not None else ""
    if problem.startswith("found character '\\t' that cannot start any token"):
        return mark, (
            f"a tab character{column}: YAML indents with spaces only; replace the tab with spaces"
        )
    m = re.fullmatch(r"found character '(.)' that cannot start any token", problem)
    if m:
        return mark, (
            f"a value cannot start with {_quote(m.group(1))}{column}: quote the value "
            f'("{m.group(1)}...")'
        )
    if problem.startswith("expected <block end>, but found"):
        kind = "list" if "sequence" in context or "collection" in context else "mapping"
        found = problem.removeprefix("expected <block end>, but found ")
        what = "a list item" if "sequence" in found else "a key"
        return mark, (
            f"bad indentation{column}: {what} that does not line up with the {kind} that "
            f'starts{since}; the keys of one mapping, and the "-" of one list, must start in '
            "the same column"
        )
    if "end of stream" in problem and "quoted scalar" in context:
        quote = _mark_char(start) or '"'
        return start, f"unclosed quote: the string that starts with {quote}{since} never ends"
    m = re.fullmatch(r"expected ',' or '([\]}])', but got '(.*)'", problem)
    if m:
        closing = m.group(1)
        opening = "{" if closing == "}" else "["
        if m.group(2) == "<stream end>":
            return start, f'unclosed "{opening}": it has no matching "{closing}"'
        return mark, (
            f'expected "," or "{closing}"{column} in the "{opening}...{closing}" that starts'
            f'{since}: a missing comma, or a missing "{closing}"?'
        )
    if problem == "mapping values are not allowed here":
        return mark, (
            f'unexpected ":"{column}: quote a value that contains ": " ("a: b"), or check '
            "the indentation of this line"
        )
    if problem == "could not find expected ':'":
        return start, (
            'a line without ":" inside a mapping: write KEY: VALUE (or "- " before a list item)'
        )
    if context == "expected a single document in the stream":
        return mark, 'a second YAML document ("---"): a config file holds one document'
    m = re.fullmatch(r"found undefined alias '(.*)'", problem)
    if m:
        name = m.group(1)
        return mark, f"alias *{name} has no anchor: mark an earlier value with &{name}"
    m = re.fullmatch(r"found duplicate anchor '(.*)'; first occurrence", context)
    if m:
        first = f" (first on line {start.line + 1})" if start is not None else ""
        return mark, f"anchor &{m.group(1)} is defined twice{first}: rename one"
    m = re.fullmatch(r"found unknown escape character '(.*)'", problem)
    if m:
        return mark, (
            f"unknown escape \\{m.group(1)}{column} in a double-quoted string: write \\\\ "
            "for a backslash, or use single quotes"
        )
    return None


def _yaml_error(source: str, exc: yaml.MarkedYAMLError) -> ConfigError:
    plain = _plain_yaml_error(exc)
    if plain is not None:
        at, reason = plain
        at = at or exc.problem_mark or exc.context_mark
        return ConfigError(source, at.line + 1 if at is not None else None, None, reason)
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else None
    reason = "invalid YAML"
    if mark is not None:
        reason += f" at column {mark.column + 1}"
    if exc.context and exc.problem and exc.problem.startswith("but "):
        reason += f": {exc.context}, {exc.problem}"  # "expected ..., but found ..."
    else:
        reason += f": {exc.problem or exc.context}"
    if exc.context and exc.problem and not exc.problem.startswith("but "):
        reason += f" ({exc.context}"
        if exc.context_mark is not None and exc.context_mark is not mark:
            reason += f" that starts on line {exc.context_mark.line + 1}"
        reason += ")"
    return ConfigError(source, line, None, reason)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_config_file(path: str) -> bytes:
    """The bytes of the config file at ``path``: a regular file of at most MAX_CONFIG_BYTES.

    A FIFO, device or directory is refused from its ``stat`` without being opened, and the file
    is opened non-blocking (and checked again) so that a path swapped for a FIFO in between
    cannot hang the proxy. Raises ``ConfigError``.
    """

    def refuse(reason: str) -> ConfigError:
        return ConfigError(path, None, None, reason)

    limit = _size_text(MAX_CONFIG_BYTES)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise refuse(f"cannot read the config file: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise refuse(f"the config file is {_kind(st.st_mode)}, not a regular file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise refuse(f"the config file is too large ({st.st_size} bytes; at most {limit})")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise refuse(f"cannot read the config file: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise refuse(f"the config file is {_kind(mode)}, not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise refuse(f"cannot read the config file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > MAX_CONFIG_BYTES:  # it grew after the stat
        raise refuse(f"the config file is too large (more than {limit})")
    return b"".join(chunks)


def writable_by_others(path: str) -> tuple[str, ...]:
    """Warnings when ``path`` or its directory can be changed by other users.

    A config file can name code to import (``use:``), so whoever can write it can run code as
    the proxy's user. A directory with the sticky bit (like /tmp) does not let others replace a
    file they do not own, so only the file's own mode counts there.
    """
    out: list[str] = []
    try:
        mode = os.stat(path).st_mode
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            out.append(f"{path} has mode {stat.filemode(mode)}")
        directory = os.path.dirname(os.path.abspath(path))
        dmode = os.stat(directory).st_mode
        if dmode & (stat.S_IWGRP | stat.S_IWOTH) and not dmode & stat.S_ISVTX:
            out.append(f"its directory {directory} has mode {stat.filemode(dmode)}")
    except OSError:
        pass
    return tuple(out)
