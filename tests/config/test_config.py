"""Tests for acp_proxy.config: the YAML schema, its exact error messages, and the built chain."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from proxy_harness import REPO, TESTS

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.config import (
    AgentConfig,
    CoalesceConfig,
    Config,
    ConfigError,
    NamedMiddleware,
    NonJsonPolicy,
    StderrMode,
    explain_config,
    load_config,
    parse_config,
)
from acp_proxy.meta.annotate import V1Mode
from acp_proxy.rules.engine import Rule, RuleDirection, RulesMiddleware, RuleTarget
from acp_proxy.wire.chain import Direction, MessageContext, Replace

R = "rules:\n  - name: r\n"  # the start of a one-rule file
TOP = (
    "rules, middleware_paths, middleware, v1, max_frame_bytes, max_buffer_bytes, max_parse_bytes, "
    "max_pending_requests, non_json, agent, coalesce, listen, connect, connect_timeout, "
    "max_connections, handshake_timeout, ws_ping_interval, detach_grace, detach_buffer_bytes, "
    "detach_buffer_frames, takeover, allow_remote, metrics_allow_remote, metrics, tracing, "
    "record, ui, tls, auth, policy, budgets"
)
KINDS = (
    "agent_message, agent_message_chunk, agent_thought, agent_thought_chunk, "
    "available_commands_update, compaction_summary_chunk, compaction_update, "
    "config_option_update, current_mode_update, notice, plan, plan_removed, plan_update, "
    "session_info_update, session_message, session_message_chunk, state_update, "
    "subagent_update, terminal_output_chunk, terminal_update, tool_call, "
    "tool_call_content_chunk, tool_call_update, usage_update, user_message, user_message_chunk"
)
NS = "(only the W3C trace keys traceparent, tracestate, baggage may be bare)"
SIZE = (
    'expected a size in bytes: a positive integer or a string such as "64MiB" '
    "(units B, KB, KiB, MB, MiB, GB, GiB, or k, m, g for KiB, MiB, GiB; any case)"
)
ADDR = 'expected an address such as "tcp://127.0.0.1:7777" or "unix:///run/acp.sock"'


@pytest.fixture(autouse=True)
def _user_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """``custom_middleware`` (in tests/) is importable, as a user's package would be."""
    monkeypatch.syspath_prepend(str(TESTS))


def parse(text: str, env: dict[str, str] | None = None) -> Config:
    return parse_config(text, "rules.yaml", env or {})


# --- errors: exact messages ----------------------------------------------------------------------

