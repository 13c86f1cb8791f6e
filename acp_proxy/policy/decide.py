"""The decision: which rules match a request, which one decides, and the answer it picks.

Contract: pure functions of a ``Policy`` and a ``Request``. Every present condition of a rule
must hold for it to match. Among the matching rules, the highest ``priority`` wins; within it,
deny beats ask beats allow (the first such rule in file order names the decision); no match: the
policy's ``default``. A rule that could not change the outcome (a lower priority, or not
stronger than the rule already found) is not evaluated, so it cannot make a request undecidable
either. ``Decider`` is the same decision, indexed for the hot path. The answer to a permission
request is picked among the options the agent offered, never invented: allow picks an
``allow_once`` option (an ``allow_always`` one first when the rule says ``remember: true``),
deny a ``reject_once`` option, else the ``cancelled`` outcome; an allow with no allow option to
pick, or options that cannot be read, is ``ask``. ``Undecidable`` (``policy.globs``) propagates:
the caller forwards (``ask``).
"""

from __future__ import annotations

import functools
import re
from fnmatch import fnmatchcase

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.policy.globs import MAX_PATH_CHARS, Undecidable, glob_matches
from acp_proxy.policy.model import (
    STRENGTH,
    Decision,
    Glob,
    Match,
    Policy,
    PolicyRule,
    Request,
    Verdict,
)


def _named(names: tuple[str, ...], value: str | None) -> bool:
    if value is None:
        return False
    return any(value == n or fnmatchcase(value, n) for n in names)


