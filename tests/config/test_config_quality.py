"""Config and CLI quality: every error at once, YAML errors in plain words,
check-config refuses what the run refuses, CLI niceties, and the JSON schema / README table
generated from the one declarative description of the settings (``config.SETTINGS``)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from proxy_harness import REPO, proxy_env

from acp_proxy import __version__, cli
from acp_proxy.config import (
    MATCH_KEYS,
    RULE_KEYS,
    SETTINGS,
    AgentConfig,
    AuthConfig,
    CoalesceConfig,
    Config,
    ConfigError,
    Kind,
    TlsConfig,
    TracingConfig,
    UiConfig,
    checks_text,
    json_schema,
    parse_config,
    settings_table,
)
from acp_proxy.record.format import RecordConfig
from acp_proxy.wire.raw.block_scan import SCANNER

SCHEMA_FILE = REPO / "config" / "acp-proxy.schema.json"
EXAMPLE = REPO / "config" / "example.yaml"


def proxy(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", *args],
        input=stdin,
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=60,  # only against a hang
        check=False,
    )


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml", {})
    return info.value.messages()


# --- every error of a file at once -------------------------------------------------------------

THREE_MISTAKES = """\
rules:
  - name: a
    set_meta: {example.dev/a: 1}
  - name: b
    mach: {method: session/update}
    set_meta: {example.dev/b: 2}
  - name: c
    set_meta: {route: edge}
coalesce:
  max_queue_bytes: 16 furlongs