ERRORS: list[tuple[str, str, str]] = [
    # YAML syntax, in plain words with a hint (more in test_config_quality.py)
    (
        "yaml-unclosed-flow",
        "rules:\n  - name: a\n    match: {direction: both\n",
        'rules.yaml:3: unclosed "{": it has no matching "}"',
    ),
    (
        "yaml-indent",
        "rules:\n  - name: a\n   set_meta: 1\n",
        "rules.yaml:3: bad indentation (column 4): a key that does not line up with the list "
        'that starts on line 2; the keys of one mapping, and the "-" of one list, must start '
        "in the same column",
    ),
    (
        "yaml-tab",
        "rules:\n\t- name: a\n",
        "rules.yaml:2: a tab character (column 1): YAML indents with spaces only; replace the "
        "tab with spaces",
    ),
    (
        "yaml-two-documents",
        "a: 1\n---\nb: 2\n",
        'rules.yaml:2: a second YAML document ("---"): a config file holds one document',
    ),
    # unknown fields, with a suggestion when one is close
    (
        "unknown-top-key",
        "rule:\n  - name: x\n",
        f'rules.yaml:1: rule: unknown key "rule"; did you mean "rules"? Valid keys: {TOP}',
    ),
    (
        "unknown-top-key-no-suggestion",
        "zzz: 1\n",
        f'rules.yaml:1: zzz: unknown key "zzz". Valid keys: {TOP}',
    ),
    (
        "unknown-rule-key",
        R + "    mach: {}\n",
        'rules.yaml:3: rules[0].mach: unknown key "mach"; did you mean "match"? '
        "Valid keys: name, match, target, set_meta, remove_meta, overwrite",
    ),
    (
        "unknown-match-key",
        R + "    match:\n      methd: x\n    set_meta: {a/b: 1}\n",
        'rules.yaml:4: rules[0].match.methd: unknown key "methd"; did you mean "method"? '
        "Valid keys: direction, method, update",
    ),
    (
        "unknown-agent-key",
        "agent:\n  environment: {}\n",
        'rules.yaml:2: agent.environment: unknown key "environment". '
        "Valid keys: env, stderr, grace_period, drain_timeout",
    ),
    (
        "duplicate-key",
        R + "    set_meta: {a/b: 1}\n    set_meta: {a/c: 1}\n",
        'rules.yaml:4: rules[0].set_meta: duplicate key "set_meta" (first on line 3)',
    ),
    # wrong types
    (
        "top-level-list",
        "- a\n- b\n",
        f"rules.yaml:1: expected a mapping with keys {TOP}, got a list",
    ),
    (
        "rules-mapping",
        "rules:\n  name: x\n",
        "rules.yaml:2: rules: expected a list of rules, got a mapping",
    ),
    (
        "rule-scalar",
        "rules:\n  - x\n",
        "rules.yaml:2: rules[0]: expected a mapping with keys name, match, target, set_meta, "
        'remove_meta, overwrite, got a string ("x")',
    ),
    (
        "size-string",
        "max_frame_bytes: big\n",
        f'rules.yaml:1: max_frame_bytes: {SIZE}, got a string ("big")',
    ),
    ("size-zero", "max_frame_bytes: 0\n", f"rules.yaml:1: max_frame_bytes: {SIZE}, got 0"),
    (
        "bool-quoted",
        R + '    set_meta: {a/b: 1}\n    overwrite: "yes"\n',
        'rules.yaml:4: rules[0].overwrite: expected true or false, got a string ("yes")',
    ),
    (
        "set-meta-list",
        R + "    set_meta: [a/b]\n",
        "rules.yaml:3: rules[0].set_meta: expected a mapping of metadata keys to values, "
        "got a list",
    ),
    (
        "name-int",
        "rules:\n  - name: 123\n    set_meta: {a/b: 1}\n",
        "rules.yaml:2: rules[0].name: expected a string, got an integer (123); quote it",
    ),
    (
        "env-bool",
        "agent:\n  env: {DEBUG: true}\n",
        "rules.yaml:2: agent.env.DEBUG: expected a string, got a boolean (true); quote it",
    ),
    (
        "non-string-meta-key",
        R + "    set_meta: {1: x}\n",
        "rules.yaml:3: rules[0].set_meta: keys must be strings, got an integer (1)",
    ),
    (
        "infinite-number",
        R + "    set_meta: {a/b: .inf}\n",
        'rules.yaml:3: rules[0].set_meta["a/b"]: .inf is not a JSON number',
    ),
    (
        "binary-value",
        R + "    set_meta: {a/b: !!binary aGVsbG8=}\n",
        # Tags outside the YAML core schema are refused while composing the document.
        "rules.yaml:3: unknown tag !!binary: only the standard YAML tags (!!str, !!int, "
        "!!float, !!bool, !!null, !!seq, !!map) are allowed; remove the tag",
    ),
    (
        "negative-grace",
        "agent: {grace_period: -1}\n",
        "rules.yaml:1: agent.grace_period: expected a number of seconds >= 0, got -1",
    ),
    (
        "negative-interval",
        "coalesce: {min_interval_ms: -5}\n",
        "rules.yaml:1: coalesce.min_interval_ms: expected an integer >= 0, got -5",
    ),
    (
        "enum-with-suggestion",
        R + "    match: {direction: agent_to_clients}\n    set_meta: {a/b: 1}\n",
        'rules.yaml:3: rules[0].match.direction: expected one of "agent_to_client", '
        '"client_to_agent", "both", got "agent_to_clients"; did you mean "agent_to_client"?',
    ),
    (
        "enum-target",
        R + "    target: params\n    set_meta: {a/b: 1}\n",
        'rules.yaml:3: rules[0].target: expected one of "entity", "message", got "params"',
    ),
    (
        "enum-non-json",
        "non_json: drop\n",
        'rules.yaml:1: non_json: expected one of "log", "forward", got "drop"',
    ),
    (
        "enum-v1-mode",
        "v1: {mode: stateless}\n",
        'rules.yaml:1: v1.mode: expected one of "safe", "stateful", "off", got "stateless"; '
        'did you mean "stateful"?',
    ),
    (
        "listen-no-scheme",
        "listen: 127.0.0.1:7777\n",
        f'rules.yaml:1: listen: {ADDR}, got "127.0.0.1:7777"',
    ),
    ("connect-port-0", "connect: tcp://h:0\n", f'rules.yaml:1: connect: {ADDR}, got "tcp://h:0"'),
    # metadata keys must be namespaced
    (
        "un-namespaced-set",
        R + "    set_meta:\n      route: edge\n",
        'rules.yaml:4: rules[0].set_meta.route: key "route" is not namespaced: metadata keys '
        f'need a namespace, such as "example.dev/route" {NS}',
    ),
    (
        "un-namespaced-remove",
        R + "    remove_meta: [debugMode]\n",
        'rules.yaml:3: rules[0].remove_meta[0]: key "debugMode" is not namespaced: metadata '
        f'keys need a namespace, such as "example.dev/debugMode" {NS}',
    ),
    (
        "empty-namespace",
        R + "    set_meta: {/x: 1}\n",
        'rules.yaml:3: rules[0].set_meta["/x"]: key "/x" is not namespaced: metadata keys '
        f'need a namespace, such as "example.dev/x" {NS}',
    ),
    # rule semantics
    (
        "null-value",
        R + "    set_meta:\n      a/b: null\n",
        'rules.yaml:4: rules[0].set_meta["a/b"]: null would remove the key: list it under '
        "remove_meta instead",
    ),
    (
        "set-and-remove",
        R + "    set_meta: {a/b: 1}\n    remove_meta: [a/b]\n",
        'rules.yaml:4: rules[0].remove_meta[0]: "a/b" is both in set_meta and remove_meta: '
        "keep one",
    ),
    (
        "changes-nothing",
        R + "    match: {direction: both}\n",
        "rules.yaml:2: rules[0]: the rule changes nothing: give set_meta and/or remove_meta",
    ),
    (
        "duplicate-rule-name",
        R + "    set_meta: {a/b: 1}\n  - name: r\n    set_meta: {a/b: 1}\n",
        'rules.yaml:4: rules[1].name: duplicate rule name "r" (also rules[0])',
    ),
    (
        "empty-method",
        R + "    match: {method: ''}\n    set_meta: {a/b: 1}\n",
        "rules.yaml:3: rules[0].match.method: must not be empty",
    ),
    # update kinds
    (
        "unknown-update-kind",
        R + "    match:\n      update: [tool_call_update, tool_cal]\n    set_meta: {a/b: 1}\n",
        'rules.yaml:4: rules[0].match.update[1]: unknown sessionUpdate kind "tool_cal"; '
        'did you mean "tool_call"? Valid: "upserts", an extension kind starting with "_", '
        f"or one of {KINDS}",
    ),
    (
        "unknown-update-kind-single",
        R + "    match:\n      update: upsert\n    set_meta: {a/b: 1}\n",
        'rules.yaml:4: rules[0].match.update: unknown sessionUpdate kind "upsert"; '
        'did you mean "upserts"? Valid: "upserts", an extension kind starting with "_", '
        f"or one of {KINDS}",
    ),
    (
        "empty-update-list",
        R + "    match:\n      update: []\n    set_meta: {a/b: 1}\n",
        "rules.yaml:4: rules[0].match.update: must not be empty (omit it to match any message)",
    ),
    (
        "update-with-other-method",
        R + "    match:\n      method: session/prompt\n      update: [tool_call_update]\n"
        "    set_meta: {a/b: 1}\n",
        'rules.yaml:5: rules[0].match.update: method "session/prompt" never carries a '
        'sessionUpdate: "update" needs method session/update (or no method)',
    ),
    # environment
    (
        "missing-env-var",
        R + '    set_meta:\n      example.dev/host: "${HOSTNAME}"\n',
        'rules.yaml:4: rules[0].set_meta["example.dev/host"]: environment variable HOSTNAME '
        "is not set (set it, or give a default: ${HOSTNAME:-default})",
    ),
    (
        "missing-env-var-nested",
        R + '    set_meta:\n      example.dev/x: {a: [1, "${NOPE}"]}\n',
        'rules.yaml:4: rules[0].set_meta["example.dev/x"].a[1]: environment variable NOPE '
        "is not set (set it, or give a default: ${NOPE:-default})",
    ),
    (
        "bad-env-reference",
        R + '    set_meta:\n      example.dev/x: "${1X}"\n',
        'rules.yaml:4: rules[0].set_meta["example.dev/x"]: invalid environment reference '
        '"${1X}": expected ${NAME} or ${NAME:-default} with NAME made of letters, digits and '
        '"_" (write "$$" for a "$")',
    ),
    (
        "unterminated-env-reference",
        R + '    set_meta:\n      example.dev/x: "${X"\n',
        'rules.yaml:4: rules[0].set_meta["example.dev/x"]: unterminated "${" in "${X" '
        '(write "$$" for a "$")',
    ),
    # middleware
    (
        "middleware-module-missing",
        "middleware:\n  - use: nope.mod:Thing\n",
        'rules.yaml:2: middleware[0].use: cannot import module "nope.mod": '
        "No module named 'nope'",
    ),
    (
        "middleware-attribute-missing",
        "middleware:\n  - use: custom_middleware:Tagg\n",
        'rules.yaml:2: middleware[0].use: "custom_middleware" has no attribute "Tagg"; '
        'did you mean "Tag"?',
    ),
    (
        "middleware-not-callable",
        "middleware:\n  - use: custom_middleware:NOT_CALLABLE\n",
        'rules.yaml:2: middleware[0].use: "custom_middleware:NOT_CALLABLE" is not a class '
        "(it is int): expected a middleware class (subclass acp_proxy.middleware.BaseMiddleware)",
    ),
    (
        "middleware-bad-options",
        "middleware:\n  - use: custom_middleware:Tag\n    with: {colour: red}\n",
        "rules.yaml:3: middleware[0].with: custom_middleware:Tag does not accept these "
        "options: got an unexpected keyword argument 'colour' "
        "(its parameters: key='example.dev/tag', value='x')",
    ),
    (
        "middleware-constructor-raises",
        "middleware:\n  - use: custom_middleware:Picky\n    with:\n      level: loud\n",
        "rules.yaml:4: middleware[0].with: custom_middleware:Picky(...) raised ValueError: "
        "level must be info or debug, not 'loud'",
    ),
    (
        "middleware-not-a-middleware",
        "middleware:\n  - use: custom_middleware:NotMiddleware\n",
        # Refused from the class itself, before it is called.
        'rules.yaml:2: middleware[0].use: "custom_middleware:NotMiddleware" is a class without '
        "a `__call__(message, ctx)` method: expected a middleware class "
        "(subclass acp_proxy.middleware.BaseMiddleware)",
    ),
    (
        "middleware-bad-use",
        "middleware:\n  - use: rule\n",
        'rules.yaml:2: middleware[0].use: expected "rules" or an import path '
        '"package.module:Class", got "rule"; did you mean "rules"?',
    ),
    (
        "middleware-dotted-use",
        "middleware:\n  - use: custom_middleware.Tag\n",
        'rules.yaml:2: middleware[0].use: expected "rules" or an import path '
        '"package.module:Class", got "custom_middleware.Tag"',
    ),
    (
        "middleware-no-use",
        "middleware:\n  - with: {}\n",
        'rules.yaml:2: middleware[0]: missing "use": "rules" or an import path such as '
        '"mypkg.module:Class"',
    ),
    (
        "middleware-rules-with",
        "middleware:\n  - use: rules\n    with: {a: 1}\n",
        'rules.yaml:3: middleware[0].with: the built-in rules take no "with": configure them '
        'under "rules:" (valid keys here: use, fail_closed)',
    ),
    (
        "middleware-rules-twice",
        "middleware:\n  - use: rules\n  - use: rules\n",
        "rules.yaml:3: middleware[1].use: the rules are already listed at middleware[0]",
    ),
    (
        "middleware-duplicate-name",
        "middleware:\n  - use: custom_middleware:Tag\n  - use: custom_middleware:Tag\n",
        'rules.yaml:3: middleware[1].name: duplicate middleware name "Tag" (also '
        'middleware[0]); give one a distinct "name:"',
    ),
    (
        "middleware-without-rules",
        R + "    set_meta: {a/b: 1}\nmiddleware:\n  - use: custom_middleware:Tag\n",
        'rules.yaml:5: middleware: the rules are defined but not listed here: add "- use: rules" '
        "where they should run in the chain",
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [(t, e) for _, t, e in ERRORS], ids=[i for i, _, _ in ERRORS]
)
def test_error_messages(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert str(info.value) == expected


def test_error_fields() -> None:
    with pytest.raises(ConfigError) as info:
        parse(R + "    set_meta:\n      route: edge\n")
    err = info.value
    assert (err.file, err.line, err.path) == ("rules.yaml", 4, "rules[0].set_meta.route")
    assert err.reason.startswith('key "route" is not namespaced')


def test_middleware_import_error_other_than_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "broken_user_mw.py").write_text("raise RuntimeError('half-written module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        parse("middleware:\n  - use: broken_user_mw:X\n")
    assert str(info.value) == (
        'rules.yaml:2: middleware[0].use: importing module "broken_user_mw" raised '
        "RuntimeError: half-written module"
    )


# --- files -----------------------------------------------------------------------------------


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("rules:\n  - name: x\n    set_meta: {host: a}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    assert str(info.value) == (
        f'{path}:3: rules[0].set_meta.host: key "host" is not namespaced: metadata keys need a '
        f'namespace, such as "example.dev/host" {NS}'
    )


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    assert str(info.value) == f"{path}: cannot read the config file: No such file or directory"


def test_load_config_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"rules:\n  - name: caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    assert str(info.value) == f"{path}:2: the file is not valid UTF-8"


def test_no_config_is_pass_through() -> None:
    config = load_config(None, {})
    assert config == Config()
    assert len(config.build_chain()) == 0


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_empty_file_is_pass_through(text: str) -> None:
    config = parse(text)
    assert config == Config(source="rules.yaml")
    assert len(config.build_chain()) == 0


def test_example_yaml_loads() -> None:
    config = load_config(str(REPO / "config" / "example.yaml"), {"HOSTNAME": "box-1"})
    assert config.rule_names == ("edge-route", "proxied-by")
    edge = config.rules[0]
    assert edge == Rule(
        name="edge-route",
        set_meta={"example.dev/route": "edge", "example.dev/host": "box-1"},
        remove_meta=("zed.dev/debugMode",),
        target=RuleTarget.ENTITY,
        overwrite=False,
        direction=RuleDirection.AGENT_TO_CLIENT,
        method="session/update",
        update_kinds=("tool_call_update", "terminal_update"),
        line=11,
    )
    assert config.rules[1].target is RuleTarget.MESSAGE
    assert [s.name for s in config.middleware] == ["rules"]
    # Loads without HOSTNAME too (it has a default), so check-config works anywhere.
    assert (
        load_config(str(REPO / "config" / "example.yaml"), {}).rules[0].set_meta["example.dev/host"]
        == "unknown-host"
    )


def test_bundled_default_loads_without_environment() -> None:
    config = load_config(str(REPO / "acp_proxy" / "data" / "default.yaml"), {})
    assert config.rule_names == ("edge-route",)
    assert config.rules[0].set_meta == {
        "example.dev/route": "edge",
        "example.dev/host": "demo-host",
    }
    assert config.rules[0].remove_meta == ("zed.dev/debugMode",)


# --- the full schema -------------------------------------------------------------------------

FULL = """\
rules:
  - name: trace
    match: {direction: client_to_agent, method: "session/*", update: upserts}
    target: message
    overwrite: yes
    set_meta: {traceparent: "${TP}", example.dev/n: 1, example.dev/o: {a: [true, null, 1.5]}}
  - remove_meta: [zed.dev/debugMode, zed.dev/debugMode]
    match:
      update: [plan_update, _custom_kind, upserts]
middleware:
  - use: custom_middleware:Tag
    with: {value: "v-${TP:-none}"}
    name: tagger
    fail_closed: true
  - use: rules
v1: {mode: stateful, max_entities: 5}
max_frame_bytes: 1MiB
non_json: forward
agent:
  env: {RUST_LOG: debug, PORT: 8080, EMPTY: ""}
  stderr: log
  grace_period: 0.5
coalesce: {enabled: false, max_queue_messages: 10, max_queue_bytes: 2048, min_interval_ms: 100}
listen: unix:///run/acp.sock
connect: tcp://[::1]:7777
connect_timeout: 3
max_connections: 8
handshake_timeout: 2.5
detach_grace: 300
detach_buffer_bytes: 1MiB
detach_buffer_frames: 50
takeover: true
allow_remote: true
"""


def test_full_schema() -> None:
    config = parse(FULL, {"TP": "00-abc-01"})
    assert config.rules == (
        Rule(
            name="trace",
            set_meta={
                "traceparent": "00-abc-01",
                "example.dev/n": 1,
                "example.dev/o": {"a": [True, None, 1.5]},
            },
            target=RuleTarget.MESSAGE,
            overwrite=True,
            direction=RuleDirection.CLIENT_TO_AGENT,
            method="session/*",
            update_upserts=True,
            line=2,
        ),
        Rule(
            name="rules[1]",
            remove_meta=("zed.dev/debugMode",),
            update_kinds=("plan_update", "_custom_kind"),
            update_upserts=True,
            line=7,
        ),
    )
    assert config.rule_names == ("trace", "rules[1]")
    assert [(s.name, s.use, s.fail_closed, s.line) for s in config.middleware] == [
        ("tagger", "custom_middleware:Tag", True, 11),
        ("rules", "rules", False, 15),
    ]
    assert config.middleware[0].options == {"value": "v-00-abc-01"}
    rest = (
        config.v1_mode,
        config.v1_max_entities,
        config.max_frame_bytes,
        config.non_json,
        config.agent,
        config.coalesce,
        config.listen,
        config.connect,
        config.connect_timeout_s,
        config.max_connections,
        config.handshake_timeout_s,
        (
            config.detach_grace_s,
            config.detach_buffer_bytes,
            config.detach_buffer_frames,
            config.takeover,
        ),
        config.allow_remote,
    )
    assert rest == (
        V1Mode.STATEFUL,
        5,
        1024 * 1024,
        NonJsonPolicy.FORWARD,
        AgentConfig(
            env={"RUST_LOG": "debug", "PORT": "8080", "EMPTY": ""},
            stderr=StderrMode.LOG,
            grace_period_s=0.5,
        ),
        CoalesceConfig(
            enabled=False, max_queue_messages=10, max_queue_bytes=2048, min_interval_ms=100
        ),
        "unix:///run/acp.sock",
        "tcp://[::1]:7777",
        3.0,
        8,
        2.5,
        (300.0, 1024 * 1024, 50, True),
        True,
    )


def test_defaults() -> None:
    config = parse("rules: []\n")
    assert config == Config(source="rules.yaml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", 1024),
        ("0x400", 1024),
        ('"1B"', 1),
        ('"2KB"', 2000),
        ('"2KiB"', 2048),
        ('"3 MB"', 3_000_000),
        ('"64MiB"', 64 * 1024**2),
        ('"1GiB"', 1024**3),
        ('"1GB"', 10**9),
        # any case, a space or not, one-letter binary units
        ('"64mb"', 64 * 1000**2),
        ('"64 MB"', 64 * 1000**2),
        ('"64mib"', 64 * 1024**2),
        ('"64k"', 64 * 1024),
        ('"64K"', 64 * 1024),
        ('"2m"', 2 * 1024**2),
        ('"1g"', 1024**3),
        ('"7b"', 7),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse(f"max_frame_bytes: {text}\n").max_frame_bytes == expected


ENV = {"A": "alpha", "EMPTY": "", "DOLLAR": "$HOME"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", "plain"),
        ("${A}", "alpha"),
        ("x-${A}-${A}-y", "x-alpha-alpha-y"),
        ("${MISSING:-fallback}", "fallback"),
        ("${EMPTY:-fallback}", "fallback"),  # like the shell: the default also covers empty
        ("${EMPTY}", ""),
        ("${A:-fallback}", "alpha"),
        ("${MISSING:-}", ""),
        ("${MISSING:-a:-b}", "a:-b"),
        ("$$", "$"),
        ("$${A}", "${A}"),
        ("cost: $5", "cost: $5"),  # a "$" not followed by "{" or "$" is kept
        ("${DOLLAR}", "$HOME"),  # values are not expanded again
        ("end$", "end$"),
    ],
)
def test_environment_expansion(value: str, expected: str) -> None:
    text = R + f"    set_meta:\n      example.dev/v: '{value}'\n"
    assert parse(text, ENV).rules[0].set_meta["example.dev/v"] == expected


def test_expansion_is_once_at_load() -> None:
    env = {"A": "1"}
    config = parse(R + "    set_meta: {example.dev/v: '${A}'}\n", env)
    env["A"] = "2"
    assert config.rules[0].set_meta["example.dev/v"] == "1"


def test_yaml_merge_keys_and_anchors() -> None:
    text = (
        "rules:\n"
        "  - name: a\n"
        "    set_meta: &common {example.dev/a: 1}\n"
        "  - name: b\n"
        "    set_meta:\n"
        "      <<: *common\n"
        "      example.dev/b: 2\n"
    )
    rules = parse(text).rules
    assert rules[0].set_meta == {"example.dev/a": 1}
    assert rules[1].set_meta == {"example.dev/a": 1, "example.dev/b": 2}


def test_dates_stay_text() -> None:
    rule = parse(R + "    set_meta: {example.dev/since: 2024-01-02}\n").rules[0]
    assert rule.set_meta == {"example.dev/since": "2024-01-02"}


@pytest.mark.parametrize("key", ["traceparent", "tracestate", "baggage"])
def test_w3c_keys_may_be_bare(key: str) -> None:
    assert parse(R + f"    target: message\n    set_meta: {{{key}: v}}\n").rules[0].set_meta == {
        key: "v"
    }


# --- the chain -------------------------------------------------------------------------------

V2 = MessageContext(Direction.AGENT_TO_CLIENT, 2)


def notification(meta: JsonObject | None = None) -> JsonObject:
    params: JsonObject = {
        "sessionId": "s",
        "update": {"sessionUpdate": "plan_update", "plan": {"planId": "p"}},
    }
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "method": "session/update", "params": params}


