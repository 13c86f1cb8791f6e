"""The policy audit file: the hash chain, its check, the writer's file rules, the command."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from proxy_harness import REPO, proxy_env

from acp_proxy.policy.audit import GENESIS, audit_line, last_hash, line_hash, verify
from acp_proxy.policy.policy_link import AuditEntry
from acp_proxy.policy.policy_model import Policy
from acp_proxy.record.redact import Redactor
from acp_proxy.shell.control.policy_runtime import AuditWriter
from acp_proxy.shell.record.recordfile import RecordRefused


def entry(n: int, argv: list[str] | None = None) -> AuditEntry:
    summary: dict[str, object] = {"kind": "execute", "argv": argv or ["rm", "-rf", str(n)]}
    return AuditEntry(
        "sess_1",
        "claude-code",
        "session/request_permission",
        summary,  # type: ignore[arg-type]
        "no-recursive-delete",
        "deny",
        "reject",
        "enforce",
        False,
    )


def chain(n: int) -> list[bytes]:
    lines, prev = [], GENESIS
    for i in range(n):
        line = audit_line({"n": i}, time=f"t{i}", policy="p", prev=prev)
        lines.append(line + b"\n")
        prev = line_hash(line)
    return lines


def test_an_intact_chain_and_its_last_hash() -> None:
    lines = chain(3)
    checked = verify(lines)
    assert (checked.broken, checked.lines) == (None, 3)
    assert checked.last == line_hash(lines[-1][:-1]) == last_hash(b"".join(lines))
    assert verify([]).last == GENESIS == last_hash(b"")
    assert last_hash(b'{"a":1}') is None  # no whole last line
    assert orjson.loads(lines[0])["prev"] == GENESIS
    assert list(orjson.loads(lines[1])) == ["time", "n", "policy", "prev"]


@pytest.mark.parametrize(
    ("tamper", "broken", "reason"),
    [
        (
            lambda ls: [ls[0], ls[1].replace(b'"n":1', b'"n":7'), *ls[2:]],
            3,
            '"prev" is not the SHA-256 of line 2',
        ),
        (lambda ls: [ls[0], *ls[2:]], 2, '"prev" is not the SHA-256 of line 1'),
        (lambda ls: ls[1:], 1, '"prev" is not the SHA-256 of the start of the chain'),
        (lambda ls: [ls[0], b"garbage\n", *ls[1:]], 2, "not a JSON line"),
        (lambda ls: [ls[0], b"[1]\n", *ls[1:]], 2, 'not an audit line (no "prev")'),
    ],
)
def test_a_changed_removed_or_inserted_line_breaks_the_chain(
    tamper: object, broken: int, reason: str
) -> None:
    checked = verify(tamper(chain(4)))  # type: ignore[operator]
    assert (checked.broken, checked.reason) == (broken, reason)


def writer(path: Path) -> AuditWriter:
    return AuditWriter(str(path), Policy(digest="d" * 64), Redactor.build())


def test_the_writer_creates_0600_continues_the_chain_and_redacts(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    first = writer(path)
    first.write(entry(1))
    first.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = writer(path)  # a restart: the chain goes on from the last line
    second.write(entry(2, ["deploy", "--token=s3cr3t-value"]))
    second.close()
    lines = path.read_bytes().splitlines(keepends=True)
    assert verify(lines).broken is None and len(lines) == 2
    last = orjson.loads(lines[1])
    assert last["summary"]["argv"] == ["deploy", "--token=[REDACTED]"]
    assert (last["policy"], last["rule"], last["option"]) == (
        "d" * 64,
        "no-recursive-delete",
        "reject",
    )


def test_the_writer_follows_the_record_file_rules(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    target.chmod(0o600)
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    with pytest.raises(RecordRefused, match="symbolic link"):
        writer(link)
    shared = tmp_path / "shared.jsonl"
    shared.write_bytes(b"")
    shared.chmod(0o644)
    with pytest.raises(RecordRefused):
        writer(shared)
    torn = tmp_path / "torn.jsonl"
    fd = os.open(torn, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b'{"prev":"x"')
    os.close(fd)
    with pytest.raises(RecordRefused, match="does not end with a whole line"):
        writer(torn)


def verify_cmd(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "acp_proxy", "audit", "verify", str(path)],
        capture_output=True,
        text=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=30,
        check=False,
    )


def test_audit_verify_command(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    w = writer(path)
    for n in range(3):
        w.write(entry(n))
    w.close()
    lines = path.read_bytes().splitlines(keepends=True)
    ok = verify_cmd(path)
    assert (ok.returncode, ok.stdout) == (
        0,
        f"{path}: intact, 3 lines, last line's SHA-256 {line_hash(lines[2][:-1])}\n",
    )
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_bytes(lines[0] + lines[1].replace(b'"deny"', b'"allow"') + lines[2])
    bad = verify_cmd(tampered)
    assert (bad.returncode, bad.stdout) == (
        1,
        f'{tampered}:3: chain broken: "prev" is not the SHA-256 of line 2\n',
    )
    missing = verify_cmd(tmp_path / "nope.jsonl")
    assert (missing.returncode, missing.stderr) == (
        2,
        f"acp-proxy audit: {tmp_path / 'nope.jsonl'}: No such file or directory\n",
    )


def test_check_config_refuses_an_audit_file_the_run_cannot_open(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    config = tmp_path / "c.yaml"
    config.write_text(f"policy:\n  audit: {missing}/audit.jsonl\n", encoding="utf-8")
    checked = subprocess.run(
        [sys.executable, "-m", "acp_proxy", "check-config", str(config)],
        capture_output=True, text=True, env=proxy_env(), cwd=str(tmp_path), timeout=30,
        check=False,
    )  # fmt: skip
    assert (checked.returncode, checked.stdout) == (2, "")
    assert checked.stderr == (
        f"acp-proxy: {config}:1: policy: policy.audit {missing}/audit.jsonl: the directory "
        f"{missing} does not exist\n"
    )
