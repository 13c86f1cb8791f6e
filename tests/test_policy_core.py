"""The pure policy core: globs, matching, precedence, the answer picked, the section's errors."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.config import ConfigError, parse_config
from acp_proxy.policy.decide import answer, decide, matches
from acp_proxy.policy.explain import explain_policy
from acp_proxy.policy.fastdecide import Decider
from acp_proxy.policy.globs import GlobError, Undecidable, compile_glob, glob_matches, normalise
from acp_proxy.policy.model import (
    Decision,
    Match,
    OnUnasked,
    Policy,
    PolicyRule,
    Request,
    Verdict,
)
from acp_proxy.policy.requests import split_command
from acp_proxy.policy.schema import policy_schema

HOME = {"HOME": "/home/u"}


def policy(text: str) -> Policy:
    config = parse_config(text, "p.yaml", HOME)
    assert config.policy is not None
    return config.policy


def error_lines(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "p.yaml", HOME)
    return info.value.messages()


# -- globs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("glob", "path", "cwd", "expected"),
    [
        ("**/.env", "/w/p/.env", None, True),
        ("**/.env", "/.env", None, True),
        ("**/.env", "/w/p/.envrc", None, False),
        ("**/*.pem", "/a/b/key.pem", None, True),
        ("**/*.pem", "/a/b/key.pem.txt", None, False),
        ("~/.ssh/**", "/home/u/.ssh/id_rsa", None, True),
        ("~/.ssh/**", "/home/u/.sshx/id", None, False),
        ("{cwd}/**", "/w/p/src/a.py", "/w/p", True),
        ("{cwd}/**", "/w/p", "/w/p", True),
        ("{cwd}/**", "/w/pp/a", "/w/p", False),
        ("{cwd}/src/*.py", "/w/p/src/a.py", "/w/p", True),
        ("{cwd}/src/*.py", "/w/p/src/x/a.py", "/w/p", False),
        ("/etc/[!p]*", "/etc/hosts", None, True),
        ("/etc/[!p]*", "/etc/passwd", None, False),
        ("/a/?.txt", "/a/b.txt", None, True),
        ("/a/?.txt", "/a//.txt", None, False),
        ("/x/**/y", "/x/y", None, True),
        ("/x/**/y", "/x/a/b/y", None, True),
    ],
)
def test_glob_matches(glob: str, path: str, cwd: str | None, expected: bool) -> None:
    assert glob_matches(compile_glob(glob, "/home/u"), path, cwd) is expected


@pytest.mark.parametrize(
    ("glob", "reason"),
    [
        ("etc/**", 'a path glob must be absolute, or start with "{cwd}", "~" or "**"'),
        ("/a/{cwd}/b", '"{cwd}" may only start a glob'),
        ("{cwd}x", '"{cwd}" must be followed by "/" or end the glob'),
        ("~bob/x", '"~" is the proxy user\'s home: write "~/..." (not "~user")'),
        ("", "a path glob must not be empty"),
    ],
)
def test_bad_globs(glob: str, reason: str) -> None:
    with pytest.raises(GlobError) as info:
        compile_glob(glob, "/home/u")
    assert str(info.value).startswith(reason)


def test_a_cwd_glob_without_a_known_cwd_is_undecidable() -> None:
    with pytest.raises(Undecidable):
        glob_matches(compile_glob("{cwd}/**", None), "/w/a", None)
    with pytest.raises(Undecidable):
        glob_matches(compile_glob("/**", None), "/" + "a" * 5000, None)


@pytest.mark.parametrize(
    ("path", "cwd", "expected"),
    [
        ("src/../a.py", "/w/p", "/w/p/a.py"),
        ("/w/p/./x//y", None, "/w/p/x/y"),
        ("//etc/passwd", None, "/etc/passwd"),
        ("../../../etc/passwd", "/w/p", "/etc/passwd"),
        ("a.py", None, None),
        ("", "/w", None),
    ],
)
def test_normalise(path: str, cwd: str | None, expected: str | None) -> None:
    assert normalise(path, cwd) == expected


# -- matching and precedence ------------------------------------------------------------------

ISSUE_POLICY = """\
policy:
  default: ask
  forbid_modes: [bypassPermissions, dontAsk]
  rules:
    - name: no-recursive-delete
      match: {kind: execute, command: ["rm", "-rf"]}
      decision: deny
    - name: read-in-workspace
      match: {kind: read, paths: ["{cwd}/**"]}
      decision: allow
      examples:
        match: [{kind: read, paths: ["{cwd}/src/a.py"]}]
        not_match: [{kind: read, paths: ["/etc/passwd"]}]
    - name: no-secrets
      match: {method: fs/read_text_file, paths: ["**/.env", "~/.ssh/**", "**/*.pem"]}
      decision: deny
    - name: writes-stay-home
      match: {method: fs/write_text_file, paths_outside: ["{cwd}/**"]}
      decision: deny
    - name: git-push
      match: {command: [["git", "push"], "git reset --hard"], agent: "claude*"}
      decision: ask
    - name: titled
      match: {title: "^Delete "}
      decision: deny
