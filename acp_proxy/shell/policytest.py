"""``acp-proxy policy test --config FILE RECORD...``: recorded sessions replayed through a policy.

Contract: owns the dry run. Each session of each record (``--record`` files) is fed, frame by
frame as it was recorded (the frames the peers sent; the proxy's own generated frames are
skipped), through a fresh connection whose chain is the policy link alone, in ``enforce``
mode, and every decision it makes is printed: where (record, session, the frame's time), the
method, the summary, the decision, the rule that decided and the option it would answer with
(``--json``: one JSON object per line, for tools). Paths are normalised, not resolved: the
files a record names may not exist here. Exit 0 when every record was read; 2 for a config
without a ``policy:`` section or a record that cannot be read.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from collections.abc import Sequence

import orjson

from acp_proxy.cli import flags
from acp_proxy.cli.options import load_or_report
from acp_proxy.config import MiddlewareSpec
from acp_proxy.policy.middleware import NAME, AuditEntry, PolicyMiddleware, audit_fields
from acp_proxy.policy.model import PolicyMode
from acp_proxy.record.escape import visible
from acp_proxy.record.format import AGENT_TO_CLIENT, frame_bytes, is_header
from acp_proxy.shell.recordread import Problems, open_record, read_record
from acp_proxy.wire.chain import Direction
from acp_proxy.wire.framing import Line
from acp_proxy.wire.pipeline import Connection

PROG = "acp-proxy policy test"


def _text(where: str, entry: AuditEntry) -> str:
    summary = entry.summary
    parts = []
    if "kind" in summary:
        parts.append(f"kind {summary['kind']}")
    if "argv" in summary and isinstance(summary["argv"], list):
        parts.append("argv " + " ".join(str(a) for a in summary["argv"]))
    if "paths" in summary and isinstance(summary["paths"], list):
        parts.append("paths " + ", ".join(str(p) for p in summary["paths"]))
    if "mode" in summary:
        parts.append(f"mode {summary['mode']}")
    rule = entry.rule if entry.rule is not None else "(default)"
    option = f", option {entry.option}" if entry.option is not None else ""
    if entry.decision == "deny" and entry.option is None and entry.method.endswith("permission"):
        option = ", outcome cancelled"
    return f"{where} {entry.method} [{'; '.join(parts)}]: {entry.decision} by {rule}{option}"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Replay recorded sessions (--record files) through a config's policy and "
        "print what each request would have got, and which rule decided.",
    )
    flags.add(parser, "--config", "the config file with the policy", required=True)
    parser.add_argument("records", nargs="+", metavar="RECORD")
    parser.add_argument("--json", action="store_true", help="one JSON object per decision")
    args = parser.parse_args(argv)
    config = load_or_report(args.config, instantiate=False)
    if config is None:
        return 2
    if config.policy is None:
        print(f"{PROG}: {visible(args.config)} has no policy: section", file=sys.stderr)
        return 2
    policy = dataclasses.replace(config.policy, mode=PolicyMode.ENFORCE)
    decisions: list[AuditEntry] = []
    factory = functools.partial(PolicyMiddleware, policy, decisions.append, os.path.normpath)
    chain_config = dataclasses.replace(config, middleware=(MiddlewareSpec(NAME, factory),))
    out = sys.stdout
    for path in args.records:
        stream = open_record(path, follow=False, prog=PROG)
        if isinstance(stream, str):
            print(f"{PROG}: {visible(path)}: {stream}", file=sys.stderr)
            return 2
        problems = Problems(path, PROG)
        with stream:
            record = read_record(stream, follow=False, problems=problems)
            if isinstance(record, str):
                print(f"{PROG}: {visible(path)}: {record}", file=sys.stderr)
                return 2
            conn: Connection | None = None
            for info, entry in record:
                if is_header(entry):
                    conn = Connection(chain_config.build_chain())
                    continue
                if conn is None or "dir" not in entry or entry.get("generated") is True:
                    continue
                direction = (
                    Direction.AGENT_TO_CLIENT
                    if entry["dir"] == AGENT_TO_CLIENT
                    else Direction.CLIENT_TO_AGENT
                )
                raw = frame_bytes(entry)
                if not raw:
                    continue
                conn.handle(direction, Line(raw))
                for decided in decisions:
                    t = entry.get("t")
                    if args.json:
                        fields = {
                            "record": path,
                            "record_session": info.number,
                            "t": t,
                            **audit_fields(decided),
                        }
                        del fields["mode"], fields["forwarded"]
                        out.write(orjson.dumps(fields).decode() + "\n")
                    else:
                        where = f"{visible(path)}:session {info.number}:t={t}:"
                        out.write(_text(where, decided) + "\n")
                decisions.clear()
        problems.close()
    return 0