def test_chain_is_just_the_rules_without_middleware_key() -> None:
    config = parse(R + "    target: message\n    set_meta: {example.dev/a: 1}\n")
    chain = config.build_chain()
    assert len(chain) == 1
    link = chain.links[0]
    assert isinstance(link.middleware, RulesMiddleware)
    assert link.middleware.name == "rules"
    assert not link.fail_closed


def test_chain_order_kwargs_and_fresh_instances() -> None:
    text = (
        R + "    target: message\n    set_meta: {example.dev/a: rule}\n"
        "middleware:\n"
        "  - use: custom_middleware:Tag\n"
        "    with: {key: example.dev/a, value: tag}\n"
        "  - use: rules\n"
    )
    config = parse(text)
    chain = config.build_chain()
    first = chain.links[0].middleware
    assert [link.middleware.name for link in chain.links] == ["Tag", "rules"]
    # Tag runs first and sets the key; the rule (overwrite: false) then keeps it.
    outcome = chain.run(notification(), V2)
    assert outcome.messages == (notification({"example.dev/a": "tag"}),)
    assert outcome.changed_by == ("Tag",)
    # Each connection gets new instances (per-connection state).
    again = config.build_chain().links[0].middleware
    assert again is not first
    from custom_middleware import Tag

    assert isinstance(first, Tag) and isinstance(again, Tag)
    assert (first.calls, again.calls) == (1, 0)


