"""A fake agent that streams while (or instead of) reading its stdin, for the flow-control tests.

    stream_agent.py --bytes N [--seed S] [--pad P] [--stdin never|thread] [--record FILE]
                    [--requests R] [--done FILE] [--exit-code N]

Writes about N bytes of ``session/update`` notifications (``stream_lines(N, S)``: line sizes and
pauses drawn from seed S; with seed 0, lines of about 450 bytes and no pauses) to stdout with
unbuffered writes.

* ``--requests R``: first read R lines from stdin (requests it will never answer).
* ``--pad P``: with seed 0, each line's text is P bytes (default 300).
* ``--done FILE``: created once everything is written, right before exiting.
* ``--stdin never`` (default): never reads stdin; exits once the stream is written (an agent
  that streams without reading its input, as many simple agents do).
* ``--stdin thread``: a second thread reads stdin to EOF meanwhile (with its own pauses when
  seeded); the agent exits once both are done, after writing ``BYTES SHA256`` of what it read to
  ``--record`` FILE.

Only the standard library, so it starts quickly.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import threading
import time


def stream_lines(total: int, seed: int, pad_bytes: int = 300) -> list[bytes]:
    """The agent's stream: notifications of random sizes adding up to at least ``total`` bytes."""
    rng = random.Random(seed)
    out: list[bytes] = []
    size = 0
    i = 0
    while size < total:
        # Seed 0: small lines of one size (many frames per megabyte, like a token stream).
        pad = rng.choice((10, 100, 1000, 5000, 30000)) + rng.randrange(50) if seed else pad_bytes
        line = (
            b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
            b'{"sessionUpdate":"agent_message_chunk","messageId":"m%d","content":'
            b'{"type":"text","text":"%s"}}}}\n' % (i, b"t" * pad)
        )
        out.append(line)
        size += len(line)
        i += 1
    return out


def _pauses(seed: int, salt: int) -> random.Random | None:
    return random.Random(seed * 1000 + salt) if seed else None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_stream(total: int, seed: int, pad: int) -> None:
    rng = _pauses(seed, 1)
    for line in stream_lines(total, seed, pad):
        _write_all(1, line)
        if rng is not None and rng.random() < 0.02:
            time.sleep(rng.random() * 0.05)


def main(argv: list[str]) -> int:
    opts = dict(zip(argv[::2], argv[1::2], strict=True))
    total = int(opts.get("--bytes", "0"))
    seed = int(opts.get("--seed", "0"))
    stdin_mode = opts.get("--stdin", "never")
    record = opts.get("--record")
    got = hashlib.sha256()
    count = [0]

    def read_stdin() -> None:
        rng = _pauses(seed, 2)
        while True:
            chunk = os.read(0, rng.choice((100, 4096, 65536)) if rng else 65536)
            if not chunk:
                return
            got.update(chunk)
            count[0] += len(chunk)
            if rng is not None and rng.random() < 0.05:
                time.sleep(rng.random() * 0.05)

    for _ in range(int(opts.get("--requests", "0"))):
        sys.stdin.buffer.readline()
    reader = threading.Thread(target=read_stdin) if stdin_mode == "thread" else None
    if reader is not None:
        reader.start()
    _write_stream(total, seed, int(opts.get("--pad", "300")))
    if reader is not None:
        reader.join()
        if record:
            with open(record, "w") as f:
                f.write(f"{count[0]} {got.hexdigest()}")
    if "--done" in opts:
        with open(opts["--done"], "w") as f:
            f.write("done")
    return int(opts.get("--exit-code", "0"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
