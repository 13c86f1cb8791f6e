"""The ``policy:`` section of the config file, validated once into a ``Policy``.

Contract: reads the section's YAML nodes with the config's ``NodeReader`` (so every error
names the file, the line and the path inside it, ``policy.rules[2].match.paths[0]``, with what
would be valid) and records every independent error. Checked here: the keys (an unknown matcher
key is an error), the choices, each glob (``policy.globs``), each title regex (compiled by
Python's ``re``; back-references, look-arounds and the shapes that backtrack are refused, so a
match takes linear time), and each rule's ``examples``: every ``match`` example must match the
rule and every ``not_match`` one must not. No I/O: ``home`` is given.
"""

from __future__ import annotations

import hashlib
import re
from re import _constants as c  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]
from typing import Any

import orjson
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from acp_proxy.config.nodes import NodeReader, _join
from acp_proxy.policy.decide import matches
from acp_proxy.policy.globs import GlobError, Undecidable, compile_glob, normalise
from acp_proxy.policy.model import (
    Decision,
    Glob,
    Match,
    OnUnasked,
    Policy,
    PolicyMode,
    PolicyRule,
    Request,
)
from acp_proxy.policy.requests import split_command
from acp_proxy.record.patterns import backtracking_risk

POLICY_KEYS = ("mode", "audit", "default", "forbid_modes", "on_unasked", "rules")
RULE_KEYS = ("name", "match", "decision", "remember", "priority", "examples")
MATCH_KEYS = ("method", "kind", "command", "paths", "paths_outside", "title", "agent")
EXAMPLE_KEYS = ("method", "kind", "command", "paths", "title", "agent", "cwd")
# The session directory an example runs in when it names none (``{cwd}`` in its paths).
EXAMPLE_CWD = "/workspace/project"