"""
PERM = "session/request_permission"
READ = "fs/read_text_file"


@pytest.mark.parametrize(
    ("request_", "decision", "rule"),
    [
        (Request(PERM, "execute", ("rm", "-rf", "/")), Decision.DENY, "no-recursive-delete"),
        (Request(PERM, "execute", ("/bin/rm", "-rf", "x")), Decision.DENY, "no-recursive-delete"),
        (Request(PERM, "execute", ("rm", "-r", "x")), Decision.ASK, None),
        (
            Request(PERM, "read", None, ("/w/p/a.py",), cwd="/w/p"),
            Decision.ALLOW,
            "read-in-workspace",
        ),
        # deny beats allow, whatever the order: a secret inside the workspace
        (Request(READ, "read", None, ("/w/p/.env",), cwd="/w/p"), Decision.DENY, "no-secrets"),
        (
            Request(READ, "read", None, ("/home/u/.ssh/id",), cwd="/w/p"),
            Decision.DENY,
            "no-secrets",
        ),
        (
            Request("fs/write_text_file", "edit", None, ("/tmp/x",), cwd="/w/p"),
            Decision.DENY,
            "writes-stay-home",
        ),
        (Request("fs/write_text_file", "edit", None, ("/w/p/x",), cwd="/w/p"), Decision.ASK, None),
        (
            Request(PERM, "execute", ("git", "push", "-f"), agent="claude-code"),
            Decision.ASK,
            "git-push",
        ),
        (
            Request(PERM, "execute", ("git", "reset", "--hard"), agent="claude-code"),
            Decision.ASK,
            "git-push",
        ),
        (Request(PERM, "execute", ("git", "push"), agent="gemini"), Decision.ASK, None),
        (Request(PERM, "delete", title="Delete build/"), Decision.DENY, "titled"),
        (Request(PERM, "delete", title="Remove build/"), Decision.ASK, None),
    ],
)
def test_the_issue_policy_decides(request_: Request, decision: Decision, rule: str | None) -> None:
    assert decide(policy(ISSUE_POLICY), request_) == Verdict(decision, rule)


def test_priority_orders_before_precedence() -> None:
    p = policy(
        "policy:\n  rules:\n"
        "    - {name: deny-all, match: {kind: read}, decision: deny}\n"
        "    - {name: allow-src, match: {kind: read, paths: ['/src/**']}, decision: allow,"
        " priority: 10}\n"
    )
    assert decide(p, Request(PERM, "read", None, ("/src/a",))) == Verdict(
        Decision.ALLOW, "allow-src"
    )
    assert decide(p, Request(PERM, "read", None, ("/etc/a",))) == Verdict(Decision.DENY, "deny-all")


_decisions = st.sampled_from(list(Decision))
_kinds = st.sampled_from(["read", "edit", "execute"])
_rules = st.lists(st.tuples(_kinds, _decisions), min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(_rules, st.randoms(use_true_random=False), _kinds, _decisions)
def test_precedence_does_not_depend_on_rule_order(
    specs: list[tuple[str, Decision]], rnd: object, kind: str, default: Decision
) -> None:
    rules = [PolicyRule(f"r{i}", Match(kinds=(k,)), d) for i, (k, d) in enumerate(specs)]
    shuffled = list(rules)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    request = Request(PERM, kind)
    one = decide(Policy(tuple(rules), default), request).decision
    two = decide(Policy(tuple(shuffled), default), request).decision
    assert one == two
    matching = [d for k, d in specs if k == kind]
    if not matching:
        assert one == default  # a request no rule matches gets the default
    else:
        strongest = max(matching, key=[Decision.ALLOW, Decision.ASK, Decision.DENY].index)
        assert one == strongest


# -- the answer --------------------------------------------------------------------------------

CLAUDE: JsonValue = [
    {"optionId": "allow_always", "name": "Always Allow", "kind": "allow_always"},
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]
CODEX: JsonValue = [
    {"optionId": "approved-for-session", "name": "Always", "kind": "allow_always"},
    {"optionId": "approved", "name": "Yes", "kind": "allow_once"},
    {"optionId": "abort", "name": "No", "kind": "reject_once"},
]
GEMINI: JsonValue = [
    {"optionId": "proceed_always", "name": "Allow All", "kind": "allow_always"},
    {"optionId": "proceed_once", "name": "Allow", "kind": "allow_once"},
    {"optionId": "cancel", "name": "Reject", "kind": "reject_once"},
]


@pytest.mark.parametrize(
    ("options", "allow", "remember", "deny"),
    [
        (CLAUDE, "allow", "allow_always", "reject"),
        (CODEX, "approved", "approved-for-session", "abort"),
        (GEMINI, "proceed_once", "proceed_always", "cancel"),
    ],
)
def test_the_answer_is_an_offered_option(
    options: JsonValue, allow: str, remember: str, deny: str
) -> None:
    assert answer(Verdict(Decision.ALLOW, "r"), options, remember=False).option_id == allow
    assert answer(Verdict(Decision.ALLOW, "r"), options, remember=True).option_id == remember
    assert answer(Verdict(Decision.DENY, "r"), options, remember=False).option_id == deny


def test_missing_options_ask_or_cancel() -> None:
    only_always: JsonValue = [{"optionId": "a", "name": "A", "kind": "allow_always"}]
    only_reject_always: JsonValue = [{"optionId": "n", "name": "N", "kind": "reject_always"}]
    assert answer(Verdict(Decision.ALLOW, "r"), only_always, remember=False) == Verdict(
        Decision.ASK, "r"
    )
    assert answer(Verdict(Decision.DENY, "r"), only_reject_always, remember=False) == Verdict(
        Decision.DENY, "r", None
    )
    bad_options: list[JsonValue] = [[], None, [{"optionId": 3, "kind": "allow_once"}], "x"]
    for bad in bad_options:
        assert answer(Verdict(Decision.DENY, "r"), bad, remember=False) == Verdict(
            Decision.ASK, "r"
        )


# -- the section's errors -------------------------------------------------------------------------


def test_policy_errors_name_file_line_and_path() -> None:
    text = (
        "policy:\n"
        "  mode: enforced\n"
        "  rules:\n"
        "    - name: a\n"
        "      match: {kind: read, paths: ['/ok/**', 'etc/**'], colour: red}\n"
        "      decision: allow\n"
        "    - name: b\n"
        "      match: {title: '(?<=x)y'}\n"
        "      decision: deny\n"
        "    - name: c\n"
        "      match: {title: '(a+)+$'}\n"
        "      decision: deny\n"
        "    - name: d\n"
        "      match: {title: '[unclosed'}\n"
        "      decision: deny\n"
        "    - name: e\n"
        "      match: {kind: read, paths: ['{cwd}/**']}\n"
        "      decision: allow\n"
        "      examples:\n"
        "        match: [{kind: read, paths: ['/etc/passwd']}]\n"
        "        not_match: [{kind: read, paths: ['{cwd}/a']}]\n"
        "    - name: f\n"
        "      decision: deny\n"
        "      remember: true\n"
        "    - match: {kind: read}\n"
    )
    assert error_lines(text) == [
        'p.yaml:2: policy.mode: expected one of "enforce", "monitor", got "enforced"; '
        'did you mean "enforce"?',
        'p.yaml:5: policy.rules[0].match.colour: unknown key "colour". Valid keys: method, '
        "kind, command, paths, paths_outside, title, agent",
        "p.yaml:5: policy.rules[0].match.paths[1]: bad glob 'etc/**': a path glob must be "
        'absolute, or start with "{cwd}", "~" or "**" (for a path in the session\'s directory: '
        '"{cwd}/etc/**")',
        "p.yaml:8: policy.rules[1].match.title: a regex must match in linear time; this one "
        "has a look-ahead or look-behind",
        "p.yaml:11: policy.rules[2].match.title: a regex must match in linear time; this one "
        "has a quantifier inside a quantifier (as in (a+)+)",
        "p.yaml:14: policy.rules[3].match.title: bad regex: unterminated character set at "
        "position 0",
        'p.yaml:20: policy.rules[4].examples.match[0]: the rule "e" does not match this example',
        'p.yaml:21: policy.rules[4].examples.not_match[0]: the rule "e" matches this example',
        "p.yaml:24: policy.rules[5].remember: only an allow rule can remember (pick an "
        "allow_always option)",
        'p.yaml:25: policy.rules[6]: a policy rule needs "decision: allow | ask | deny"',
    ]


def test_backreferences_are_refused() -> None:
    assert error_lines("policy:\n  rules:\n    - {match: {title: '(a)\\1'}, decision: deny}\n") == [
        "p.yaml:3: policy.rules[0].match.title: a regex must match in linear time; this one "
        "has a back-reference"
    ]


def test_the_section_is_read_once_with_its_hash() -> None:
    p = policy(ISSUE_POLICY)
    assert [r.name for r in p.rules][:2] == ["no-recursive-delete", "read-in-workspace"]
    assert p.forbid_modes == frozenset({"bypassPermissions", "dontAsk"})
    assert re.fullmatch("[0-9a-f]{64}", p.digest)
    assert policy(ISSUE_POLICY).digest == p.digest
    assert policy(ISSUE_POLICY.replace("dontAsk", "plan")).digest != p.digest
    assert parse_config("rules: []\n", "p.yaml", HOME).policy is None


def test_matches_ignores_nothing_it_is_given() -> None:
    m = Match(kinds=("read",), paths=(compile_glob("/a/**", None),))
    assert matches(m, Request(PERM, "read", None, ("/a/b",)))
    assert not matches(m, Request(PERM, "read", None, ()))  # no path: a paths rule cannot hold
    assert not matches(m, Request(PERM, "edit", None, ("/a/b",)))


_GLOBS = ["{cwd}/**", "{cwd}/src/*.py", "**/.env", "/etc/**", "/w/p/[ab]*", "{cwd}",
          "**/*.py", "**/p/**"]  # fmt: skip
_COMPILED = {g: compile_glob(g, None) for g in _GLOBS}
_LONG = "/w/p/" + "x" * 4100
_PATHS = ["/w/p/src/a.py", "/w/p/.env", "/etc/passwd", "/w/p/b", "/tmp/x", "/w/pp/a", "/w/p"]
# Paths the fast path leaves to the reference (too long), or that are odd.
_ODD_PATHS = ["/w/p/a\nb", _LONG]
_TITLES = [re.compile("^Deploy"), re.compile("rm")]


def _some(items: list[str]) -> st.SearchStrategy[tuple[str, ...] | None]:
    return st.one_of(st.none(), st.lists(st.sampled_from(items), min_size=1, max_size=2).map(tuple))


_globs = _some(_GLOBS).map(lambda gs: None if gs is None else tuple(_COMPILED[g] for g in gs))
_matches = st.builds(
    Match,
    methods=_some([PERM, READ, "fs/*"]),
    kinds=_some(["read", "edit", "execute"]),
    commands=st.sampled_from([None, (("rm", "-rf"),), (("git",),)]),
    paths=_globs,
    paths_outside=_globs,
    title=st.sampled_from([None, *_TITLES]),
    agents=_some(["claude*", "gemini"]),
)
# Rules whose only conditions are the method, the kind and paths (the fast path's group regex).
_path_matches = st.builds(
    Match,
    methods=_some([PERM, READ, "fs/*"]),
    kinds=_some(["read", "edit", "execute"]),
    paths=_globs.filter(lambda gs: gs is not None),
)
_rule_lists = st.lists(
    st.tuples(
        st.one_of(_matches, _path_matches), st.sampled_from(list(Decision)), st.integers(0, 2)
    ),
    min_size=1,
    max_size=10,
).map(lambda got: [PolicyRule(f"r{i}", m, d, priority=p) for i, (m, d, p) in enumerate(got)])


_requests = st.builds(
    Request,
    st.sampled_from([PERM, READ, "fs/write_text_file"]),
    st.sampled_from(["read", "edit", "execute", "think", None]),
    st.sampled_from([("rm", "-rf", "x"), ("git", "push"), None]),
    st.one_of(
        st.lists(st.sampled_from(_PATHS), max_size=3),
        st.lists(st.sampled_from(_PATHS + _ODD_PATHS), max_size=3),
    ).map(tuple),
    st.sampled_from([None, "Deploy prod", "rm -rf", "x" * 4100]),
    st.sampled_from(["claude-code", "gemini", None]),
    st.sampled_from(["/w/p", "/", None]),
)


@settings(max_examples=300, deadline=None)
@given(_rule_lists, _requests)
def test_the_indexed_decider_decides_as_the_reference(
    rules: list[PolicyRule], request: Request
) -> None:
    p = Policy(tuple(rules))
    decider = Decider(p)
    try:
        expected: object = decide(p, request)
    except Undecidable:
        expected = Undecidable
    for _ in range(2):  # the second time from the group table
        try:
            got: object = decider.decide(request)
        except Undecidable:
            got = Undecidable
        assert got == expected


def test_rules_are_tried_in_precedence_order_and_the_first_match_decides() -> None:
    # A weaker rule that cannot be decided (a {cwd} glob, no cwd) does not stop a stronger
    # one that matches: it comes after it, and is never tried.
    weak = PolicyRule("weak", Match(paths=(compile_glob("{cwd}/**", None),)), Decision.ALLOW)
    strong = PolicyRule("strong", Match(kinds=("read",)), Decision.DENY)
    p = Policy((weak, strong))
    request = Request(PERM, "read", None, ("/w/p/a",), cwd=None)
    assert decide(p, request) == Verdict(Decision.DENY, "strong")
    assert Decider(p).decide(request) == Verdict(Decision.DENY, "strong")
    alone = Policy((weak,))
    with pytest.raises(Undecidable):
        decide(alone, request)
    with pytest.raises(Undecidable):
        Decider(alone).decide(request)


def test_the_fast_path_on_paths_outside_the_cwd_and_on_several_paths() -> None:
    cwd_itself = PolicyRule("cwd", Match(paths=(compile_glob("{cwd}", None),)), Decision.DENY)
    etc = PolicyRule("etc", Match(paths=(compile_glob("/etc/**", None),)), Decision.ASK)
    tmp = PolicyRule("tmp", Match(paths=(compile_glob("/tmp/**", None),)), Decision.ALLOW)
    p = Policy((tmp, etc, cwd_itself))
    for paths, expected in [
        (("/etc/passwd",), "etc"),  # not the cwd: "{cwd}" does not match it
        (("/w/p",), "cwd"),
        (("/etc/passwd", "/tmp/x"), "etc"),  # ask beats allow whichever path comes first
        (("/tmp/x", "/etc/passwd"), "etc"),
        (("/tmp/x", "/w/p"), "cwd"),
    ]:
        request = Request(PERM, "read", None, paths, cwd="/w/p")
        assert decide(p, request).rule == expected
        assert Decider(p).decide(request).rule == expected


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab -'\"\\\t\n\r\x0b\x0c\u00a0\u3000#", max_size=12))
def test_a_command_splits_as_shlex_splits_it(command: str) -> None:
    try:
        expected: object = tuple(shlex.split(command)) or None
    except ValueError:
        expected = None
    assert split_command(command) == expected


def test_on_unasked_is_read_checked_explained_and_in_the_schema() -> None:
    assert error_lines("policy:\n  on_unasked: kill\n") == [
        'p.yaml:2: policy.on_unasked: expected one of "audit", "cancel", got "kill"'
    ]
    explained = {
        (mode, on): explain_policy(policy(f"policy:\n  mode: {mode}\n  on_unasked: {on}\n"))[2]
        for mode in ("enforce", "monitor")
        for on in ("audit", "cancel")
    }
    head = "  a tool call a deny rule matches that ran without asking: "
    assert explained == {
        ("enforce", "audit"): head + "audited",
        ("monitor", "audit"): head + "audited",
        ("enforce", "cancel"): head + "audited, and its session cancelled (session/cancel)",
        ("monitor", "cancel"): head + "audited (on_unasked: cancel applies in enforce mode only)",
    }
    assert policy("policy: {}\n").on_unasked is OnUnasked.AUDIT
    schema: Any = policy_schema()
    assert schema["policy"]["properties"]["on_unasked"]["enum"] == ["audit", "cancel"]


_glob_bodies = st.lists(
    st.sampled_from(["/", "/", "a", "b", ".", "*", "**", "?", "[ab]", "[!a]", "[/]"]),
    min_size=1,
    max_size=7,
).map("".join)
_abs_paths = st.lists(st.sampled_from(["/", "a", "b", ".", "ab"]), max_size=8).map(
    lambda parts: "/" + "".join(parts)
)


@settings(max_examples=400, deadline=None)
@given(_glob_bodies, _abs_paths)
def test_the_fast_regex_and_its_key_agree_with_the_glob(body: str, path: str) -> None:
    """A glob's fast regex (backwards for ``**`` globs) matches a path exactly when the glob
    does, and a path it matches starts (backwards: ends) with the glob's key."""
    source = body if body.startswith(("/", "**")) else "/" + body
    for glob in (compile_glob(source, None), compile_glob("{cwd}" + "/" + body, None)):
        if glob.anchor == "/":
            text = path[::-1] if glob.reverse else path
            expected = glob_matches(glob, path, None)
        else:
            text = "" if path == "/" else path  # the rest after a cwd of "/"
            expected = glob_matches(glob, path, "/")
        fast = re.match(f"(?:{glob.fast})\\Z", text, re.DOTALL) is not None
        assert fast == expected, (glob.source, path)
        if expected and glob.key is not None:
            if glob.reverse:
                assert text[:1] == glob.key
            else:
                cut = text.find("/", 1)
                assert (text if cut < 0 else text[:cut]) == glob.key, (glob.source, path)
