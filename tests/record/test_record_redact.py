"""Redaction coverage and cost: every secret shape, the schema's shape kept, linear patterns,
catastrophic user patterns refused when the config is read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from acp_schema import validate_v2
from proxy_harness import REPO, TIMEOUT, proxy_env

from acp_proxy.record.format import DEFAULT_REDACT_PATTERNS, Redactor
from acp_proxy.record.patterns import backtracking_risk

R = Redactor.build()
SECRET = "s3cr3t-" + "Q" * 12
TOKEN = "ghp_" + "A" * 36


def new_session(servers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "session/new",
        "params": {"cwd": "/home/u", "mcpServers": servers},
    }


STDIO = {
    "type": "stdio",
    "name": "gh",
    "command": "/usr/bin/gh-mcp",
    "args": ["--api-key", SECRET, f"--token={SECRET}", "--verbose", f"GITHUB_TOKEN={SECRET}"],
    "env": [{"name": "GITHUB_TOKEN", "value": SECRET}, {"name": "HOME", "value": SECRET}],
}
HTTP = {
    "type": "http",
    "name": "api",
    "url": "https://mcp.example/",
    "headers": [
        {"name": "Authorization", "value": f"Basic {SECRET}"},
        {"name": "X-Custom", "value": SECRET},
    ],
}


def redacted(frame: bytes) -> bytes:
    out, changed = R.frame(frame)
    assert changed
    return out


def test_mcp_servers_env_headers_and_args_keep_their_schema_shape() -> None:
    message = new_session([STDIO, HTTP])
    validate_v2("NewSessionRequest", message["params"])
    out = redacted(json.dumps(message).encode())
    assert SECRET.encode() not in out
    got = json.loads(out)
    validate_v2("NewSessionRequest", got["params"])  # still what the schema wants
    stdio, http = got["params"]["mcpServers"]
    assert stdio["env"] == [
        {"name": "GITHUB_TOKEN", "value": "[REDACTED]"},
        {"name": "HOME", "value": "[REDACTED]"},
    ]
    assert stdio["args"] == [
        "--api-key",
        "[REDACTED]",
        "--token=[REDACTED]",
        "--verbose",
        "GITHUB_TOKEN=[REDACTED]",
    ]
    assert http["headers"] == [
        {"name": "Authorization", "value": "[REDACTED]"},
        {"name": "X-Custom", "value": "[REDACTED]"},
    ]


@pytest.mark.parametrize(
    "frame",
    [
        # {name, value} pairs naming a secret, outside any known key
        b'{"params":{"vars":[{"name":"API_KEY","value":"%s"}]}}',
        # a secret behind a duplicate key: the last one is null, the first holds it
        b'{"params":{"password":"%s","password":null}}',
        b'{"a":{"token":"%s"},"a":1}',
        # a frame that is not UTF-8 elsewhere
        b'{"note":"\xff\xfe","apiKey":"%s"}',
        # a frame that starts with a byte order mark
        b'\xef\xbb\xbf{"apiKey":"%s"}',
        # secret-looking flags in any list of arguments
        b'{"params":{"command":"run","args":["--password","%s"]}}',
        # a secret inside nested env values of another shape
        b'{"env":{"GITHUB_TOKEN":{"value":"%s"}}}',
    ],
)
def test_every_secret_shape_is_redacted(frame: bytes) -> None:
    raw = frame.replace(b"%s", SECRET.encode())
    out = redacted(raw)
    assert SECRET.encode() not in out
    assert b"[REDACTED]" in out
    if raw.startswith(b"\xef\xbb\xbf"):
        assert out.startswith(b"\xef\xbb\xbf")  # the BOM stays, the rest is still JSON
        json.loads(out[3:])
    if b"\xff\xfe" in raw:
        assert b"\xff\xfe" in out  # the other bytes are kept as they were
    if b'"password"' in raw:
        assert out.count(b'"password"') == 2  # duplicates kept, each redacted


def test_patterns_in_frames_that_are_not_json_or_not_utf8() -> None:
    assert redacted(b"\xff log " + TOKEN.encode() + b" end") == b"\xff log [REDACTED] end"
    assert redacted(b"\xef\xbb\xbfkey " + TOKEN.encode()) == b"\xef\xbb\xbfkey [REDACTED]"


ADVERSARIAL = [
    "eyJ" * 80_000,  # the JWT prefix, repeated: 240,000 characters
    "eyJ" + "a" * 240_000 + "." + "b" * 20,
    "sk-" * 80_000 + "!",
    "ghp_" * 60_000,
    "github_pat_" * 20_000 + "!",
    "xoxb-" * 50_000 + "!",
    "Bearer " * 40_000,
    "Bearer" + " " * 240_000 + "!",
    "AKIA" * 60_000,
    "AIza" * 60_000,
    "a" * 240_000,
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=lambda t: repr(t[:12]))
def test_the_built_in_patterns_are_linear(text: str) -> None:
    frame = json.dumps({"jsonrpc": "2.0", "method": "x", "params": {"t": text}}).encode()
    started = time.process_time()
    R.frame(frame)
    spent = time.process_time() - started
    assert spent < 1.0, spent  # quadratic: tens of seconds (20.9 s for the first before)


def test_the_built_in_patterns_still_find_their_tokens() -> None:
    tokens = [
        "sk-" + "a1B2" * 6,
        TOKEN,
        "github_pat_" + "x" * 40,
        "xoxb-" + "1234567890abc",
        "AKIA" + "ABCDEFGHIJKLMNOP",
        "AIza" + "x" * 35,
        "Bearer " + "abcdefghijklmnopqrstu",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV",
    ]
    for token in tokens:
        assert R.text(f"x {token} y") == "x [REDACTED] y", token
        assert R.text(f"key={token}") == "key=[REDACTED]", token
    assert len(tokens) == len(DEFAULT_REDACT_PATTERNS)
    assert R.text("mask-" + "a" * 30) == "mask-" + "a" * 30  # not a key: a word that ends in sk


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(a+)+$", "a quantifier inside a quantifier"),
        ("(a*)*b", "a quantifier inside a quantifier"),
        (r"(?:\w+\s?)+$", "a quantifier inside a quantifier"),
        ("(a|a)*$", "alternatives that can match the same text, under a quantifier"),
        ("(a|aa)+$", "a quantifier inside a quantifier"),
        (r"\d+\d+x", "two unbounded quantifiers in a row over the same characters"),
        (r".*.*=", "two unbounded quantifiers in a row over the same characters"),
    ],
)
def test_catastrophic_user_patterns_are_recognised(pattern: str, why: str) -> None:
    risk = backtracking_risk(pattern)
    assert risk is not None and risk.startswith(why), risk


@pytest.mark.parametrize(
    "pattern",
    [
        r"zz-[0-9]{6}",
        r"secret-[A-Za-z0-9]{8,}",
        r"(?:foo|bar)-\d+",
        r"(a|ab)+c",
        r"(\.[a-z]+)+",
        r"(?:[a-z0-9]+-)*[a-z0-9]+",
        r"(ab|cd)+",
        r"[a-z]+@[a-z]+\.com",
        r"token: \S+",
        r"(?<![A-Za-z0-9])tok_[A-Za-z0-9]{20,}+",
        *DEFAULT_REDACT_PATTERNS,
    ],
)
def test_ordinary_patterns_are_accepted(pattern: str) -> None:
    assert backtracking_risk(pattern) is None


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", "check-config", str(path)],
        capture_output=True,
        text=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )


def test_check_config_refuses_a_catastrophic_pattern_with_file_and_line(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("record:\n  redact_patterns:\n    - 'zz-[0-9]{6}'\n    - '(a+)+$'\n")
    done = check_config(config)
    assert done.returncode == 2
    assert done.stderr == (
        f"acp-proxy: {config}:4: record.redact_patterns[1]: a pattern whose matching time can "
        "explode on some text: a quantifier inside a quantifier (as in (a+)+); rewrite it (a "
        "literal prefix, then one character class, as the defaults do)\n"
    )