def test_rules_first_then_custom() -> None:
    text = (
        R + "    target: message\n    overwrite: true\n    set_meta: {example.dev/a: rule}\n"
        "middleware:\n"
        "  - use: rules\n"
        "  - use: custom_middleware:Tag\n"
        "    with: {key: example.dev/b}\n"
    )
    outcome = parse(text).build_chain().run(notification(), V2)
    assert outcome.messages == (notification({"example.dev/a": "rule", "example.dev/b": "x"}),)
    assert outcome.changed_by == ("rules:r", "Tag")


def test_named_middleware_and_needles() -> None:
    config = parse("middleware:\n  - use: custom_middleware:Tag\n    name: tagger\n")
    mw = config.build_chain().links[0].middleware
    assert isinstance(mw, NamedMiddleware)
    assert mw.name == "tagger"
    assert mw.needles == (b'"session/update"',)
    assert mw(notification(), V2) == Replace((notification({"example.dev/tag": "x"}),))
    # The same name as the instance's own: no wrapper.
    config = parse("middleware:\n  - use: custom_middleware:Tag\n    name: Tag\n")
    assert type(config.build_chain().links[0].middleware).__name__ == "Tag"


def test_each_instance_gets_its_own_options() -> None:
    config = parse(
        "middleware:\n  - use: custom_middleware:Options\n"
        "    with: {items: [1], nested: {a: [2]}}\n"
    )
    from custom_middleware import Options

    first = config.build_chain().links[0].middleware
    second = config.build_chain().links[0].middleware
    assert isinstance(first, Options) and isinstance(second, Options)
    first.items.append(99)
    first.nested["a"].append(99)
    assert (second.items, second.nested) == ([1], {"a": [2]})
    assert config.middleware[0].options == {"items": [1], "nested": {"a": [2]}}


