"""The decision on the hot path: ``policy.decide``'s rules, precompiled and indexed.

Contract: ``Decider`` decides exactly as ``policy.decide.deciding_rule`` does (a property test
compares them), at a cost that grows with the rules that can match a request rather than with
the file. Pure; one ``Decider`` per policy (``decider_for``) serves every connection.

How:

* Index. The rules that can match a (method, kind) pair are found once (``_Group``), in
  precedence order. A kind no rule names shares one group per method, so the table holds at
  most (methods decided) x (kinds the rules name + 1) groups.
* One regex per rule and side. Each rule's globs are an alternation per side of a path: the
  absolute globs against the path, those that start with ``**`` against the path read
  backwards (``policy.globs``: they start with a literal there), the ``{cwd}`` globs against
  the path's part after the session's cwd.
* One regex per group and side. The rules whose only conditions are the method, the kind and
  ``paths`` (the usual shape) are also, per side, one alternation of capturing groups in
  precedence order: one match per path and side gives the first such rule that holds (the
  alternatives that do not match fail on their first characters). Only the other rules
  tried before it are checked one by one.
* Off the fast path: a request with a path over ``MAX_PATH_CHARS``, or in a session whose cwd
  is not known when a ``{cwd}`` glob of its group would need it, is decided by the reference,
  rule by rule, in the same order.
"""

from __future__ import annotations

import functools
import re

from acp_proxy.policy.decide import argv_starts, in_precedence, matches, names_match
from acp_proxy.policy.globs import MAX_PATH_CHARS, Undecidable
from acp_proxy.policy.model import Decision, Glob, Policy, PolicyRule, Request, Verdict

# Distinct (method, kind) keys whose groups are kept; past it the table starts over.
MAX_GROUPS = 1024
# The sides of a path a glob is matched against (``_Path``).
_FORWARD, _BACKWARD, _REST = range(3)


def side_of(glob: Glob) -> int:
    if glob.anchor != "/":
        return _REST
    return _BACKWARD if glob.reverse else _FORWARD


def side_regexes(globs: tuple[Glob, ...]) -> tuple[str | None, str | None, str | None]:
    """Per side, the alternation of ``globs``' fast regexes, anchored at the end (``None``:
    no glob for that side)."""
    out: list[str | None] = []
    for side in (_FORWARD, _BACKWARD, _REST):
        parts = [f"(?:{g.fast})" for g in globs if side_of(g) == side]
        out.append(f"(?:{'|'.join(parts)})\\Z" if parts else None)
    return out[0], out[1], out[2]


@functools.lru_cache(maxsize=4096)
def _compile(pattern: str) -> re.Pattern[str]:
    """Compiled once per process (``re``'s own cache holds 512 patterns)."""
    return re.compile(pattern, re.DOTALL)


# A path as the fast path reads it: the path, the path backwards, and its part after the
# session's cwd (``None``: not under it).
_Path = tuple[str, str, str | None]


class _Globs:
    """A rule's ``paths`` or ``paths_outside``, one regex per side."""

    __slots__ = ("backward", "forward", "regexes", "rest")

    def __init__(self, globs: tuple[Glob, ...]) -> None:
        self.regexes = side_regexes(globs)
        forward, backward, rest = self.regexes
        self.forward = None if forward is None else _compile(forward)
        self.backward = None if backward is None else _compile(backward)
        self.rest = None if rest is None else _compile(rest)

    def hit(self, path: _Path) -> bool:
        if self.forward is not None and self.forward.match(path[0]) is not None:
            return True
        if self.backward is not None and self.backward.match(path[1]) is not None:
            return True
        rest = path[2]
        return self.rest is not None and rest is not None and self.rest.match(rest) is not None


class _Rule:
    """One rule's conditions beyond its method and kind (the group holds those), compiled."""

    __slots__ = ("agents", "commands", "inside", "outside", "pure", "rule", "title")

    def __init__(self, rule: PolicyRule) -> None:
        match = rule.match
        self.rule = rule
        self.agents = match.agents
        self.title = match.title
        self.commands = match.commands
        self.inside = None if match.paths is None else _Globs(match.paths)
        self.outside = None if match.paths_outside is None else _Globs(match.paths_outside)
        self.pure = (
            self.inside is not None
            and self.outside is None
            and self.agents is None
            and self.title is None
            and self.commands is None
        )

    def holds(self, request: Request, paths: tuple[_Path, ...]) -> bool:
        """``matches`` for this rule, method and kind aside, over the request's ``paths``."""
        if self.agents is not None and not names_match(self.agents, request.agent):
            return False
        if self.title is not None:
            title = request.title
            if title is None:
                return False
            if len(title) > MAX_PATH_CHARS:
                raise Undecidable(f"a title of {len(title)} characters")
            if self.title.search(title) is None:
                return False
        if self.commands is not None:
            argv = request.argv
            if argv is None or not any(argv_starts(argv, p) for p in self.commands):
                return False
        inside = self.inside
        if inside is not None and not any(inside.hit(p) for p in paths):
            return False
        outside = self.outside
        return outside is None or any(not outside.hit(p) for p in paths)


_Scan = tuple[re.Pattern[str], tuple[int, ...]]  # an alternation, and each group's rule


def _alternation(branches: list[tuple[int, str]]) -> _Scan:
    """One regex of ``branches`` (rule index, its regex) in order, a capturing group each."""
    pattern = "|".join(f"((?:{regex})\\Z)" for _, regex in branches)
    return _compile(pattern), tuple(i for i, _ in branches)


def _first(scan: _Scan, text: str, first: int) -> int:
    """``first``, or the rule of the first alternative of ``scan`` that matches ``text`` when
    it comes before."""
    found = scan[0].match(text)
    if found is None:
        return first
    return min(first, scan[1][found.lastindex - 1])  # type: ignore[operator]


