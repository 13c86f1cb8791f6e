"""The policy at run time: its link in every connection's chain, and the audit file it writes.

Contract: owns the audit file (opened once at start-up with the record file's safety rules,
``acp_proxy.shell.recordfile``: created ``0600``, never through a link, never someone else's
file or one others can read; its chain continued from the file's last line) and the writing of
one line per decision (the time read here, the summary redacted by the record redaction,
``acp_proxy.policy.audit`` builds the line); ``run_with_policy`` puts the policy link first in
the chain of every connection and closes the file at the end. ``acp-proxy audit verify FILE``
is ``verify_main``. A line that cannot be written is logged (once per error kind) and the
session goes on.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import functools
import os
import stat
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from acp_proxy.config import Config, MiddlewareSpec
from acp_proxy.policy.audit import audit_line, last_hash, line_hash, verify
from acp_proxy.policy.middleware import NAME, AuditEntry, PolicyMiddleware, audit_fields
from acp_proxy.policy.model import Policy
from acp_proxy.record.redact import Redactor
from acp_proxy.shell.logsetup import get_logger
from acp_proxy.shell.recordfile import RecordRefused, open_record_file

# How much of the file's end is read at a time to find its last line.
_TAIL_STEP = 64 * 1024


def _tail(path: str) -> bytes:
    """The end of ``path`` from the start of its last line (the whole file when short)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        start = size
        data = b""
        while start > 0:
            start = max(0, start - _TAIL_STEP)
            data = os.pread(fd, size - start, start)
            body = data[:-1] if data.endswith(b"\n") else data
            if b"\n" in body:
                return data[body.rfind(b"\n") + 1 :]
        return data
    finally:
        os.close(fd)


class AuditWriter:
    """The audit file: one hash-chained line per decision (``write``)."""

    def __init__(self, path: str, policy: Policy, redactor: Redactor) -> None:
        fd, fifo = open_record_file(path)
        if fifo or fd is None:
            if fd is not None:
                os.close(fd)
            raise RecordRefused(
                errno.EPERM, "an audit file must be a regular file (its chain is read)", path
            )
        try:
            prev = last_hash(_tail(path))
            if prev is None:
                raise RecordRefused(
                    errno.EINVAL, "it does not end with a whole line (not an audit file?)", path
                )
            # A regular file: writes block (no partial line), O_NONBLOCK is for FIFOs.
            flags = os.get_blocking(fd)
            if not flags:
                os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        self.path = path
        self._fd: int | None = fd
        self._prev = prev
        self._policy = policy.digest
        self._redactor = redactor
        self._failed: set[str] = set()
        self.lines = 0

    def write(self, entry: AuditEntry) -> None:
        fields = audit_fields(entry)
        summary, _ = self._redactor.frame(orjson.dumps(fields["summary"]))
        fields["summary"] = orjson.loads(summary)
        self.write_fields(fields)

    def write_fields(self, fields: dict[str, Any]) -> None:
        """One line of ``fields`` in the chain (the budgets' events share the file)."""
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
        line = audit_line(fields, time=now, policy=self._policy, prev=self._prev)
        if self._fd is None:
            return
        try:
            data = line + b"\n"
            while data:
                n = os.write(self._fd, data)
                data = data[n:]
        except OSError as exc:
            kind = type(exc).__name__
            if kind not in self._failed:
                self._failed.add(kind)
                get_logger().error("policy audit line not written", path=self.path, error=str(exc))
            return
        self._prev = line_hash(line)
        self.lines += 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# The audit files open now (the budgets write their lines into the policy's: one chain a file).
OPEN_WRITERS: list[AuditWriter] = []


def with_policy(config: Config, sink: Callable[[AuditEntry], None] | None) -> Config:
    """``config`` with the policy link first in its chain (it answers before any other link
    sees a request it decides); links resolve paths with ``os.path.realpath``."""
    policy = config.policy
    assert policy is not None
    factory = functools.partial(PolicyMiddleware, policy, sink, os.path.realpath)
    spec = MiddlewareSpec(NAME, factory, use=NAME)
    return dataclasses.replace(config, middleware=(spec, *config.middleware))


async def run_with_policy(main: Callable[..., Awaitable[int]], config: Config, *rest: Any) -> int:
    """Run ``main(config, *rest)`` with the policy in the chain and its audit file open; exit
    2 when the audit file cannot be opened (before any agent starts)."""
    policy = config.policy
    assert policy is not None
    writer: AuditWriter | None = None
    if policy.audit is not None:
        try:
            writer = AuditWriter(
                policy.audit,
                policy,
                Redactor.build(config.record.redact, config.record.redact_patterns),
            )
        except OSError as exc:
            print(
                f"acp-proxy: policy.audit {policy.audit}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 2
    get_logger().info(
        "policy",
        mode=policy.mode.value,
        rules=len(policy.rules),
        default=policy.default.value,
        audit=policy.audit,
        policy_hash=policy.digest,
    )
    if writer is not None:
        OPEN_WRITERS.append(writer)
    try:
        return await main(with_policy(config, writer.write if writer else None), *rest)
    finally:
        if writer is not None:
            OPEN_WRITERS.remove(writer)
            writer.close()


def verify_main(argv: Sequence[str]) -> int:
    """``acp-proxy audit verify FILE``: 0 for an intact chain, 1 naming the first line that
    breaks it, 2 for a usage error or a file that cannot be read."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="acp-proxy audit",
        description="Check a policy audit file's hash chain.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("verify", help="check that no line was changed, removed or inserted")
    check.add_argument("file")
    args = parser.parse_args(argv)
    try:
        fd = os.open(args.file, os.O_RDONLY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                print(f"acp-proxy audit: {args.file}: not a regular file", file=sys.stderr)
                return 2
            checked = verify(handle)
    except OSError as exc:
        print(f"acp-proxy audit: {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if checked.broken is not None:
        print(f"{args.file}:{checked.broken}: chain broken: {checked.reason}")
        return 1
    print(f"{args.file}: intact, {checked.lines} lines, last line's SHA-256 {checked.last}")
    return 0
