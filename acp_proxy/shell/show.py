"""``acp-proxy show FILE``: print a session record as a transcript.

Contract: owns the ``show`` command line and writing the transcript to stdout; reading the file
(sessions, unusable lines reported and skipped, ``--follow``) is ``acp_proxy.shell.recordread``'s
job, what each line says ``acp_proxy.record.transcript``'s. Every string taken from the record
is printed visible (control characters escaped), in every output mode. Memory holds one line and
the state being built, never the record; with ``--state`` the value of each chunk (a long message
is many of them) and each event stays in the file (8 bytes of memory each), read back as the
state is printed.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
from collections.abc import Sequence
from typing import IO, Any

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.cli import flags
from acp_proxy.record.chunkrefs import ChunkRef, EventRef, chunk_value, event_value
from acp_proxy.record.escape import safe_json, safe_json_chunks, visible
from acp_proxy.record.format import AGENT_TO_CLIENT, CLIENT_TO_AGENT
from acp_proxy.record.transcript import Filters, Row, Transcript, render
from acp_proxy.shell.recordread import (
    Problems,
    SessionInfo,
    line_at,
    open_record,
    read_placed_record,
)

PROG = "acp-proxy show"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Print a session record (--record) as a transcript: time, direction, "
        "method, id, update kind and entity; responses with their request's method and "
        "latency; what the proxy changed (_meta diff: + added, ~ changed, - removed), "
        "inserted, dropped or generated. A file written by several sessions (--record to "
        "the same file again) holds one session per header: all are shown, each introduced "
        "by its number; --session N shows one. Lines that cannot be read are reported on "
        "stderr (FILE:LINE: why) and skipped.",
    )
    parser.add_argument("file", metavar="FILE", help="a record written by --record")
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep reading as the record grows (waits for the file to exist)",
    )
    parser.add_argument(
        "--list", action="store_true", help="list the sessions of the file, one per line"
    )
    flags.add(parser, "--session", "only the Nth session of the file (from 1; see --list)")
    parser.add_argument("--method", metavar="GLOB", help="only these methods (session/*)")
    parser.add_argument("--session-id", metavar="ID", help="only this ACP sessionId")
    parser.add_argument("--dir", choices=(CLIENT_TO_AGENT, AGENT_TO_CLIENT), help="one direction")
    parser.add_argument("--entity", metavar="GLOB", help="only this entity (tool_call:t1, plan:*)")
    parser.add_argument(
        "--state",
        action="store_true",
        help="print what a client stores at the end (per entity, --entity applies), as JSON, "
        "instead; a file of several sessions needs --session",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--web",
        action="store_true",
        help="serve the live view's page over the record instead, like acp-proxy ui FILE "
        "(prints its URL with an access token to stderr; Ctrl-C stops)",
    )
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colours (default: only on a terminal)",
    )
    return parser


def _describe(header: JsonObject) -> str:
    agent = header.get("agent") or header.get("connect")
    return visible(
        f"record of {header.get('started')} by acp-proxy {header.get('version')}: "
        f"agent {agent}, config {header.get('config')}, rules {header.get('rules')}"
    )


def _state(transcript: Transcript, entity: str | None) -> dict[str, Any]:
    state = transcript.final_state()

    def wanted(key: tuple[Any, ...]) -> bool:
        return entity is None or fnmatch.fnmatchcase(f"{key[0]}:{key[-1]}", entity)

    return {
        "protocolVersion": transcript.version,
        "entities": [
            {"entity": list(key), **value}
            for key, value in state["entities"].items()
            if wanted(key)
        ],
        "snapshots": [
            {"entity": list(key), "value": value}
            for key, value in state["snapshots"].items()
            if wanted(key)
        ],
        "events": state["events"] if entity is None else [],
    }


def _list(sessions: list[tuple[SessionInfo, int, str]], out: IO[str]) -> None:
    for info, frames, end in sessions:
        out.write(
            f"session {info.number} (line {info.line}): {_describe(info.header)}; "
            f"{frames} frames; {visible(end)}\n"
        )


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _show(args)
    except MemoryError:
        pass  # out of the handler first: its traceback holds what filled the memory
    sys.stdout.flush()
    print(
        f"{PROG}: {visible(args.file)}: out of memory; stopped (--state holds 8 bytes per "
        "chunk and per event, the latest fields of each entity, and one line of the record "
        "at a time)",
        file=sys.stderr,
    )
    return 1


def _show(args: argparse.Namespace) -> int:
    out = sys.stdout
    colour = args.color == "always" or (
        args.color == "auto" and out.isatty() and not os.environ.get("NO_COLOR")
    )
    if args.session is not None and args.session < 1:
        print(f"{PROG}: --session counts from 1", file=sys.stderr)
        return 2
    filters = Filters(args.method, args.session_id, args.dir, args.entity)
    stream = open_record(args.file, follow=args.follow, prog=PROG)
    if isinstance(stream, str):
        print(f"{PROG}: {visible(args.file)}: {stream}", file=sys.stderr)
        return 2
    problems = Problems(args.file, PROG)
    with stream:
        record = read_placed_record(stream, follow=args.follow and not args.list, problems=problems)
        if isinstance(record, str):
            print(f"{PROG}: {visible(args.file)}: {record}", file=sys.stderr)
            return 2
        listed: list[tuple[SessionInfo, int, str]] = []
        transcript = Transcript(keep_state=False)
        current: SessionInfo | None = None
        selected = False
        sessions = 0
        for info, entry, offset in record:
            if current is None or info.number != current.number:
                current = info
                sessions = info.number
                if args.list:
                    listed.append((info, 0, "no end line"))
                    continue
                if args.state and args.session is None and info.number > 1:
                    print(
                        f"{PROG}: {visible(args.file)} holds more than one session (a record "
                        "file written again): choose one with --session N (--list lists them)",
                        file=sys.stderr,
                    )
                    return 2
                if selected and args.follow:
                    break  # the followed session ended without a trailer
                selected = args.session is None or info.number == args.session
                if not selected:
                    continue
                transcript = Transcript(keep_state=args.state)
                transcript.feed(info.header)
                if args.json and not args.state:
                    head = Row(0.0, None, event="session", detail=_describe(info.header))
                    if filters.passes(head):
                        out.write(safe_json({"session": info.number, **head.as_json()}) + "\n")
                elif not args.state:
                    out.write(f"session {info.number}: {_describe(info.header)}\n")
                continue
            if args.list:
                seen, frames, end = listed[-1]
                if "dir" in entry:
                    frames += 1
                elif entry.get("event") == "end":
                    row = Transcript(keep_state=False).feed(entry)
                    end = (row.detail or "ended") if row is not None else end
                listed[-1] = (seen, frames, end)
                continue
            if not selected:
                continue
            # --state: each chunk's value stays in the file (read back for the output), so
            # memory holds the state's shape, not a long message's text.
            row = transcript.feed(entry, offset if args.state else -1)
            if row is None or args.state or not filters.passes(row):
                continue
            if args.json:
                out.write(safe_json({"session": info.number, **row.as_json()}) + "\n")
            else:
                out.write("\n".join(render(row, colour=colour)) + "\n")
            if args.follow:
                out.flush()
                if row.event == "end" and (args.session is None or args.session == info.number):
                    break
        problems.close()
        if args.list:
            _list(listed, out)
            return 0
        if args.session is not None and args.session > sessions:
            print(
                f"{PROG}: {visible(args.file)} holds {sessions} session(s); no session "
                f"{args.session}",
                file=sys.stderr,
            )
            return 2
        if args.state:

            def read_back(value: object) -> object:
                if isinstance(value, EventRef):
                    return event_value(line_at(stream, value.where[0]), value)
                if isinstance(value, ChunkRef):
                    line = line_at(stream, value.where[0])
                    return chunk_value(line, value, transcript.state_version())
                raise TypeError(f"not JSON: {type(value).__name__}")

            state = _state(transcript, args.entity)
            for chunk in safe_json_chunks(state, indent=2, default=read_back):
                out.write(chunk)
            out.write("\n")
    return 0
