"""A fake ACP agent that replays a generated agent file as fast as the pipe takes it.

Contract: waits for the first client line (the ``initialize`` request, so the proxy has seen the
request before the response that negotiates the version), then writes the file to stdout with
``os.sendfile`` (a copy loop where unsupported) and exits 0. Everything else the client sends is
read and discarded on a background thread, so the proxy never blocks writing to the agent.

If ``BENCH_AGENT_RUSAGE`` names a file, the agent writes its own resource usage there as JSON
before exiting: the harness subtracts it from the proxy's ``wait4`` figures, which include the
proxy's reaped children. Usage: ``python bench/replay_agent.py AGENT_FILE [REPEAT]``: with
REPEAT > 1, everything after the first two lines (the initialize and session/new responses) is
sent REPEAT times, for files whose body is notifications only (generate.py profile ``notify``).

``--renumber CLIENT_FILE`` (the peers): a peer (the conductor, the Python-SDK relay)
renumbers the requests it forwards, so the file's responses, which carry the client's ids, would
answer nothing. In this mode every response in the file to a request of CLIENT_FILE is held back
until that request has arrived (the n-th request of a method in CLIENT_FILE is the n-th request
of that method received) and is written with the id it arrived with; everything between
responses is copied unchanged. The file is scanned for those responses before the first read,
so the scan is start-up, not stream time. At the end the agent closes its stdout and, like a real
agent, runs until its stdin closes (the conductor drops whatever an exited agent left unread).
Without the flag the output is the file byte for byte (the proxy rows' identity check).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import sys
import threading
from dataclasses import dataclass


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
        # Written whole or not at all: the harness may read it the moment the proxy exited,
        # and an agent stopped in the middle of the write left an empty file it choked on.
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"utime": ru.ru_utime, "stime": ru.ru_stime, "maxrss_kb": ru.ru_maxrss}, f)
        os.replace(tmp, path)


@dataclass(slots=True)
class Held:
    """One response of the agent file held back until its request arrives (``--renumber``)."""

    start: int  # offset of the response line in the agent file
    end: int
    message: dict[str, object]
    method: str  # the method of the request it answers ...
    ordinal: int  # ... and which request of that method it is, counting from 0


def plan(agent_path: str, client_path: str) -> list[Held]:
    """The responses of ``agent_path`` to the requests of ``client_path``, in file order."""
    which: dict[str, tuple[str, int]] = {}  # the client's id (JSON text) -> (method, ordinal)
    seen: dict[str, int] = {}
    with open(client_path, "rb") as f:
        for line in f:
            msg = json.loads(line) if line.strip() else None
            if isinstance(msg, dict) and "method" in msg and "id" in msg:
                method = str(msg["method"])
                which[json.dumps(msg["id"])] = (method, seen.get(method, 0))
                seen[method] = seen.get(method, 0) + 1
    held: list[Held] = []
    offset = 0
    with open(agent_path, "rb") as f:
        for line in f:
            if (
                line.lstrip().startswith(b"{")
                and (b'"result"' in line or b'"error"' in line)
                and b'"method"' not in line
            ):
                msg = json.loads(line)
                key = json.dumps(msg.get("id")) if isinstance(msg, dict) else ""
                if key in which:
                    held.append(Held(offset, offset + len(line), msg, *which[key]))
            offset += len(line)
    return held


class Received:
    """The ids of the requests read from stdin, per method, as they arrive (a reader thread)."""

    def __init__(self) -> None:
        self.ids: dict[str, list[object]] = {}
        self.eof = False
        self.cond = threading.Condition()

    def read(self) -> None:
        tail = b""
        try:
            while data := os.read(0, 1 << 16):
                lines = (tail + data).split(b"\n")
                tail = lines.pop()
                found = []
                for line in lines:
                    if b'"method"' in line and b'"id"' in line:
                        try:
                            msg = json.loads(line)
                        except ValueError:
                            continue
                        if isinstance(msg, dict) and "method" in msg and "id" in msg:
                            found.append((str(msg["method"]), msg["id"]))
                if found:
                    with self.cond:
                        for method, rid in found:
                            self.ids.setdefault(method, []).append(rid)
                        self.cond.notify_all()
        except OSError:
            pass
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait_for(self, method: str, ordinal: int) -> object | None:
        """The id of request ``ordinal`` of ``method`` once it arrived; None at EOF without it."""
        with self.cond:
            while len(self.ids.get(method, ())) <= ordinal and not self.eof:
                self.cond.wait()
            got = self.ids.get(method, [])
            return got[ordinal] if len(got) > ordinal else None


def renumbered(agent_path: str, client_path: str, repeat: int) -> int:
    held = plan(agent_path, client_path)
    received = Received()
    reader = threading.Thread(target=received.read, daemon=True)
    reader.start()
    fd = os.open(agent_path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        offset = 0
        for h in held:
            _copy(fd, h.start, offset)
            rid = received.wait_for(h.method, h.ordinal)
            line = json.dumps({**h.message, "id": rid}, separators=(",", ":")).encode() + b"\n"
            view = memoryview(line if rid is not None else os.pread(fd, h.end - h.start, h.start))
            while view:
                view = view[os.write(1, view) :]
            offset = h.end
        _copy(fd, size, offset)
        _repeat_body(fd, size, agent_path, repeat)
    except BrokenPipeError:
        return 1
    finally:
        os.close(fd)
    os.close(1)
    reader.join()  # a real agent runs until the client side closes its stdin
    report_rusage()
    return 0


def _repeat_body(fd: int, size: int, agent_path: str, repeat: int) -> None:
    """Send the file's body (after the initialize and session/new responses) ``repeat - 1``
    more times."""
    if repeat > 1:
        with open(agent_path, "rb") as f:
            body = len(f.readline()) + len(f.readline())
        for _ in range(repeat - 1):
            _copy(fd, size, body)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "--renumber":
        if len(argv) not in (4, 5):
            print("usage: replay_agent.py --renumber CLIENT AGENT_FILE [REPEAT]", file=sys.stderr)
            return 2
        return renumbered(argv[3], argv[2], int(argv[4]) if len(argv) == 5 else 1)
    if len(argv) not in (2, 3):
        print("usage: replay_agent.py [--renumber CLIENT] AGENT_FILE [REPEAT]", file=sys.stderr)
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
        _repeat_body(fd, size, argv[1], repeat)
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
