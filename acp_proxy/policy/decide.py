"""The decision: which rules match a request, which one decides, and the answer it picks.

Contract: pure functions of a ``Policy`` and a ``Request``. Every present condition of a rule
must hold for it to match. Among the matching rules, the highest ``priority`` wins; within it,
deny beats ask beats allow (the first such rule in file order names the decision); no match:
the policy's ``default``. The answer to a permission request is picked among the options the
agent offered, never invented: allow picks an ``allow_once`` option (an ``allow_always`` one
first when the rule says ``remember: true``), deny a ``reject_once`` option, else the
``cancelled`` outcome; an allow with no allow option to pick, or options that cannot be read,
is ``ask``. ``Undecidable`` (``policy.globs``) propagates: the caller forwards (``ask``).
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
        if not matches(rule.match, request):
            continue
        if (
            best is None
            or rule.priority > best.priority
            or (
                rule.priority == best.priority and STRENGTH[rule.decision] > STRENGTH[best.decision]
            )
        ):
            best = rule
    return best


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