@pytest.mark.parametrize(
    ("fail_closed", "messages", "replies", "changed"),
    [
        (False, "original", (), False),
        (
            True,
            "none",
            (
                {
                    "jsonrpc": "2.0",
                    "id": 7,
                    "error": {"code": -32603, "message": "acp-proxy: middleware Boom failed"},
                },
            ),
            True,
        ),
    ],
)
def test_fail_open_and_fail_closed(
    fail_closed: bool, messages: str, replies: tuple[JsonObject, ...], changed: bool
) -> None:
    flag = "true" if fail_closed else "false"
    text = f"middleware:\n  - use: custom_middleware:Boom\n    fail_closed: {flag}\n"
    config = parse(text)
    assert config.middleware[0].fail_closed is fail_closed
    request: JsonObject = {"jsonrpc": "2.0", "id": 7, "method": "session/prompt", "params": {}}
    outcome = config.build_chain().run(request, MessageContext(Direction.CLIENT_TO_AGENT, 2))
    assert outcome.messages == ((request,) if messages == "original" else ())
    assert outcome.replies == replies
    assert outcome.changed is changed
    assert [(f.middleware, f.error, f.fail_closed) for f in outcome.failures] == [
        ("Boom", "RuntimeError: boom", fail_closed)
    ]


def test_rules_entry_fail_closed_and_v1_settings() -> None:
    text = (
        R + "    set_meta: {example.dev/a: 1}\n"
        "middleware:\n  - use: rules\n    fail_closed: true\n"
        "v1: {mode: 'off', max_entities: 3}\n"
    )
    config = parse(text)
    link = config.build_chain().links[0]
    assert link.fail_closed
    assert isinstance(link.middleware, RulesMiddleware)
    assert (config.v1_mode, config.v1_max_entities) == (V1Mode.OFF, 3)


