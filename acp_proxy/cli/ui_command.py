"""``acp-proxy ui FILE...`` (also ``acp-proxy show --web FILE...``): the live view's page over
recorded sessions.

Contract: parses the command line and runs ``ui_server.serve_records`` until interrupted.
Refuses (exit 2) a path that is not a regular file (a FIFO, a device, a directory: it is not
opened for reading, so nothing waits for a writer), a file whose first line is not a record
header (read up to a header's bound, like ``show``) and a non-loopback address without
``--allow-remote``, like ``--ui``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import anyio

from acp_proxy.shell.ui.hub import HISTORY_BYTES, HubLimits


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acp-proxy ui",
        description="Serve the live view's page over recorded sessions (record files written "
        "by --record; a FIFO or a device is refused: use --ui to watch a running session). "
        "Prints the URL (with its access token) to stderr; Ctrl-C stops.",
    )
    parser.add_argument("files", metavar="FILE", nargs="+")
    parser.add_argument(
        "--ui",
        metavar="URL",
        default="tcp://127.0.0.1:0",
        help="where to serve (default tcp://127.0.0.1:0: a free loopback port)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="let --ui bind a non-loopback address (the token still guards every request)",
    )
    parser.add_argument(
        "--history-bytes",
        type=int,
        default=HISTORY_BYTES,
        metavar="N",
        help=f"events held for the page, in bytes (default {HISTORY_BYTES}); older first go",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    from acp_proxy.shell.ui.live_server import serve_records

    limits = HubLimits(history_bytes=max(args.history_bytes, 1))
    return anyio.run(serve_records, args.files, args.ui, args.allow_remote, limits)