class _Group:
    """The rules that can match one (method, kind) pair, in precedence order; per side of a
    path, its pure rules' globs as alternations: one for the globs any text may match, one per
    key (``Glob.key``) for the others, so a path meets only the rules that can match it."""

    __slots__ = ("backward", "cwd", "deny", "others", "paths", "rules", "scans")

    def __init__(self, rules: tuple[_Rule, ...]) -> None:
        self.rules = rules
        scans: list[tuple[int, _Scan | None, dict[str, _Scan]]] = []
        for side in (_FORWARD, _BACKWARD, _REST):
            any_text: list[tuple[int, str]] = []
            by_key: dict[str, list[tuple[int, str]]] = {}
            for i, rule in enumerate(rules):
                if not rule.pure:
                    continue
                globs = [g for g in rule.rule.match.paths or () if side_of(g) == side]
                for key in dict.fromkeys(g.key for g in globs):
                    regex = "|".join(f"(?:{g.fast})" for g in globs if g.key == key)
                    (any_text if key is None else by_key.setdefault(key, [])).append((i, regex))
            if any_text or by_key:
                scans.append(
                    (
                        side,
                        _alternation(any_text) if any_text else None,
                        {k: _alternation(v) for k, v in by_key.items()},
                    )
                )
        self.scans = tuple(scans)
        self.others = tuple(i for i, r in enumerate(rules) if not r.pure)
        self.deny = any(r.rule.decision is Decision.DENY for r in rules)
        sets = [r.inside for r in rules] + [r.outside for r in rules]
        self.paths = any(g is not None for g in sets)
        # Whether a glob needs the path backwards, or its part after the cwd.
        self.backward = any(g is not None and g.backward is not None for g in sets)
        self.cwd = any(g is not None and g.rest is not None for g in sets)


def _sides(paths: tuple[str, ...], cwd: str | None, backward: bool) -> tuple[_Path, ...] | None:
    """Each path as the fast path reads it (backwards only when ``backward``; its rest only
    with a ``cwd``); ``None``: a path too long for it."""
    out = []
    base = None if cwd is None else cwd.rstrip("/")
    for path in paths:
        if len(path) > MAX_PATH_CHARS:
            return None
        rest = None  # ``globs.rest_of``, inline: the hot path
        if cwd is not None:
            if path in (cwd, base):
                rest = ""
            elif path.startswith(base + "/"):  # type: ignore[operator]
                rest = path[len(base) :]  # type: ignore[arg-type]
        out.append((path, path[::-1] if backward else "", rest))
    return tuple(out)


class Decider:
    """``deciding_rule`` for one policy, precompiled (see the module)."""

    __slots__ = ("_compiled", "_groups", "_kinds", "policy")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._compiled = tuple(_Rule(rule) for rule in in_precedence(policy.rules))
        # The kinds some rule names: any other kind has the same group as no kind.
        self._kinds = frozenset(
            kind for rule in policy.rules if rule.match.kinds for kind in rule.match.kinds
        )
        self._groups: dict[tuple[str, str | None], _Group] = {}

    def _group(self, method: str, kind: str | None) -> _Group:
        key = (method, kind if kind in self._kinds else None)
        group = self._groups.get(key)
        if group is None:
            group = _Group(
                tuple(
                    r
                    for r in self._compiled
                    if (r.rule.match.methods is None or names_match(r.rule.match.methods, method))
                    and (r.rule.match.kinds is None or kind in r.rule.match.kinds)
                )
            )
            if len(self._groups) >= MAX_GROUPS:
                self._groups.clear()
            self._groups[key] = group
        return group

    def may_deny(self, method: str, kind: str | None) -> bool:
        """Whether a deny rule can match a request of ``method`` and tool ``kind``."""
        return self._group(method, kind).deny

    def deciding_rule(self, request: Request) -> PolicyRule | None:
        """As ``decide.deciding_rule(self.policy, request)``. Raises ``Undecidable``."""
        group = self._group(request.method, request.kind)
        rules = group.rules
        first = len(rules)  # the first pure rule that holds, by the group's regexes
        paths: tuple[_Path, ...] = ()
        if group.paths:
            cwd = request.cwd
            if cwd is None and group.cwd:
                made = None
            else:
                made = _sides(request.paths, cwd if group.cwd else None, group.backward)
            if made is None:  # the reference, rule by rule, in the same order
                for r in rules:
                    if matches(r.rule.match, request):
                        return r.rule
                return None
            paths = made
            for side, any_text, by_key in group.scans:
                for path in paths:
                    text = path[side]
                    if text is None:
                        continue
                    if by_key:  # the rules whose globs spell out how the text starts
                        if side == _BACKWARD:
                            key = text[:1]
                        else:
                            cut = text.find("/", 1)
                            key = text if cut < 0 else text[:cut]
                        keyed = by_key.get(key)
                        if keyed is not None:
                            first = _first(keyed, text, first)
                    if any_text is not None:
                        first = _first(any_text, text, first)
        for i in group.others:
            if i > first:
                break
            if rules[i].holds(request, paths):
                return rules[i].rule
        return rules[first].rule if first < len(rules) else None

    def decide(self, request: Request) -> Verdict:
        """As ``decide.decide(self.policy, request)``."""
        rule = self.deciding_rule(request)
        if rule is None:
            return Verdict(self.policy.default)
        return Verdict(rule.decision, rule.name)


@functools.lru_cache(maxsize=16)
def decider_for(policy: Policy) -> Decider:
    """The one ``Decider`` of ``policy`` (its groups are built once for every connection)."""
    return Decider(policy)