def test_rules_listed_without_rules_is_allowed() -> None:
    chain = parse("middleware:\n  - use: rules\n").build_chain()
    mw = chain.links[0].middleware
    assert isinstance(mw, RulesMiddleware)
    assert mw.needles == ()  # never called
    assert not chain.wants(b'{"method":"session/update"}')


def test_parse_does_not_keep_references_to_the_environment() -> None:
    env = {"TP": "x"}
    before = copy.deepcopy(env)
    parse(FULL, env)
    assert env == before


# --- explain ---------------------------------------------------------------------------------

EXPLAINED = """\
config: rules.yaml
rules (2, applied in this order; every match applies):
  1. trace (line 2)
     match: direction client_to_agent, method session/* (glob), update upserts
     target: message params._meta (plain object); overwrite: yes
     set    traceparent = "00-abc-01"
     set    example.dev/n = 1
     set    example.dev/o = {"a":[true,null,1.5]}
  2. rules[1] (line 7)
     match: direction both, any method, update upserts, plan_update, _custom_kind
     target: entity _meta (metadata patch; v1 per the v1 mode); overwrite: no
     remove zed.dev/debugMode
middleware chain (in order):
  1. tagger = custom_middleware:Tag with {"value":"v-00-abc-01"}; fail-closed
  2. rules (built-in, 2 rules); fail-open
settings:
  v1: mode stateful, max_entities 5
  max_frame_bytes: 1048576 (1 MiB)
  max_buffer_bytes: 268435456 (256 MiB), process-wide
  non_json: forward
  agent: stderr log, grace_period 0.5 s, drain_timeout 60 s, env overrides: EMPTY, PORT, RUST_LOG
  coalesce: disabled, max_queue_messages 10, max_queue_bytes 2048 (2 KiB), min_interval_ms 100
  listen: unix:///run/acp.sock
  connect: tcp://[::1]:7777, connect_timeout 3 s
  max_connections: 8, handshake_timeout 2.5 s, allow_remote: yes
  detach: detach_grace 300 s, takeover: yes, buffer 1048576 (1 MiB) or 50 frames per agent
    no effect with connect: only a spawned agent is kept
  metrics: off
  tracing: off
  record: off (--record PATH turns it on)"""


