"""The decision: which rules match a request, which one decides, and the answer it picks.

Contract: pure functions of a ``Policy`` and a ``Request``. Every present condition of a rule
must hold for it to match. The rules are tried in precedence order: the highest ``priority``
first; within one priority deny before ask before allow; then file order. The first rule that
matches decides; no match: the policy's ``default``. A rule after the deciding one is never
evaluated, so it cannot make a request undecidable either. ``policy.fastdecide.Decider`` is
the same decision, precompiled for the hot path (a property test compares the two). The answer
to a permission request is picked among the options the agent offered, never invented: allow
picks an ``allow_once`` option (an ``allow_always`` one first when the rule says ``remember:
true``), deny a ``reject_once`` option, else the ``cancelled`` outcome; an allow with no allow
option to pick, or options that cannot be read, is ``ask``. ``Undecidable``
(``policy.globs``) propagates: the caller forwards (``ask``).
"""

from __future__ import annotations

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


def names_match(names: tuple[str, ...], value: str | None) -> bool:
    if value is None:
        return False
    return any(value == n or fnmatchcase(value, n) for n in names)


def argv_starts(argv: tuple[str, ...], prefix: tuple[str, ...]) -> bool:
    """``argv`` begins with ``prefix``; the program also matches by its base name
    (``/bin/rm`` is ``rm``)."""
    if len(argv) < len(prefix) or not prefix:
        return False
    head = argv[0]
    if head != prefix[0] and head.rsplit("/", 1)[-1] != prefix[0]:
        return False
    return argv[1 : len(prefix)] == prefix[1:]


def _path_in(globs: tuple[Glob, ...], path: str, cwd: str | None) -> bool:
    """Whether ``path`` matches one of ``globs``: the absolute ones first, so a ``{cwd}`` glob
    is needed (and undecidable without a cwd) only when none of them matches."""
    for glob in globs:
        if glob.anchor == "/" and glob_matches(glob, path, cwd):
            return True
    return any(glob_matches(g, path, cwd) for g in globs if g.anchor != "/")


def _check_lengths(paths: tuple[str, ...]) -> None:
    for path in paths:
        if len(path) > MAX_PATH_CHARS:
            raise Undecidable(f"a path of {len(path)} characters")


def matches(match: Match, request: Request) -> bool:
    """Whether every condition of ``match`` holds for ``request``, tried in this order:
    method, kind, agent, title, command, paths, paths_outside (a failing one ends it). Raises
    ``Undecidable``: a title or, with a path condition, a path that is too long; a ``{cwd}``
    glob needed in a session whose cwd is not known."""
    if match.methods is not None and not names_match(match.methods, request.method):
        return False
    if match.kinds is not None and request.kind not in match.kinds:
        return False
    if match.agents is not None and not names_match(match.agents, request.agent):
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
        if argv is None or not any(argv_starts(argv, p) for p in match.commands):
            return False
    cwd = request.cwd
    if match.paths is not None:
        _check_lengths(request.paths)
        if not any(_path_in(match.paths, p, cwd) for p in request.paths):
            return False
    if match.paths_outside is not None:
        _check_lengths(request.paths)
        if not any(not _path_in(match.paths_outside, p, cwd) for p in request.paths):
            return False
    return True


def _precedence(rule: PolicyRule) -> tuple[int, int]:
    return (-rule.priority, -STRENGTH[rule.decision])


def in_precedence(rules: tuple[PolicyRule, ...]) -> tuple[PolicyRule, ...]:
    """``rules`` in the order they are tried (a stable sort keeps file order within a rank)."""
    return tuple(sorted(rules, key=_precedence))


def deciding_rule(policy: Policy, request: Request) -> PolicyRule | None:
    """The rule that decides ``request`` (``None``: no rule matches, the default decides)."""
    for rule in in_precedence(policy.rules):
        if matches(rule.match, request):
            return rule
    return None


def decide(policy: Policy, request: Request) -> Verdict:
    """The decision on ``request``, without an answer (``option_id`` is ``None``)."""
    rule = deciding_rule(policy, request)
    if rule is None:
        return Verdict(policy.default)
    return Verdict(rule.decision, rule.name)


def pick(decision: Decision, options: JsonValue, *, remember: bool) -> tuple[Decision, str | None]:
    """``answer``'s decision and option id, without a ``Verdict`` (the hot path's)."""
    if decision is Decision.ASK:
        return decision, None
    if type(options) is not list or not options:
        return Decision.ASK, None
    first: dict[str, str] = {}  # kind -> the first offered option of that kind
    for option in options:  # one pass: every option must be readable
        if type(option) is not dict:
            return Decision.ASK, None
        oid, kind = option.get("optionId"), option.get("kind")
        if type(oid) is not str or type(kind) is not str:
            return Decision.ASK, None
        first.setdefault(kind, oid)
    if decision is Decision.ALLOW:
        chosen = first.get("allow_always") if remember else None
        if chosen is None:
            chosen = first.get("allow_once")
        return (Decision.ASK, None) if chosen is None else (Decision.ALLOW, chosen)
    return Decision.DENY, first.get("reject_once")


def answer(verdict: Verdict, options: JsonValue, *, remember: bool) -> Verdict:
    """``verdict`` with the option it answers a permission request with (``options``: the
    request's ``options``). Allow without an allow option, or unreadable options: ``ask``.
    Deny without a ``reject_once`` option: deny with ``option_id`` ``None`` (the ``cancelled``
    outcome)."""
    if verdict.decision is Decision.ASK:
        return verdict
    decision, option = pick(verdict.decision, options, remember=remember)
    return Verdict(decision, verdict.rule, option)


def remembers(policy: Policy, rule_name: str | None) -> bool:
    """Whether the rule named ``rule_name`` says ``remember: true``."""
    return any(r.name == rule_name and r.remember for r in policy.rules)
