"""The policy as values: the validated ``policy:`` section, what a decision reads, its verdict.

Contract: frozen values and enums only; no parsing (``policy.parse``), no matching
(``policy.decide``), no I/O.
"""

from __future__ import annotations

import enum
import re
from dataclasses import Field, field
from typing import Any, ClassVar

from acp_proxy.base.values import value


class PolicyMode(enum.StrEnum):
    """Whether decisions are applied (``enforce``) or only audited (``monitor``)."""

    ENFORCE = "enforce"
    MONITOR = "monitor"


class OnUnasked(enum.StrEnum):
    """What a tool call that ran unasked, and that a deny rule matches, gets: an audit line
    (``audit``), or also a ``session/cancel`` for its session (``cancel``, enforce mode)."""

    AUDIT = "audit"
    CANCEL = "cancel"


class Decision(enum.StrEnum):
    """What a rule (or the default) says about a request."""

    ALLOW = "allow"
    ASK = "ask"  # forward to the editor, as without a policy
    DENY = "deny"


# Precedence among the matching rules of the highest priority: deny over ask over allow.
STRENGTH: dict[Decision, int] = {Decision.DENY: 2, Decision.ASK: 1, Decision.ALLOW: 0}


@value
class Glob:
    """One path pattern, compiled. ``anchor`` says what its regex is matched against: the
    whole absolute path (``"/"``), or the rest of the path after the session's cwd
    (``"{cwd}"``: the pattern started with ``{cwd}``). ``fast``: the same pattern for the
    decision's fast path, written for the path read backwards when ``reverse`` (see
    ``policy.globs``)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    source: str
    regex: re.Pattern[str] = field(compare=False)
    anchor: str = "/"
    fast: str = field(default="", compare=False)
    reverse: bool = field(default=False, compare=False)
    # What a text must start with for ``fast`` to match (``None``: anything; see
    # ``policy.globs._key``): the fast path looks only at the rules that can match.
    key: str | None = field(default=None, compare=False)


@value
class Match:
    """The conditions of a rule; every present one (not ``None``) must hold."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    methods: tuple[str, ...] | None = None  # exact names or fnmatch globs
    kinds: tuple[str, ...] | None = None  # tool kinds (read, edit, execute...)
    commands: tuple[tuple[str, ...], ...] | None = None  # argv prefixes
    paths: tuple[Glob, ...] | None = None  # some path matches one of them
    paths_outside: tuple[Glob, ...] | None = None  # some path matches none of them
    title: re.Pattern[str] | None = field(default=None, compare=False)
    title_source: str | None = None
    agents: tuple[str, ...] | None = None  # agent names (``initialize``), exact or globs


@value
class PolicyRule:
    """One named rule: its conditions, its decision, and how it answers."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    name: str
    match: Match
    decision: Decision
    remember: bool = False  # allow: an ``allow_always`` option may be picked
    priority: int = 0  # higher first; precedence applies within one priority
    line: int | None = field(default=None, compare=False)


@value
class Policy:
    """The validated ``policy:`` section."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    rules: tuple[PolicyRule, ...] = ()
    default: Decision = Decision.ASK
    mode: PolicyMode = PolicyMode.ENFORCE
    forbid_modes: frozenset[str] = frozenset()
    audit: str | None = None  # the audit file's path
    on_unasked: OnUnasked = OnUnasked.AUDIT
    # SHA-256 of the section as the file wrote it (after ${VAR} expansion): which policy decided.
    digest: str = ""


@value
class Request:
    """What a decision reads of one request: its summary (``policy.requests`` builds it).

    ``paths`` are absolute and normalised (against the session's cwd, then resolved);
    ``argv`` is the command, split; ``None`` is "not known"."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    method: str
    kind: str | None = None
    argv: tuple[str, ...] | None = None
    paths: tuple[str, ...] = ()
    title: str | None = None
    agent: str | None = None
    cwd: str | None = None


@value
class Verdict:
    """A decision and how it answers: ``rule`` is the deciding rule's name (``None``: the
    default); ``option_id`` the offered option picked (``None``: none, e.g. the ``cancelled``
    outcome or a request that has no options)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    decision: Decision
    rule: str | None = None
    option_id: str | None = None