def test_explain_config() -> None:
    assert explain_config(parse(FULL, {"TP": "00-abc-01"})) == EXPLAINED


def test_explain_pass_through() -> None:
    assert explain_config(Config()) == (
        "config: (none: pure pass-through)\n"
        "rules: none\n"
        "middleware chain: empty (pure pass-through)\n"
        "settings:\n"
        "  v1: mode safe, max_entities 10000\n"
        "  max_frame_bytes: 67108864 (64 MiB)\n"
        "  max_buffer_bytes: 268435456 (256 MiB), process-wide\n"
        "  non_json: log\n"
        "  agent: stderr passthrough, grace_period 5 s, drain_timeout 60 s, env overrides: none\n"
        "  coalesce: enabled, max_queue_messages 4096, max_queue_bytes 16777216 (16 MiB), "
        "min_interval_ms 0\n"
        "  listen: (stdio)\n"
        "  connect: (spawn the agent command), connect_timeout 10 s\n"
        "  max_connections: 64, handshake_timeout 30 s, allow_remote: no\n"
        "  detach: off (an agent stops when its client's connection ends)\n"
        "  metrics: off\n"
        "  tracing: off\n"
        "  record: off (--record PATH turns it on)"
    )


def test_explain_names_metrics_tracing_and_record_and_counts_in_words() -> None:
    text = (
        "rules:\n  - name: one\n    set_meta: {example.dev/a: 1}\n"
        "middleware:\n  - use: rules\n"
        "metrics: tcp://127.0.0.1:9464\n"
        "tracing: {enabled: true, inject: true}\n"
        "record: {path: /tmp/r.jsonl, max_bytes: 1MiB, redact: [foo], "
        "redact_patterns: ['a-[0-9]+', 'b+']}\n"
    )
    lines = explain_config(parse(text, {})).splitlines()
    assert lines[1] == "rules (1, applied in this order):"
    assert "  1. rules (built-in, 1 rule); fail-open" in lines
    assert lines[-3:] == [
        "  metrics: tcp://127.0.0.1:9464, metrics_allow_remote: no",
        "  tracing: enabled (OTLP, configured by OTEL_* variables), inject traceparent: yes",
        "  record: /tmp/r.jsonl, max_bytes 1048576 (1 MiB), redacting also 1 key name and "
        "2 patterns",
    ]
