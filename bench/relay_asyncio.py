"""A minimal two-way asyncio relay in front of an agent: the round-trip floor.

Contract: ``python bench/relay_asyncio.py AGENT [ARGS...]`` spawns the agent on pipes and copies
bytes both ways (client stdin -> agent stdin, agent stdout -> client stdout) with ``os.read`` on
readiness (``loop.add_reader``) and ``os.write``; no framing, no parsing, no backpressure beyond
blocking writes. It is the least an asyncio program does per message: one wake-up and one
read/write per hop. Exits when the agent's output ends.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            os.set_blocking(fd, True)
            n = os.write(fd, view)
            os.set_blocking(fd, False)
        view = view[n:]


async def main(argv: list[str]) -> int:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    a_in, a_out = proc.stdin.fileno(), proc.stdout.fileno()
    for fd in (0, a_out):
        os.set_blocking(fd, False)

    def pump(src: int, dst: int, at_eof: object) -> None:
        try:
            data = os.read(src, 65536)
        except BlockingIOError:
            return
        if not data:
            loop.remove_reader(src)
            if at_eof is done:
                if not done.done():
                    done.set_result(None)
            else:
                proc.stdin.close()  # type: ignore[union-attr]
            return
        _write_all(dst, data)

    loop.add_reader(0, pump, 0, a_in, None)
    loop.add_reader(a_out, pump, a_out, 1, done)
    await done
    return proc.wait()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
