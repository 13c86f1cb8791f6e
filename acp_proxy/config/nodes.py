"""Reading YAML nodes into values, with their positions: the parser's vocabulary.

Contract: ``NodeReader`` turns one composed YAML node into one value of a known kind (a mapping
with known keys, a list, a string with ``${VAR}`` expanded, a boolean, an integer, a size, a
duration, a choice, a JSON value, an address, an environment) or raises a ``ConfigError`` that
names the file, the line, the path inside the document (``rules[1].set_meta``) and what would be
valid, with a did-you-mean suggestion. ``collecting`` records an error and carries on, so that one
run reports every independent mistake of a file. It knows no setting: what each key holds is
declared in ``config.schema`` and checked across keys in ``config.checks``.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.config.kinds import _SIZE, _SIZE_UNITS, SIZE_HELP, Kind, Setting
from acp_proxy.config.model import ConfigError, _quote
from acp_proxy.config.reading import (
    _BOOL,
    _FLOAT,
    _INT,
    _NULL,
    _STR,
    _TAG,
    _TAG_NAMES,
    _TIMESTAMP,
)
from acp_proxy.record.patterns import backtracking_risk

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_size(text: str) -> int | None:
    """The byte count ``text`` names ("64MiB", "64 mb", "64k", "1024"), or None if it names
    none (a positive value is not checked here)."""
    m = _SIZE.fullmatch(text)
    if m is None:
        return None
    factor = _SIZE_UNITS.get(m.group(2).lower())
    return None if factor is None else int(m.group(1)) * factor


_ADDRESS_HELP = 'an address such as "tcp://127.0.0.1:7777" or "unix:///run/acp.sock"'

_E = TypeVar("_E", bound=enum.StrEnum)


def _join(path: str, key: str) -> str:
    """``rules[0].set_meta`` + ``example.dev/x`` -> ``rules[0].set_meta["example.dev/x"]``."""
    if _IDENT.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{_quote(key)}]"


def _choices(values: Sequence[str]) -> str:
    return ", ".join(_quote(v) for v in values)


def _suggest(word: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, valid, n=1, cutoff=0.6)
    return f'; did you mean "{close[0]}"?' if close else ""


def _unknown(what: str, word: str, valid: Sequence[str], listing: str) -> str:
    """``unknown key "x"; did you mean "y"? Valid keys: ...`` (the question only when close)."""
    suggestion = _suggest(word, valid)
    return f"unknown {what} {_quote(word)}{suggestion or '.'} {listing}"


def _describe(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == _NULL:
        return "null"
    name = _TAG_NAMES.get(node.tag)
    if name is None:
        tag = "!!" + node.tag.removeprefix(_TAG) if node.tag.startswith(_TAG) else node.tag
        return f"a value tagged {tag}"
    return f"{name} ({_quote(node.value) if node.tag == _STR else node.value})"


class NodeReader:
    """Reads the nodes of one composed YAML document (one per file), recording its errors."""

    def __init__(self, source: str, loader: yaml.SafeLoader, environ: Mapping[str, str]) -> None:
        self.source = source
        self.loader = loader
        self.environ = environ
        # Every independent mistake is recorded here and parsing goes on, so that one run
        # reports all of a file's errors, not just the first.
        self.errors: list[ConfigError] = []

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """Record a ``ConfigError`` raised in the block and carry on after it."""
        try:
            yield
        except ConfigError as exc:
            self.errors.extend(exc.errors)

    # -- errors

    def error(self, node: Node, path: str | None, reason: str) -> ConfigError:
        return ConfigError(self.source, node.start_mark.line + 1, path or None, reason)

    def wrong_type(self, node: Node, path: str, expected: str) -> ConfigError:
        return self.error(node, path, f"expected {expected}, got {_describe(node)}")

    # -- containers

    def mapping(
        self, node: Node, path: str, valid: Sequence[str], *, allow_null: bool = True
    ) -> dict[str, tuple[ScalarNode, Node]]:
        """The entries of a mapping with known keys (unknown keys are errors)."""
        if allow_null and isinstance(node, ScalarNode) and node.tag == _NULL:
            return {}
        if not isinstance(node, MappingNode):
            raise self.wrong_type(node, path, f"a mapping with keys {', '.join(valid)}")
        out: dict[str, tuple[ScalarNode, Node]] = {}
        for key_node, value_node in self.pairs(node, path):
            key = key_node.value
            if key not in valid:
                self.errors.append(
                    self.error(
                        key_node,
                        _join(path, key),
                        _unknown("key", key, valid, f"Valid keys: {', '.join(valid)}"),
                    )
                )
                continue
            out[key] = (key_node, value_node)
        return out

    def pairs(self, node: MappingNode, path: str) -> list[tuple[ScalarNode, Node]]:
        """A mapping's (key, value) nodes with string keys, merges (``<<``) applied, no dupes."""
        self.loader.flatten_mapping(node)
        seen: dict[str, int] = {}
        out: list[tuple[ScalarNode, Node]] = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag != _STR:
                self.errors.append(
                    self.error(key_node, path, f"keys must be strings, got {_describe(key_node)}")
                )
                continue
            key = key_node.value
            if key in seen:
                self.errors.append(
                    self.error(
                        key_node,
                        _join(path, key),
                        f'duplicate key "{key}" (first on line {seen[key]})',
                    )
                )
                continue
            seen[key] = key_node.start_mark.line + 1
            out.append((key_node, value_node))
        return out

    def sequence(self, node: Node, path: str, expected: str) -> list[Node]:
        if isinstance(node, ScalarNode) and node.tag == _NULL:
            return []
        if not isinstance(node, SequenceNode):
            raise self.wrong_type(node, path, expected)
        return list(node.value)

    # -- scalars

    def string(self, node: Node, path: str, *, expected: str = "a string") -> str:
        if not isinstance(node, ScalarNode) or node.tag != _STR:
            hint = "; quote it" if isinstance(node, ScalarNode) and node.tag in _TAG_NAMES else ""
            raise self.error(node, path, f"expected {expected}, got {_describe(node)}{hint}")
        return self.expand(node, path)

    def strings(self, node: Node, path: str, *, regex: bool) -> tuple[str, ...]:
        expected = "a list of regular expressions" if regex else "a list of strings"
        out: list[str] = []
        for i, item in enumerate(self.sequence(node, path, expected)):
            value = self.string(item, f"{path}[{i}]")
            if regex:
                try:
                    re.compile(value)
                except re.error as exc:
                    raise self.error(
                        item, f"{path}[{i}]", f"not a regular expression: {exc}"
                    ) from None
                risk = backtracking_risk(value)
                if risk is not None:
                    # It would run on every string of every frame: refused now, not found
                    # when one frame stalls the session.
                    raise self.error(
                        item,
                        f"{path}[{i}]",
                        f"a pattern whose matching time can explode on some text: {risk}; "
                        "rewrite it (a literal prefix, then one character class, as the "
                        "defaults do)",
                    )
            out.append(value)
        return tuple(out)

    def directories(self, node: Node, path: str) -> tuple[str, ...]:
        """Existing directories, a relative one taken from the config file's directory; each
        error recorded."""
        base = os.path.dirname(os.path.abspath(self.source))
        out: list[str] = []
        for i, item in enumerate(self.sequence(node, path, "a list of directories")):
            ipath = f"{path}[{i}]"
            with self.collecting():
                value = self.string(item, ipath, expected="a directory")
                if not value:
                    raise self.error(item, ipath, "must not be empty")
                full = os.path.normpath(os.path.join(base, os.path.expanduser(value)))
                if not os.path.isdir(full):
                    what = "is a file" if os.path.exists(full) else "does not exist"
                    raise self.error(
                        item,
                        ipath,
                        f"{_quote(value)} is not a directory ({full} {what}); a relative path "
                        "is taken from the config file's directory",
                    )
                if full not in out:
                    out.append(full)
        return tuple(out)

    def optional_string(self, node: Node, path: str, *, expected: str) -> str | None:
        if isinstance(node, ScalarNode) and node.tag == _NULL:
            return None
        return self.string(node, path, expected=expected)

    def boolean(self, node: Node, path: str) -> bool:
        if not isinstance(node, ScalarNode) or node.tag != _BOOL:
            raise self.wrong_type(node, path, "true or false")
        return bool(self.loader.construct_yaml_bool(node))

    def integer(self, node: Node, path: str, *, minimum: int) -> int:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if not isinstance(node, ScalarNode) or node.tag != _INT:
            raise self.wrong_type(node, path, expected)
        value = int(self.loader.construct_yaml_int(node))
        if value < minimum:
            raise self.error(node, path, f"expected {expected}, got {value}")
        return value

    def seconds(self, node: Node, path: str, *, positive: bool) -> float:
        expected = "a number of seconds " + ("> 0" if positive else ">= 0")
        if not isinstance(node, ScalarNode) or node.tag not in (_INT, _FLOAT):
            raise self.wrong_type(node, path, expected)
        value = float(
            self.loader.construct_yaml_int(node)
            if node.tag == _INT
            else self.loader.construct_yaml_float(node)
        )
        if not math.isfinite(value) or not (value > 0 if positive else value >= 0):
            raise self.error(node, path, f"expected {expected}, got {node.value}")
        return value

    def size(self, node: Node, path: str) -> int:
        expected = SIZE_HELP
        if isinstance(node, ScalarNode) and node.tag == _INT:
            value = int(self.loader.construct_yaml_int(node))
        elif isinstance(node, ScalarNode) and node.tag == _STR:
            parsed = parse_size(self.expand(node, path))
            if parsed is None:
                raise self.wrong_type(node, path, expected)
            value = parsed
        else:
            raise self.wrong_type(node, path, expected)
        if value < 1:
            raise self.error(node, path, f"expected {expected}, got {node.value}")
        return value

    def choice(self, node: Node, path: str, enum_type: type[_E]) -> _E:
        valid = [e.value for e in enum_type]
        if not isinstance(node, ScalarNode) or node.tag != _STR:
            raise self.wrong_type(node, path, f"one of {_choices(valid)}")
        value = self.expand(node, path)
        if value not in valid:
            raise self.error(
                node,
                path,
                f"expected one of {_choices(valid)}, got {_quote(value)}{_suggest(value, valid)}",
            )
        return enum_type(value)

    def json(self, node: Node, path: str) -> JsonValue:
        """Any JSON value (strings expanded); YAML-only values (sets, binary, .inf) are errors."""
        if isinstance(node, MappingNode):
            return {k.value: self.json(v, _join(path, k.value)) for k, v in self.pairs(node, path)}
        if isinstance(node, SequenceNode):
            return [self.json(v, f"{path}[{i}]") for i, v in enumerate(node.value)]
        assert isinstance(node, ScalarNode)
        tag = node.tag
        if tag in (_STR, _TIMESTAMP):  # a date is kept as the text written: JSON has no dates
            return self.expand(node, path)
        if tag == _NULL:
            return None
        if tag == _BOOL:
            return bool(self.loader.construct_yaml_bool(node))
        if tag == _INT:
            return int(self.loader.construct_yaml_int(node))
        if tag == _FLOAT:
            value = float(self.loader.construct_yaml_float(node))
            if not math.isfinite(value):
                raise self.error(node, path, f"{node.value} is not a JSON number")
            return value
        raise self.error(node, path, f"expected a JSON value, got {_describe(node)}")

    # -- environment expansion

    def expand(self, node: ScalarNode, path: str) -> str:
        """Expand ``${VAR}``, ``${VAR:-default}`` and ``$$`` in a string scalar."""
        text: str = node.value
        if "$" not in text:
            return text
        out: list[str] = []
        i = 0
        while True:
            j = text.find("$", i)
            if j < 0:
                out.append(text[i:])
                return "".join(out)
            out.append(text[i:j])
            nxt = text[j + 1 : j + 2]
            if nxt == "$":
                out.append("$")
                i = j + 2
                continue
            if nxt != "{":
                out.append("$")
                i = j + 1
                continue
            end = text.find("}", j + 2)
            if end < 0:
                raise self.error(
                    node, path, f'unterminated "${{" in {_quote(text)} (write "$$" for a "$")'
                )
            body = text[j + 2 : end]
            name, sep, default = body.partition(":-")
            if not _ENV_NAME.fullmatch(name):
                raise self.error(
                    node,
                    path,
                    f'invalid environment reference "${{{body}}}": expected ${{NAME}} or '
                    '${NAME:-default} with NAME made of letters, digits and "_" '
                    '(write "$$" for a "$")',
                )
            value = self.environ.get(name)
            if sep and not value:
                value = default
            if value is None:
                raise self.error(
                    node,
                    path,
                    f"environment variable {name} is not set "
                    f"(set it, or give a default: ${{{name}:-default}})",
                )
            out.append(value)
            i = end + 1

    # -- sections

    def address(self, node: Node, path: str, *, listen: bool, http: bool = False) -> str | None:
        value = self.optional_string(node, path, expected=_ADDRESS_HELP)
        if value is None:
            return None
        if http:  # an HTTP endpoint: also HOST:PORT and http://HOST:PORT (telemetry.endpoint)
            from acp_proxy.telemetry.endpoint import endpoint_url

            value = endpoint_url(value)
        scheme, sep, rest = value.partition("://")
        ok = False
        if sep and scheme in ("ws", "wss") and not http:
            if "?" in rest or "#" in rest:
                raise self.error(
                    node, path, "a WebSocket address has no query (a token goes in auth:)"
                )
            scheme, rest = "tcp", rest.partition("/")[0]
        if sep and scheme == "unix":
            ok = bool(rest)
        elif sep and scheme == "tcp":
            host, colon, port = rest.rpartition(":")
            if host.startswith("[") and host.endswith("]"):
                host = host[1:-1]
            ok = (
                bool(colon and host and port.isdigit())
                and (0 if listen else 1) <= int(port) <= 65535
            )
        if not ok:
            raise self.error(node, path, f"expected {_ADDRESS_HELP}, got {_quote(value)}")
        return value

    def setting(self, node: Node, path: str, setting: Setting) -> object:
        """The value of a scalar-kind ``setting`` (BOOL ... ENV) at ``path``."""
        kind = setting.kind
        if kind is Kind.BOOL:
            return self.boolean(node, path)
        if kind is Kind.INT:
            return self.integer(node, path, minimum=setting.minimum)
        if kind is Kind.SIZE:
            return self.size(node, path)
        if kind is Kind.SECONDS:
            return self.seconds(node, path, positive=setting.positive)
        if kind is Kind.CHOICE:
            assert setting.choices is not None
            return self.choice(node, path, setting.choices)
        if kind is Kind.ADDRESS:
            return self.address(node, path, listen=setting.listen, http=setting.http)
        if kind is Kind.STRING:
            return self.string(node, path)
        if kind in (Kind.STRINGS, Kind.REGEXES):
            return self.strings(node, path, regex=kind is Kind.REGEXES)
        if kind is Kind.DIRECTORIES:
            return self.directories(node, path)
        assert kind is Kind.ENV, kind
        return self.env(node, path)

    def section(self, node: Node, path: str, setting: Setting) -> dict[str, object]:
        """A SECTION's given settings, as {dataclass field: value}; each error recorded."""
        entries = self.mapping(node, path, [c.key for c in setting.children])
        out: dict[str, object] = {}
        for child in setting.children:
            if child.key in entries:
                assert child.attr is not None
                with self.collecting():
                    out[child.attr] = self.setting(
                        entries[child.key][1], _join(path, child.key), child
                    )
        return out

    def env(self, node: Node, path: str) -> dict[str, str]:
        env: dict[str, str] = {}
        if isinstance(node, ScalarNode) and node.tag == _NULL:
            return env
        if not isinstance(node, MappingNode):
            raise self.wrong_type(node, path, "a mapping of variable names to strings")
        for key_node, value_node in self.pairs(node, path):
            name = key_node.value
            vpath = _join(path, name)
            with self.collecting():
                if not name or "=" in name or "\0" in name:
                    raise self.error(key_node, vpath, f"invalid variable name {_quote(name)}")
                if isinstance(value_node, ScalarNode) and value_node.tag in (_INT, _FLOAT):
                    value = value_node.value
                else:
                    value = self.string(value_node, vpath)
                if "\0" in value:
                    raise self.error(
                        value_node, vpath, "a NUL character cannot be in the environment"
                    )
                env[name] = value
        return env
