"""A small, configurable fake ACP agent for the shell tests (real process, real pipes).

Speaks newline-delimited JSON-RPC on stdin/stdout. Options select misbehaviours:

  --protocol N          answer ``initialize`` with protocolVersion N (default 2)
  --replay FILE         golden mode: FILE has lines "C <frame>" (client) and "A <frame>" (agent);
                        after each client line is read, the agent lines that follow it are written
                        verbatim; agent lines before the first client line are written at start
  --record FILE         append every line received (with its newline), byte for byte
  --banner TEXT         write TEXT as a (non-JSON) line before anything else (repeatable)
  --stderr-bytes N      write N bytes of log lines to stderr before reading anything
  --grandchild PIDFILE  start a grandchild (`sleep 60`) and write its pid to PIDFILE
  --ignore-term         ignore SIGTERM
  --crash-after N       after reading N lines (the Nth is not answered), exit with --exit-code
  --silent-after N      read but do not answer lines after the Nth (requests stay in flight)
  --flood N             before reading, write about N bytes of `_vendor/log` notifications
  --exit-code N         exit status at the end (default 0)
  --kill-self SIG       at the end, kill itself with signal SIG instead of exiting
  --hang-at-eof         at stdin EOF, do not exit (sleep until killed)
  --ready FILE          create FILE once the agent is reading (handshake for signal tests)
  --echo-batch          answer a batch (JSON array) of requests with one array of responses

Without --replay, requests are answered: ``initialize`` with the protocol version,
``_test/env`` ``{"name": N}`` with ``{"value": $N}``, ``_test/big`` ``{"size": N}`` with
``{"data": "bbb..."}`` (N bytes), ``_test/cwd`` with ``{"cwd": ...}``, other
methods with ``{"echo": <params>}``; notifications are ignored. Answers are compact JSON with
raw UTF-8 (``ensure_ascii=False``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any


def _parse(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"banner": [], "protocol": 2, "exit_code": 0}
    flags = {"--ignore-term", "--hang-at-eof", "--echo-batch"}
    i = 0
    while i < len(argv):
        name = argv[i]
        key = name.lstrip("-").replace("-", "_")
        if name in flags:
            opts[key] = True
            i += 1
            continue
        value = argv[i + 1]
        if name == "--banner":
            opts["banner"].append(value)
        elif name in (
            "--protocol",
            "--stderr-bytes",
            "--crash-after",
            "--exit-code",
            "--silent-after",
            "--flood",
        ):
            opts[key] = int(value)
        else:
            opts[key] = value
        i += 2
    return opts


def _answer(message: Any, protocol: int) -> Any:
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    params = message.get("params")
    if message["method"] == "initialize":
        result: Any = {"protocolVersion": protocol, "agentCapabilities": {}, "authMethods": []}
    elif message["method"] == "_test/env" and isinstance(params, dict):
        result = {"value": os.environ.get(params["name"])}
    elif message["method"] == "_test/big" and isinstance(params, dict):
        result = {"data": "b" * params["size"]}
    elif message["method"] == "_test/cwd":
        result = {"cwd": os.getcwd()}
    else:
        result = {"echo": message.get("params")}
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


def main(argv: list[str]) -> int:
    opts = _parse(argv)
    out = sys.stdout.buffer
    if opts.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if opts.get("grandchild"):
        child = subprocess.Popen(["sleep", "60"])
        with open(opts["grandchild"], "w") as f:
            f.write(str(child.pid))
    if opts.get("stderr_bytes"):
        line = b"x" * 99 + b"\n"
        remaining = opts["stderr_bytes"]
        while remaining > 0:
            sys.stderr.buffer.write(line * min(1000, remaining // 100 + 1))
            remaining -= 100_000
        sys.stderr.buffer.flush()
    if opts.get("flood"):
        note = b'{"jsonrpc":"2.0","method":"_vendor/log","params":{"text":"' + b"f" * 900 + b'"}}\n'
        for _ in range(opts["flood"] // len(note) + 1):
            out.write(note)
    for text in opts["banner"]:
        out.write(text.encode() + b"\n")
    script: list[tuple[bytes, bytes]] = []
    if opts.get("replay"):
        with open(opts["replay"], "rb") as f:
            script = [(line[:1], line[2:]) for line in f.read().split(b"\n") if line]
        while script and script[0][0] == b"A":
            out.write(script.pop(0)[1] + b"\n")
    out.flush()
    if opts.get("ready"):
        with open(opts["ready"], "w") as f:
            f.write("ready")
    record = open(opts["record"], "ab") if opts.get("record") else None  # noqa: SIM115
    count = 0
    for raw in sys.stdin.buffer:
        count += 1
        if record is not None:
            record.write(raw)
            record.flush()
        if opts.get("crash_after") is not None and count >= opts["crash_after"]:
            break
        if opts.get("silent_after") is not None and count > opts["silent_after"]:
            continue
        if script:
            if script[0][0] == b"C":
                script.pop(0)
            while script and script[0][0] == b"A":
                out.write(script.pop(0)[1] + b"\n")
            out.flush()
            continue
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        if isinstance(message, list):
            answers = [a for a in (_answer(m, opts["protocol"]) for m in message) if a]
            if answers:
                out.write(
                    json.dumps(answers, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
                )
        else:
            answer = _answer(message, opts["protocol"])
            if answer is not None:
                out.write(
                    json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
                )
        out.flush()
    else:
        if opts.get("hang_at_eof"):
            while True:
                time.sleep(60)
    out.flush()
    if opts.get("kill_self"):
        os.kill(os.getpid(), getattr(signal, opts["kill_self"]))
        time.sleep(5)
    return int(opts["exit_code"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