def _argv_starts(argv: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
    """``argv`` begins with ``prefix``; the program also matches by its base name
    (``/bin/rm`` is ``rm``)."""
    if len(argv) < len(prefix) or not prefix:
        return False
    head = argv[0]
    if head != prefix[0] and head.rsplit("/", 1)[-1] != prefix[0]:
        return False
    return argv[1 : len(prefix)] == prefix[1:]


def _any_path(globs: tuple[Glob, ...], path: str, cwd: str | None) -> bool:
    return any(glob_matches(g, path, cwd) for g in globs)


def matches(match: Match, request: Request) -> bool:
    """Whether every condition of ``match`` holds for ``request``. Raises ``Undecidable``."""
    if match.methods is not None and not _named(match.methods, request.method):
        return False
    if match.kinds is not None and request.kind not in match.kinds:
        return False
    if match.agents is not None and not _named(match.agents, request.agent):
        return False
    if match.title is not None:
        title = request.title
        if title is None:
            return False
        if len(title) > MAX_PATH_CHARS:  # bounds the search's time
            raise Undecidable(f"a title of {len(title)} characters")
        if match.title.search(title) is None:
            return False
    if match.commands is not None:
        argv = request.argv
        if argv is None or not any(_argv_starts(argv, p) for p in match.commands):
            return False
    if match.paths is not None:
        globs = match.paths
        if not any(_any_path(globs, p, request.cwd) for p in request.paths):
            return False
    if match.paths_outside is not None:
        globs = match.paths_outside
        if not any(not _any_path(globs, p, request.cwd) for p in request.paths):
            return False
    return True


def deciding_rule(policy: Policy, request: Request) -> PolicyRule | None:
    """The rule that decides ``request`` (``None``: no rule matches, the default decides)."""
    best: PolicyRule | None = None
    for rule in policy.rules:
        if best is not None and not _displaces(rule, best):
            continue  # not evaluated: it cannot change the outcome (nor make it undecidable)
        if matches(rule.match, request):
            best = rule
    return best


def _displaces(rule: PolicyRule, best: PolicyRule) -> bool:
    """Whether ``rule``, if it matched, would decide instead of ``best`` (found earlier)."""
    if rule.priority != best.priority:
        return rule.priority > best.priority
    return STRENGTH[rule.decision] > STRENGTH[best.decision]


def decide(policy: Policy, request: Request) -> Verdict:
    """The decision on ``request``, without an answer (``option_id`` is ``None``)."""
    rule = deciding_rule(policy, request)
    if rule is None:
        return Verdict(policy.default)
    return Verdict(rule.decision, rule.name)


def _options(options: JsonValue) -> list[tuple[str, str]] | None:
    """``(optionId, kind)`` of each offered option; ``None`` when they cannot be read."""
    if not isinstance(options, list) or not options:
        return None
    out: list[tuple[str, str]] = []
    for option in options:
        if not isinstance(option, dict):
            return None
        oid, kind = option.get("optionId"), option.get("kind")
        if not isinstance(oid, str) or not isinstance(kind, str):
            return None
        out.append((oid, kind))
    return out


def answer(verdict: Verdict, options: JsonValue, *, remember: bool) -> Verdict:
    """``verdict`` with the option it answers a permission request with (``options``: the
    request's ``options``). Allow without an allow option, or unreadable options: ``ask``.
    Deny without a ``reject_once`` option: deny with ``option_id`` ``None`` (the ``cancelled``
    outcome)."""
    if verdict.decision is Decision.ASK:
        return verdict
    offered = _options(options)
    if offered is None:
        return Verdict(Decision.ASK, verdict.rule)
    if verdict.decision is Decision.ALLOW:
        kinds = ("allow_always", "allow_once") if remember else ("allow_once",)
        for wanted in kinds:
            for oid, kind in offered:
                if kind == wanted:
                    return Verdict(Decision.ALLOW, verdict.rule, oid)
        return Verdict(Decision.ASK, verdict.rule)
    for oid, kind in offered:
        if kind == "reject_once":
            return Verdict(Decision.DENY, verdict.rule, oid)
    return Verdict(Decision.DENY, verdict.rule, None)


def remembers(policy: Policy, rule_name: str | None) -> bool:
    """Whether the rule named ``rule_name`` says ``remember: true``."""
    return any(r.name == rule_name and r.remember for r in policy.rules)


# -- the fast path ----------------------------------------------------------------------------

# Distinct (method, kind) pairs whose candidate rules are kept; past it the table starts over.
MAX_CANDIDATE_KEYS = 1024

_PathRes = tuple[re.Pattern[str] | None, re.Pattern[str] | None]


def _combined(globs: tuple[Glob, ...] | None) -> _PathRes | None:
    """One regex for the absolute globs and one for the ``{cwd}`` ones (an alternation of
    linear regexes is linear)."""
    if globs is None:
        return None
    absolute = tuple(g.regex.pattern for g in globs if g.anchor == "/")
    relative = tuple(g.regex.pattern for g in globs if g.anchor != "/")
    return _alternation(absolute), _alternation(relative)


@functools.lru_cache(maxsize=4096)
def _alternation(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """Compiled once per process, not once per connection."""
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{p})" for p in patterns), re.DOTALL)


class Decider:
    """``deciding_rule`` for one policy, faster: the rules that can match a (method, kind) pair
    are found once and kept (``MAX_CANDIDATE_KEYS``), each rule's globs are one regex per
    anchor, and a request's paths are cut against its cwd once. It decides exactly as
    ``deciding_rule`` does (a property test compares them)."""

    __slots__ = ("_by_key", "_compiled", "policy")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._compiled = tuple(
            (rule, _combined(rule.match.paths), _combined(rule.match.paths_outside))
            for rule in policy.rules
        )
        self._by_key: dict[tuple[str, str | None], tuple[int, ...]] = {}

    def _candidates(self, method: str, kind: str | None) -> tuple[int, ...]:
        key = (method, kind)
        found = self._by_key.get(key)
        if found is None:
            found = tuple(
                i
                for i, (rule, _, _) in enumerate(self._compiled)
                if (rule.match.methods is None or _named(rule.match.methods, method))
                and (rule.match.kinds is None or kind in rule.match.kinds)
            )
            if len(self._by_key) >= MAX_CANDIDATE_KEYS:
                self._by_key.clear()
            self._by_key[key] = found
        return found

    def deciding_rule(self, request: Request) -> PolicyRule | None:
        """As ``deciding_rule(self.policy, request)``. Raises ``Undecidable``."""
        paths = request.paths
        for path in paths:
            if len(path) > MAX_PATH_CHARS:
                raise Undecidable(f"a path of {len(path)} characters")
        rests: list[str | None] | None = None
        best: PolicyRule | None = None
        for i in self._candidates(request.method, request.kind):
            rule, inside, outside = self._compiled[i]
            match = rule.match
            if best is not None and not _displaces(rule, best):
                continue
            if match.agents is not None and not _named(match.agents, request.agent):
                continue
            if match.title is not None:
                title = request.title
                if title is None:
                    continue
                if len(title) > MAX_PATH_CHARS:
                    raise Undecidable(f"a title of {len(title)} characters")
                if match.title.search(title) is None:
                    continue
            if match.commands is not None:
                argv = request.argv
                if argv is None or not any(_argv_starts(argv, p) for p in match.commands):
                    continue
            if inside is not None or outside is not None:
                if rests is None and (
                    (inside is not None and inside[1] is not None)
                    or (outside is not None and outside[1] is not None)
                ):
                    rests = _rests(paths, request.cwd)
                if inside is not None and not any(
                    _hit(inside, paths[j], rests, j) for j in range(len(paths))
                ):
                    continue
                if outside is not None and not any(
                    not _hit(outside, paths[j], rests, j) for j in range(len(paths))
                ):
                    continue
            best = rule
        return best

    def decide(self, request: Request) -> Verdict:
        """As ``decide(self.policy, request)``."""
        rule = self.deciding_rule(request)
        if rule is None:
            return Verdict(self.policy.default)
        return Verdict(rule.decision, rule.name)


def _rests(paths: tuple[str, ...], cwd: str | None) -> list[str | None] | None:
    """Each path's part after ``cwd`` (``""`` for the cwd itself; ``None``: not under it);
    ``None`` when the cwd is not known."""
    if cwd is None:
        return None
    base = cwd.rstrip("/")
    out: list[str | None] = []
    for path in paths:
        if path in (cwd, base):
            out.append("")
        elif path.startswith(base + "/"):
            out.append(path[len(base) :])
        else:
            out.append(None)
    return out


def _hit(res: _PathRes, path: str, rests: list[str | None] | None, j: int) -> bool:
    absolute, relative = res
    if absolute is not None and absolute.match(path) is not None:
        return True
    if relative is None:
        return False
    if rests is None:
        raise Undecidable("a {cwd} glob: the session's cwd is not known")
    rest = rests[j]
    return rest is not None and relative.match(rest) is not None
