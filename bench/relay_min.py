"""The hand-written minimal Python relays the proxy is measured against (scenario 1).

Contract: a one-way stdin -> stdout relay of newline-delimited JSON, in two flavours:

* ``line``: pass-through. Reads what is available (64 KiB at a time), writes every complete line
  at once, keeps the unfinished tail for the next read. One write per read, never a partial line:
  the smallest correct line relay for a live protocol (no buffering across reads, no flush lag).
* ``inject``: the same loop, plus orjson parse of *every* line and, for
  ``session/update`` notifications whose ``update.sessionUpdate`` is ``tool_call_update`` or
  ``terminal_update``, one ``_meta`` key set on the update (the example annotation rule);
  changed messages are re-encoded, untouched lines leave as their original bytes. Batches are
  handled entry by entry and stay one array.

It has no error handling beyond forwarding unparsable lines unchanged; that is the point: a floor
for what a Python relay costs. Usage: ``python bench/relay_min.py line|inject``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import orjson

READ_SIZE = 64 * 1024
META_KEY = "example.dev/route"
META_VALUE = "edge"
KINDS = frozenset(("tool_call_update", "terminal_update"))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _inject_one(msg: Any) -> bool:
    """Set the annotation key on a matching update in place; True when ``msg`` changed."""
    if not isinstance(msg, dict) or msg.get("method") != "session/update":
        return False
    params = msg.get("params")
    if not isinstance(params, dict):
        return False
    update = params.get("update")
    if not isinstance(update, dict) or update.get("sessionUpdate") not in KINDS:
        return False
    meta = update.get("_meta")
    if meta is None and "_meta" in update:
        return False  # an explicit clear: leave it to the real proxy's patch algebra
    update["_meta"] = (
        {**meta, META_KEY: META_VALUE} if isinstance(meta, dict) else {META_KEY: META_VALUE}
    )
    return True


def inject_line(line: bytes) -> bytes:
    try:
        msg = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line
    if isinstance(msg, list):
        changed = False
        for entry in msg:
            changed = _inject_one(entry) or changed
    else:
        changed = _inject_one(msg)
    return orjson.dumps(msg) if changed else line


def relay(mode: str, fd_in: int = 0, fd_out: int = 1) -> None:
    pending: list[bytes] = []  # the unfinished tail, in pieces (a 10 MB line arrives in 160 reads)
    inject = mode == "inject"
    while True:
        chunk = os.read(fd_in, READ_SIZE)
        if not chunk:
            break
        cut = chunk.rfind(b"\n")
        if cut < 0:
            pending.append(chunk)
            continue
        head = chunk[: cut + 1]
        if pending:
            pending.append(head)
            head = b"".join(pending)
            pending.clear()
        if cut + 1 < len(chunk):
            pending.append(chunk[cut + 1 :])
        if inject:
            head = b"\n".join([inject_line(ln) for ln in head.split(b"\n")[:-1]]) + b"\n"
        write_all(fd_out, head)
    if pending:  # a last line without its newline: forward it as it is
        write_all(fd_out, b"".join(pending))


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ("line", "inject"):
        print("usage: relay_min.py line|inject", file=sys.stderr)
        return 2
    try:
        relay(argv[1])
    except BrokenPipeError:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