def non_linear(pattern: str) -> str | None:
    """Why ``pattern`` (which compiles) may not take linear time; ``None``: it will."""
    stack: list[Any] = [_parser.parse(pattern).data]
    while stack:
        for op, arg in stack.pop():
            if op in (c.GROUPREF, c.GROUPREF_EXISTS):
                return "a back-reference"
            if op in (c.ASSERT, c.ASSERT_NOT):
                return "a look-ahead or look-behind"
            if op in (c.SUBPATTERN, c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
                stack.append(arg[-1])
            elif op is c.BRANCH:
                stack.extend(arg[1])
            elif op is c.ATOMIC_GROUP:
                stack.append(arg)
    return backtracking_risk(pattern)


class PolicyReader:
    """Reads one ``policy:`` section with the config file's ``reader`` (its errors go there)."""

    def __init__(self, reader: NodeReader, home: str | None) -> None:
        self.r = reader
        self.home = home

    def policy(self, node: Node, path: str = "policy") -> Policy | None:
        r = self.r
        before = len(r.errors)
        entries = r.mapping(node, path, POLICY_KEYS)
        out: dict[str, Any] = {}
        if "mode" in entries:
            with r.collecting():
                out["mode"] = r.choice(entries["mode"][1], _join(path, "mode"), PolicyMode)
        if "default" in entries:
            with r.collecting():
                out["default"] = r.choice(entries["default"][1], _join(path, "default"), Decision)
        if "on_unasked" in entries:
            with r.collecting():
                out["on_unasked"] = r.choice(
                    entries["on_unasked"][1], _join(path, "on_unasked"), OnUnasked
                )
        if "audit" in entries:
            with r.collecting():
                out["audit"] = r.optional_string(
                    entries["audit"][1], _join(path, "audit"), expected="a file path"
                )
        if "forbid_modes" in entries:
            with r.collecting():
                out["forbid_modes"] = frozenset(
                    r.strings(entries["forbid_modes"][1], _join(path, "forbid_modes"), regex=False)
                )
        rules: list[PolicyRule] = []
        if "rules" in entries:
            rules = self.rules(entries["rules"][1], _join(path, "rules"))
        if len(r.errors) > before:
            return None
        digest = hashlib.sha256(
            orjson.dumps(r.json(node, path), option=orjson.OPT_SORT_KEYS)
        ).hexdigest()
        return Policy(rules=tuple(rules), digest=digest, **out)

    def rules(self, node: Node, path: str) -> list[PolicyRule]:
        r = self.r
        out: list[PolicyRule] = []
        names: dict[str, int] = {}
        for i, item in enumerate(r.sequence(node, path, "a list of policy rules")):
            ipath = f"{path}[{i}]"
            rule = None
            with r.collecting():
                rule = self.rule(item, ipath, i)
            if rule is None:
                continue
            if rule.name in names:
                r.errors.append(
                    r.error(
                        item,
                        _join(ipath, "name"),
                        f'duplicate policy rule name "{rule.name}" '
                        f"(also {path}[{names[rule.name]}])",
                    )
                )
                continue
            names[rule.name] = i
            out.append(rule)
        return out

    def rule(self, node: Node, path: str, index: int) -> PolicyRule | None:
        r = self.r
        before = len(r.errors)
        entries = r.mapping(node, path, RULE_KEYS, allow_null=False)
        name = f"policy.rules[{index}]"
        if "name" in entries:
            with r.collecting():
                name = r.string(entries["name"][1], _join(path, "name"))
                if not name:
                    raise r.error(entries["name"][1], _join(path, "name"), "must not be empty")
        if "decision" not in entries:
            raise r.error(node, path, 'a policy rule needs "decision: allow | ask | deny"')
        decision = Decision.ASK
        with r.collecting():
            decision = r.choice(entries["decision"][1], _join(path, "decision"), Decision)
        match = Match()
        if "match" in entries:
            with r.collecting():
                match = self.match(entries["match"][1], _join(path, "match"))
        remember = False
        if "remember" in entries:
            with r.collecting():
                remember = r.boolean(entries["remember"][1], _join(path, "remember"))
                if remember and decision is not Decision.ALLOW:
                    raise r.error(
                        entries["remember"][1],
                        _join(path, "remember"),
                        "only an allow rule can remember (pick an allow_always option)",
                    )
        priority = 0
        if "priority" in entries:
            with r.collecting():
                pnode = entries["priority"][1]
                if not isinstance(pnode, ScalarNode) or pnode.tag != "tag:yaml.org,2002:int":
                    raise r.wrong_type(pnode, _join(path, "priority"), "an integer")
                priority = int(r.loader.construct_yaml_int(pnode))
        if len(r.errors) > before:
            return None
        rule = PolicyRule(name, match, decision, remember, priority, node.start_mark.line + 1)
        if "examples" in entries:
            self.examples(entries["examples"][1], _join(path, "examples"), rule)
        return rule

    # -- matchers

    def _names(self, node: Node, path: str, what: str) -> tuple[str, ...]:
        r = self.r
        if isinstance(node, SequenceNode):
            if not node.value:
                raise r.error(node, path, "must not be empty (omit it to match any)")
            return r.strings(node, path, regex=False)
        value = r.string(node, path, expected=what)
        if not value:
            raise r.error(node, path, "must not be empty")
        return (value,)

    def _globs(self, node: Node, path: str) -> tuple[Glob, ...]:
        r = self.r
        items = (
            r.sequence(node, path, "a list of path globs")
            if not isinstance(node, ScalarNode) or node.tag == "tag:yaml.org,2002:null"
            else [node]
        )
        if not items:
            raise r.error(node, path, "must not be empty (omit it to match any path)")
        out: list[Glob] = []
        for i, item in enumerate(items):
            ipath = path if item is node else f"{path}[{i}]"
            with r.collecting():
                source = r.string(item, ipath, expected="a path glob")
                try:
                    out.append(compile_glob(source, self.home))
                except GlobError as exc:
                    raise r.error(item, ipath, f"bad glob {source!r}: {exc}") from None
        return tuple(out)

    def _commands(self, node: Node, path: str) -> tuple[tuple[str, ...], ...]:
        """A string (one prefix, shlex-split), a list of strings (one argv prefix), or a list
        whose items are lists or strings (one prefix each)."""
        r = self.r
        if isinstance(node, SequenceNode):
            if not node.value:
                raise r.error(node, path, "must not be empty (omit it to match any command)")
            if any(isinstance(item, SequenceNode) for item in node.value):
                out: list[tuple[str, ...]] = []
                for i, item in enumerate(node.value):
                    with r.collecting():
                        out.append(self._prefix(item, f"{path}[{i}]"))
                return tuple(out)
        return (self._prefix(node, path),)

    def _prefix(self, node: Node, path: str) -> tuple[str, ...]:
        r = self.r
        if isinstance(node, SequenceNode):
            argv = r.strings(node, path, regex=False)
            if not argv or not all(argv):
                raise r.error(node, path, "an argv prefix of non-empty strings")
            return argv
        text = r.string(node, path, expected="a command (argv prefix)")
        split = split_command(text)
        if split is None:
            raise r.error(node, path, f"cannot split {text!r} as a shell command")
        return split

    def match(self, node: Node, path: str) -> Match:
        r = self.r
        entries = r.mapping(node, path, MATCH_KEYS, allow_null=False)
        out: dict[str, Any] = {}
        for key, (_, vnode) in entries.items():
            kpath = _join(path, key)
            with r.collecting():
                if key == "method":
                    out["methods"] = self._names(vnode, kpath, "a method name or glob")
                elif key == "kind":
                    out["kinds"] = self._names(vnode, kpath, "a tool kind")
                elif key == "agent":
                    out["agents"] = self._names(vnode, kpath, "an agent name or glob")
                elif key == "command":
                    out["commands"] = self._commands(vnode, kpath)
                elif key in ("paths", "paths_outside"):
                    out[key] = self._globs(vnode, kpath)
                else:
                    assert key == "title"
                    text = r.string(vnode, kpath, expected="a regular expression")
                    try:
                        compiled = re.compile(text)
                    except re.error as exc:
                        raise r.error(vnode, kpath, f"bad regex: {exc}") from None
                    why = non_linear(text)
                    if why is not None:
                        raise r.error(
                            vnode,
                            kpath,
                            f"a regex must match in linear time; this one has {why}",
                        )
                    out["title"], out["title_source"] = compiled, text
        return Match(**out)

    # -- examples

    def examples(self, node: Node, path: str, rule: PolicyRule) -> None:
        r = self.r
        entries = r.mapping(node, path, ("match", "not_match"), allow_null=False)
        for key, want in (("match", True), ("not_match", False)):
            if key not in entries:
                continue
            kpath = _join(path, key)
            for i, item in enumerate(r.sequence(entries[key][1], kpath, "a list of examples")):
                ipath = f"{kpath}[{i}]"
                with r.collecting():
                    request = self.example(item, ipath)
                    try:
                        got = matches(rule.match, request)
                    except Undecidable as exc:
                        raise r.error(item, ipath, f"cannot be decided: {exc}") from None
                    if got != want:
                        raise r.error(
                            item,
                            ipath,
                            f'the rule "{rule.name}" '
                            + ("does not match this example" if want else "matches this example"),
                        )

    def example(self, node: Node, path: str) -> Request:
        r = self.r
        if not isinstance(node, MappingNode):
            raise r.wrong_type(node, path, f"a mapping with keys {', '.join(EXAMPLE_KEYS)}")
        entries = r.mapping(node, path, EXAMPLE_KEYS, allow_null=False)
        text: dict[str, str] = {}
        for key in ("method", "kind", "title", "agent", "cwd"):
            if key in entries:
                text[key] = r.string(entries[key][1], _join(path, key))
        cwd = text.get("cwd", EXAMPLE_CWD)
        argv = None
        if "command" in entries:
            argv = self._prefix(entries["command"][1], _join(path, "command"))
        paths: list[str] = []
        if "paths" in entries:
            ppath = _join(path, "paths")
            for i, item in enumerate(r.sequence(entries["paths"][1], ppath, "a list of paths")):
                raw = r.string(item, f"{ppath}[{i}]")
                if raw.startswith("{cwd}"):
                    raw = cwd + raw[len("{cwd}") :]
                elif (raw == "~" or raw.startswith("~/")) and self.home:
                    raw = self.home.rstrip("/") + raw[1:]
                normal = normalise(raw, cwd)
                if normal is None:
                    raise r.error(item, f"{ppath}[{i}]", "not a path")
                paths.append(normal)
        return Request(
            text.get("method", "session/request_permission"),
            text.get("kind"),
            argv,
            tuple(paths),
            text.get("title"),
            text.get("agent"),
            cwd,
        )
