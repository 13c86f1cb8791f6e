"""A fake ACP agent that replays a generated agent file as fast as the pipe takes it (issue 6).

Contract: waits for the first client line (the ``initialize`` request, so the proxy has seen the
request before the response that negotiates the version), then writes the file to stdout with
``os.sendfile`` (a copy loop where unsupported) and exits 0. Everything else the client sends is
read and discarded on a background thread, so the proxy never blocks writing to the agent.

If ``BENCH_AGENT_RUSAGE`` names a file, the agent writes its own resource usage there as JSON
before exiting: the harness subtracts it from the proxy's ``wait4`` figures, which include the
proxy's reaped children. Usage: ``python bench/replay_agent.py AGENT_FILE [REPEAT]``: with
REPEAT > 1, everything after the first two lines (the initialize and session/new responses) is
sent REPEAT times, for files whose body is notifications only (generate.py profile ``notify``).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import sys
import threading


def _drain() -> None:
    try:
        while os.read(0, 1 << 16):
            pass
    except OSError:
        pass


def _copy(fd_in: int, size: int, offset: int = 0) -> None:
    """Write bytes ``offset``..``size`` of ``fd_in`` to stdout (sendfile, else pread/write)."""
    use_sendfile = True
    while offset < size:
        if use_sendfile:
            try:
                sent = os.sendfile(1, fd_in, offset, size - offset)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                use_sendfile = False  # no sendfile to this kind of fd
                continue
        else:
            data = os.pread(fd_in, min(1 << 20, size - offset), offset)
            view = memoryview(data)
            while view:
                view = view[os.write(1, view) :]
            sent = len(data)
        if sent == 0:
            return
        offset += sent


def report_rusage() -> None:
    path = os.environ.get("BENCH_AGENT_RUSAGE")
    if path:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        with open(path, "w") as f:
            json.dump({"utime": ru.ru_utime, "stime": ru.ru_stime, "maxrss_kb": ru.ru_maxrss}, f)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: replay_agent.py AGENT_FILE [REPEAT]", file=sys.stderr)
        return 2
    repeat = int(argv[2]) if len(argv) == 3 else 1
    seen = b""
    while b"\n" not in seen:  # the initialize request
        data = os.read(0, 1 << 16)
        if not data:
            break
        seen += data
    threading.Thread(target=_drain, daemon=True).start()
    fd = os.open(argv[1], os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        _copy(fd, size)
        if repeat > 1:
            with open(argv[1], "rb") as f:
                body = len(f.readline()) + len(f.readline())
            for _ in range(repeat - 1):
                _copy(fd, size, body)
    except BrokenPipeError:
        return 1
    finally:
        os.close(fd)
    os.close(1)
    report_rusage()
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    os._exit(code)  # do not wait for the drain thread