"""


def test_three_mistakes_are_all_reported() -> None:
    assert errors_of(THREE_MISTAKES) == [
        'c.yaml:5: rules[1].mach: unknown key "mach"; did you mean "match"? '
        "Valid keys: name, match, target, set_meta, remove_meta, overwrite",
        'c.yaml:8: rules[2].set_meta.route: key "route" is not namespaced: metadata keys need '
        'a namespace, such as "example.dev/route" (only the W3C trace keys traceparent, '
        "tracestate, baggage may be bare)",
        "c.yaml:10: coalesce.max_queue_bytes: expected a size in bytes: a positive integer or "
        'a string such as "64MiB" (units B, KB, KiB, MB, MiB, GB, GiB, or k, m, g for KiB, '
        'MiB, GiB; any case), got a string ("16 furlongs")',
    ]


def test_the_cli_prints_every_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(THREE_MISTAKES)
    expected = "".join(
        f"acp-proxy: {m.replace('c.yaml', str(path), 1)}\n" for m in errors_of(THREE_MISTAKES)
    )
    for ran in (
        proxy("check-config", str(path)),
        proxy("--config", str(path), "--", sys.executable, "-c", "pass"),
    ):
        assert (ran.returncode, ran.stdout, ran.stderr.decode()) == (2, b"", expected)


def test_errors_in_several_sections_and_entries() -> None:
    text = (
        "bogus: 1\n"  # 1
        "v1: {mode: safer, max_entities: 0}\n"  # 2 (two errors on one line)
        "agent: {stderr: loud, grace_period: -1}\n"  # 3
        "middleware:\n"  # 4
        "  - use: nope.mod:X\n"  # 5
        "  - use: rules\n"  # 6
        "    with: {a: 1}\n"  # 7
        "rules:\n"  # 8
        "  - name: x\n"  # 9
        "    set_meta: {a/b: null, c: 1}\n"  # 10 (two)
        "    remove_meta: [d]\n"  # 11
    )
    assert [m.split(": ", 2)[:2] for m in errors_of(text)] == [
        ["c.yaml:1", "bogus"],
        ["c.yaml:2", "v1.mode"],
        ["c.yaml:2", "v1.max_entities"],
        ["c.yaml:3", "agent.stderr"],
        ["c.yaml:3", "agent.grace_period"],
        ["c.yaml:5", "middleware[0].use"],
        ["c.yaml:7", "middleware[1].with"],
        ["c.yaml:10", 'rules[0].set_meta["a/b"]'],
        ["c.yaml:10", "rules[0].set_meta.c"],
        ["c.yaml:11", "rules[0].remove_meta[0]"],
    ]


def test_a_broken_rules_entry_is_not_also_reported_missing() -> None:
    # The "- use: rules" entry is wrong, not absent: one error, not a second one about it.
    text = "rules:\n  - set_meta: {a/b: 1}\nmiddleware:\n  - use: rules\n    name: r\n"
    assert errors_of(text) == [
        'c.yaml:5: middleware[0].name: the built-in rules take no "name": configure them under '
        '"rules:" (valid keys here: use, fail_closed)'
    ]


def test_one_error_keeps_its_fields() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(THREE_MISTAKES, "c.yaml", {})
    err = info.value
    assert (err.file, err.line, err.path) == ("c.yaml", 5, "rules[1].mach")
    assert len(err.errors) == 3
    assert str(err) == "\n".join(err.messages())


# --- YAML syntax errors in plain words ----------------------------------------------------------

BLOCK = 'the keys of one mapping, and the "-" of one list, must start in the same column'
YAML_ERRORS = [
    ("tab", "rules:\n\t- name: a\n", "c.yaml:2: a tab character (column 1): YAML indents with "
     "spaces only; replace the tab with spaces"),
    ("indent-less", "agent:\n    stderr: log\n  grace_period: 3\n",
     "c.yaml:3: bad indentation (column 3): a key that does not line up with the mapping that "
     f"starts on line 1; {BLOCK}"),
    ("indent-list", "rules:\n  - name: a\n    set_meta: {a/b: 1}\n - name: b\n",
     "c.yaml:4: bad indentation (column 2): a list item that does not line up with the mapping "
     f"that starts on line 1; {BLOCK}"),
    ("unclosed-double-quote", 'rules:\n  - name: "a\n    set_meta: {a/b: 1}\n',
     'c.yaml:2: unclosed quote: the string that starts with " on line 2 never ends'),
    ("unclosed-single-quote", "rules:\n  - name: 'a\n",
     "c.yaml:2: unclosed quote: the string that starts with ' on line 2 never ends"),
    ("unclosed-bracket", "rules:\n  - remove_meta: [a/b\n",
     'c.yaml:2: unclosed "[": it has no matching "]"'),
    ("colon-in-value", "non_json: a: b\n",
     'c.yaml:1: unexpected ":" (column 12): quote a value that contains ": " ("a: b"), or '
     "check the indentation of this line"),
    ("no-colon", "agent:\n  stderr: log\n  grace_period\n  env: {}\n",
     'c.yaml:3: a line without ":" inside a mapping: write KEY: VALUE (or "- " before a list '
     "item)"),
    ("reserved-character", "non_json: @log\n",
     'c.yaml:1: a value cannot start with "@" (column 11): quote the value ("@...")'),
    ("undefined-alias", "v1: *x\n", "c.yaml:1: alias *x has no anchor: mark an earlier value "
     "with &x"),
    ("duplicate-anchor", "a: &x 1\nb: &x 2\n",
     "c.yaml:2: anchor &x is defined twice (first on line 1): rename one"),
    ("bad-escape", 'non_json: "\\q"\n', "c.yaml:1: unknown escape \\q (column 13) in a "
     "double-quoted string: write \\\\ for a backslash, or use single quotes"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"), [(t, e) for _, t, e in YAML_ERRORS], ids=[i for i, _, _ in YAML_ERRORS]
)
def test_yaml_errors_in_plain_words(text: str, expected: str) -> None:
    assert errors_of(text) == [expected]


def test_other_yaml_errors_keep_pyyaml_words() -> None:
    assert errors_of("rules: [\n- a\n") == [
        "c.yaml:2: invalid YAML at column 1: expected the node content, but found '-' "
        "(while parsing a flow node)"
    ]


def test_no_pyyaml_jargon_in_the_common_mistakes() -> None:
    for _, text, _ in YAML_ERRORS:
        (message,) = errors_of(text)
        assert "<block" not in message and "while parsing" not in message


# --- check-config refuses what the run refuses --------------------------------------------------

LONG_PATH = "/tmp/" + "x" * 120 + ".sock"
RUN_REFUSES = [
    (
        "non-loopback-listen",
        "listen: tcp://0.0.0.0:0\n",
        "1: listen: 0.0.0.0 is not a loopback address (anyone who can reach it could drive the "
        "agent); the proxy refuses to listen there unless allow_remote: true (or --allow-remote)",
    ),
    (
        "relative-unix-path",
        "max_connections: 2\nlisten: unix://relative.sock\n",
        "2: listen: 'unix://relative.sock': a Unix socket path must be absolute (three slashes: "
        "unix:///run/acp.sock)",
    ),
    (
        "unbracketed-ipv6-connect",
        "connect: tcp://::1:7777\n",
        "1: connect: 'tcp://::1:7777': put an IPv6 address in brackets: tcp://[::1]:PORT",
    ),
    (
        "unix-path-too-long",
        f"listen: unix://{LONG_PATH}\n",
        "1: listen: the socket path is 130 bytes; Unix socket paths are limited to 107",
    ),
]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux socket path limit")
@pytest.mark.parametrize(
    ("text", "message"), [(t, m) for _, t, m in RUN_REFUSES], ids=[i for i, _, _ in RUN_REFUSES]
)
def test_check_config_refuses_what_the_run_refuses(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    agent = [] if "connect:" in text else ["--", sys.executable, "-c", "pass"]
    run = proxy("--config", str(path), *agent)
    assert run.returncode != 0  # the run refuses it (2, or 1 for the path the kernel refuses)
    check = proxy("check-config", str(path))
    assert (check.returncode, check.stdout, check.stderr.decode()) == (
        2,
        b"",
        f"acp-proxy: {path}:{message}\n",
    )


def test_check_config_accepts_a_remote_listen_with_allow_remote(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("listen: tcp://0.0.0.0:0\nallow_remote: true\n")
    ran = proxy("check-config", str(path))
    assert (ran.returncode, ran.stderr) == (0, b"")


# --- CLI niceties -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "meant"),
    [("check-conifg", "check-config"), ("chek-config", "check-config"), ("shcema", "schema")],
)
def test_a_mistyped_subcommand_is_refused(word: str, meant: str) -> None:
    ran = proxy(word, "x.yaml")
    assert ran.returncode == 2
    assert ran.stderr.decode().endswith(
        f'acp-proxy: error: unknown command "{word}"; did you mean {meant}? (to run an agent '
        f"named {word}, put -- before it)\n"
    )


def test_after_double_dash_it_is_the_agent_command() -> None:
    ran = proxy("--log-level", "error", "--", "check-conifg", "x.yaml")
    assert ran.returncode == 127  # the agent command was run (and not found)
    assert "did you mean" not in ran.stderr.decode()


def test_a_subcommand_after_options_is_refused() -> None:
    ran = proxy("--log-level", "error", "check-config", "x.yaml")
    assert ran.returncode == 2
    assert ran.stderr.decode().endswith(
        'acp-proxy: error: "check-config" must come first (acp-proxy check-config ...); to run '
        "an agent named check-config, put -- before it\n"
    )


def test_a_word_far_from_any_subcommand_is_an_agent() -> None:
    ran = proxy("--log-level", "error", "no-such-agent-xyz")
    assert ran.returncode == 127


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flags(flag: str) -> None:
    ran = proxy(flag)
    assert (ran.returncode, ran.stdout) == (
        0,
        f"acp-proxy {__version__}\nscanner: {SCANNER}\n".encode(),
    )


@pytest.mark.parametrize("level", ["DEBUG", "Info", "WARNING", "error"])
def test_log_levels_in_any_case(level: str) -> None:
    args = cli.build_parser().parse_args(["--log-level", level])
    assert args.log_level == level.lower()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", 1024),
        ("64mb", 64_000_000),
        ("64MiB", 64 * 1024**2),
        ("64 MB", 64_000_000),
        ("64k", 64 * 1024),
        ("1G", 1024**3),
    ],
)
def test_max_frame_bytes_takes_sizes(text: str, expected: int) -> None:
    assert cli.build_parser().parse_args(["--max-frame-bytes", text]).max_frame_bytes == expected


def test_a_bad_size_on_the_command_line() -> None:
    ran = proxy("--max-frame-bytes", "64 furlongs", "--", "agent")
    assert ran.returncode == 2
    assert ran.stderr.decode().endswith(
        "argument --max-frame-bytes: not a size: '64 furlongs' (a byte count, or a size such as "
        "64MiB, 64mb, 64 MB, 64k)\n"
    )


def test_an_uppercase_log_level_runs() -> None:
    ran = proxy("--log-level", "ERROR", "--max-frame-bytes", "1k", "--", sys.executable, "-c", "")
    assert (ran.returncode, ran.stderr) == (0, b"")


# --- the JSON schema and the README table, from SETTINGS ----------------------------------------


def test_schema_command_prints_the_committed_schema() -> None:
    ran = proxy("schema")
    assert ran.returncode == 0
    assert ran.stdout.decode() == SCHEMA_FILE.read_text(encoding="utf-8"), (
        "config/acp-proxy.schema.json is stale: run `acp-proxy schema > "
        "config/acp-proxy.schema.json`"
    )
    assert json.loads(ran.stdout) == json_schema()


def validator() -> Any:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_schema_accepts_the_example() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    assert text.startswith("# yaml-language-server: $schema=./acp-proxy.schema.json\n")
    validator().validate(yaml.safe_load(text))


GOOD = [
    "",
    "rules: []\nmiddleware: []\n",
    "max_frame_bytes: 64mb\ncoalesce: {max_queue_bytes: 1024, enabled: false}\n",
    "v1: {mode: '${V1_MODE:-safe}'}\n",
    "listen: unix:///run/acp.sock\nallow_remote: false\nconnect_timeout: 2.5\n",
    "agent: {env: {A: x, B: 2}, stderr: log, grace_period: 0}\n",
    "rules:\n  - remove_meta: [traceparent]\n    match: {update: upserts}\n",
    "middleware:\n  - use: rules\n    fail_closed: true\n"
    "  - use: acp_proxy.wire.chain:BaseMiddleware\n    with: {}\n",
]
BAD = [
    ("unknown-top-key", "rule: []\n"),
    ("unknown-rule-key", "rules:\n  - mach: {}\n    set_meta: {a/b: 1}\n"),
    ("bad-enum", "non_json: print\n"),
    ("bad-v1-mode", "v1: {mode: safer}\n"),
    ("bare-meta-key", "rules:\n  - set_meta: {route: edge}\n"),
    ("null-meta-value", "rules:\n  - set_meta: {a/b: null}\n"),
    ("rule-changes-nothing", "rules:\n  - name: x\n"),
    ("middleware-without-use", "middleware:\n  - with: {}\n"),
    ("bad-use", "middleware:\n  - use: pkg.Class\n"),
    ("bad-size", "max_frame_bytes: big\n"),
    ("zero-size", "max_frame_bytes: 0\n"),
    ("negative-seconds", "agent: {grace_period: -1}\n"),
    ("zero-timeout", "connect_timeout: 0\n"),
    ("bad-address", "listen: localhost:7777\n"),
    ("string-bool", "allow_remote: yes please\n"),
    # Checks across keys that the JSON Schema says too (from config.checks):
    (
        "update-with-a-method-that-carries-none",
        "rules:\n  - match: {method: fs/read_text_file, update: upserts}\n    set_meta: {a/b: 1}\n",
    ),
    (
        "builtin-rules-with-options",
        "rules:\n  - set_meta: {a/b: 1}\nmiddleware:\n  - use: rules\n    with: {x: 1}\n",
    ),
]


@pytest.mark.parametrize("text", GOOD)
def test_the_schema_accepts_valid_files(text: str) -> None:
    parse_config(text, "c.yaml", {"V1_MODE": "safe"}, instantiate=False)  # valid for the proxy
    validator().validate(yaml.safe_load(text))


@pytest.mark.parametrize(("text"), [t for _, t in BAD], ids=[i for i, _ in BAD])
def test_the_schema_rejects_broken_files(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_config(text, "c.yaml", {})  # the proxy refuses it too
    assert list(validator().iter_errors(yaml.safe_load(text)))


def test_docs_settings_table_is_generated() -> None:
    readme = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    start = readme.index("## Settings\n\n") + len("## Settings\n\n")
    end = readme.index("\n\n", start)
    assert readme[start:end] == settings_table()


def test_docs_list_the_checks_across_keys() -> None:
    """The checks across keys are declared once (config.checks): the docs' list is theirs."""
    doc = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    start = doc.index("\n\n", doc.index("**Checked across keys**")) + 2
    assert doc[start : doc.index("\n\n", start)] == checks_text()


