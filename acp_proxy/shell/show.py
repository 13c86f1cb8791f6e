"""``acp-proxy show FILE``: print a session record as a transcript (issue 11).

Contract: owns reading a record file (and, with ``--follow``, waiting for it to grow) and writing
the transcript to stdout; what each line says is ``acp_proxy.record.transcript``'s job. A torn
last line (a record of a killed proxy) is skipped, or waited for with ``--follow``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO

from acp_proxy.record.format import (
    AGENT_TO_CLIENT,
    CLIENT_TO_AGENT,
    RecordError,
    parse_header,
    parse_line,
)
from acp_proxy.record.transcript import Filters, Transcript, render

FOLLOW_POLL_S = 0.2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acp-proxy show",
        description="Print a session record (--record) as a transcript: time, direction, "
        "method, id, update kind and entity; responses with their request's method and "
        "latency; what the proxy changed (_meta diff: + added, ~ changed, - removed), "
        "inserted, dropped or generated.",
    )
    parser.add_argument("file", metavar="FILE", help="a record written by --record")
    parser.add_argument(
        "-f", "--follow", action="store_true", help="keep reading as the record grows"
    )
    parser.add_argument("--method", metavar="GLOB", help="only these methods (session/*)")
    parser.add_argument("--session", metavar="ID", help="only this sessionId")
    parser.add_argument("--dir", choices=(CLIENT_TO_AGENT, AGENT_TO_CLIENT), help="one direction")
    parser.add_argument("--entity", metavar="GLOB", help="only this entity (tool_call:t1, plan:*)")
    parser.add_argument(
        "--state",
        action="store_true",
        help="print what a client stores at the end (per entity), as JSON, instead",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colours (default: only on a terminal)",
    )
    return parser


def _lines(stream: IO[bytes], follow: bool) -> Iterator[bytes]:
    pending = b""
    while True:
        chunk = stream.readline()
        if chunk.endswith(b"\n"):
            yield pending + chunk[:-1]
            pending = b""
            continue
        pending += chunk
        if not follow:
            if pending.strip():
                yield pending  # a torn last line: parse_line decides
            return
        time.sleep(FOLLOW_POLL_S)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    out = sys.stdout
    colour = args.color == "always" or (
        args.color == "auto" and out.isatty() and not os.environ.get("NO_COLOR")
    )
    filters = Filters(args.method, args.session, args.dir, args.entity)
    try:
        stream = open(args.file, "rb")  # noqa: SIM115 (closed below; read lazily)
    except OSError as exc:
        print(f"acp-proxy show: {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    with stream:
        lines = _lines(stream, args.follow)
        first = next(lines, None)
        if first is None:
            print(f"acp-proxy show: {args.file}: empty file", file=sys.stderr)
            return 2
        try:
            header = parse_header(first)
        except RecordError as exc:
            print(f"acp-proxy show: {args.file}: {exc}", file=sys.stderr)
            return 2
        transcript = Transcript(keep_state=args.state)
        transcript.feed(header)
        if not args.state and not args.json:
            agent = header.get("agent") or header.get("connect")
            out.write(
                f"record of {header.get('started')} by acp-proxy {header.get('version')}: "
                f"agent {agent}, config {header.get('config')}, "
                f"rules {header.get('rules')}\n"
            )
        torn = 0
        for line in lines:
            entry = parse_line(line)
            if entry is None:
                torn += 1
                continue
            row = transcript.feed(entry)
            if row is None or args.state or not filters.passes(row):
                continue
            if args.json:
                out.write(json.dumps(row.as_json(), ensure_ascii=False) + "\n")
            else:
                out.write("\n".join(render(row, colour=colour)) + "\n")
            if args.follow:
                out.flush()
            if args.follow and row.event == "end":
                break
        if args.state:
            state = transcript.final_state()
            printable = {
                "protocolVersion": transcript.version,
                "entities": [
                    {"entity": list(key), **value} for key, value in state["entities"].items()
                ],
                "snapshots": [
                    {"entity": list(key), "value": value}
                    for key, value in state["snapshots"].items()
                ],
                "events": state["events"],
            }
            out.write(json.dumps(printable, indent=2, ensure_ascii=False) + "\n")
        if torn:
            print(f"acp-proxy show: {torn} incomplete line(s) skipped", file=sys.stderr)
    return 0