def test_docs_rules_table_lists_the_rule_keys() -> None:
    readme = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    start = readme.index("| key | meaning |")
    table = readme[start : readme.index("\n\n", start)]
    keys = [row.split("`")[1] for row in table.splitlines()[2:]]
    assert sorted(keys) == sorted(
        [*(f"match.{k}" for k in MATCH_KEYS), *(k for k in RULE_KEYS if k != "match")]
    )


def _leaves() -> list[tuple[str, Any]]:
    out = []
    for setting in SETTINGS:
        if setting.kind is Kind.SECTION:
            out += [(f"{setting.key}.{c.key}", c) for c in setting.children]
        elif setting.kind not in (Kind.RULES, Kind.MIDDLEWARE):
            out.append((setting.key, setting))
    return out


def test_every_config_field_is_declared() -> None:
    """SETTINGS covers every dataclass field a file can set (nothing is parsed off the table)."""
    # Top-level settings and v1's fill Config's own fields; agent.* and coalesce.* their own.
    declared = {s.attr for k, s in _leaves() if "." not in k or k.startswith("v1.")}
    internal = {
        *("source", "middleware", "rule_names", "rules", "lines"),
        *("agent", "coalesce", "tracing", "record", "ui", "tls", "auth"),
    }
    assert declared == {f.name for f in dataclasses.fields(Config)} - internal
    for section, cls in (
        ("agent", AgentConfig),
        ("coalesce", CoalesceConfig),
        ("record", RecordConfig),
        ("tracing", TracingConfig),
        ("ui", UiConfig),
        ("tls", TlsConfig),
        ("auth", AuthConfig),
    ):
        attrs = {s.attr for k, s in _leaves() if k.startswith(section + ".")}
        assert attrs == {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize(("key", "setting"), _leaves(), ids=[k for k, _ in _leaves()])
def test_every_setting_is_validated_from_the_table(key: str, setting: Any) -> None:
    """A value of the wrong type is an error at the setting's own path, for every setting."""
    section, _, leaf = key.rpartition(".")
    lists = setting.kind in (Kind.STRINGS, Kind.REGEXES, Kind.DIRECTORIES)
    wrong = "7" if lists else "[1, 2]"  # a list is right for the list settings
    text = f"{section}:\n  {leaf}: {wrong}\n" if section else f"{leaf}: {wrong}\n"
    (message,) = errors_of(text)
    assert message.startswith(f"c.yaml:{2 if section else 1}: {key}: expected ")
    assert ("got an integer" in message) if lists else message.endswith("got a list")
