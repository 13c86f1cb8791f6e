"""Helpers for the shell tests: run the real ``python -m acp_proxy`` with ``tests/fake_agent.py``.

Every call is bounded by ``anyio.fail_after`` so a broken proxy fails a test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import termios
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FAKE_AGENT = TESTS / "fake_agent.py"
GOLDEN = TESTS / "golden"
TIMEOUT = 20.0


def proxy_env(**extra: str) -> dict[str, str]:
    """The environment for a proxy subprocess: ours, with the repository importable."""
    env = dict(os.environ)
    env.pop("ACP_PROXY_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def proxy_cmd(*proxy_args: str, agent: list[str] | None = None) -> list[str]:
    """``python -m acp_proxy PROXY_ARGS -- python fake_agent.py AGENT``."""
    return [
        sys.executable,
        "-m",
        "acp_proxy",
        *proxy_args,
        "--",
        sys.executable,
        str(FAKE_AGENT),
        *(agent or []),
    ]


@dataclass(frozen=True)
class Ran:
    rc: int
    stdout: bytes
    stderr: bytes

    def log_events(self) -> list[dict[str, Any]]:
        """The proxy's JSON log lines (``--log-format json``), other stderr lines skipped."""
        out = []
        for line in self.stderr.splitlines():
            if line.startswith(b"{"):
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(event, dict) and "event" in event:
                    out.append(event)
        return out

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.log_events() if e["event"] == name]


async def run(
    cmd: list[str],
    stdin: bytes = b"",
    *,
    env: dict[str, str] | None = None,
    timeout: float = TIMEOUT,
) -> Ran:
    """Run ``cmd`` to completion with ``stdin`` as its whole input."""
    with anyio.fail_after(timeout):
        done = await anyio.run_process(
            cmd, input=stdin, check=False, env=env or proxy_env(), cwd=str(REPO)
        )
    return Ran(done.returncode, done.stdout, done.stderr)


class Lines:
    """Read a byte stream line by line (for interactive tests)."""

    def __init__(self, stream: anyio.abc.ByteReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def line(self) -> bytes:
        """The next line with its newline; raises ``anyio.EndOfStream`` at EOF."""
        while b"\n" not in self.buffer:
            self.buffer += await self.stream.receive()
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line + b"\n"

    async def rest(self) -> bytes:
        """Everything up to EOF."""
        chunks = [self.buffer]
        self.buffer = b""
        while True:
            try:
                chunks.append(await self.stream.receive())
            except anyio.EndOfStream:
                return b"".join(chunks)


def request(rid: int | str, method: str, params: object = None) -> bytes:
    """A compact JSON-RPC request frame with its newline."""
    message: dict[str, object] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        message["params"] = params
    return orjson.dumps(message) + b"\n"


def echo_response(rid: int | str, params: object) -> bytes:
    """What fake_agent answers to a non-initialize request (compact, like ``json.dumps``)."""
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": {"echo": params}}) + b"\n"


def init_response(rid: int | str, version: int = 2) -> bytes:
    return (
        orjson.dumps(
            {
                "jsonrpc": "2.0",
                "id": rid,
                "result": {"protocolVersion": version, "agentCapabilities": {}, "authMethods": []},
            }
        )
        + b"\n"
    )


def error_line(rid: int | str, code: int, message: str) -> bytes:
    return (
        orjson.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})
        + b"\n"
    )


def write_config(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


# ru_maxrss pitfall: Linux keeps the pre-exec memory high-water mark of a forked child
# (fs/exec.c records the old mm's hiwater in signal->maxrss), so a proxy forked straight from a
# large pytest process reports pytest's RSS. Fork it from this small launcher instead; the
# launcher writes the child's own wait4 ru_maxrss (KiB) to the file named by argv[1].
RUSAGE_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""


def measured_cmd(rss_file: Path, cmd: list[str]) -> list[str]:
    """``cmd`` run under the RSS launcher; read the peak (KiB) from ``rss_file`` afterwards."""
    return [sys.executable, "-c", RUSAGE_LAUNCHER, str(rss_file), *cmd]


class MemoryByteStream(anyio.abc.ByteStream):
    """One end of a pair of bounded memory object streams, as bytes (in-process sessions)."""

    def __init__(
        self,
        send: anyio.abc.ObjectSendStream[bytes],
        receive: anyio.abc.ObjectReceiveStream[bytes],
    ) -> None:
        self._send, self._receive = send, receive

    async def receive(self, max_bytes: int = 65536) -> bytes:
        try:
            return await self._receive.receive()
        except anyio.ClosedResourceError:
            raise anyio.EndOfStream from None

    async def send(self, item: bytes) -> None:
        await self._send.send(item)

    async def send_eof(self) -> None:
        await self._send.aclose()

    async def aclose(self) -> None:
        await self._send.aclose()
        await self._receive.aclose()


# Every memory stream ``memory_pipe_pair`` made: ``close_memory_pipes`` (an autouse fixture of
# conftest.py) closes them once the test ended, as a process closes its pipes when it exits.
_MEMORY_STREAMS: list[anyio.abc.ObjectSendStream[bytes] | anyio.abc.ObjectReceiveStream[bytes]] = []


def memory_pipe_pair(buffer: int = 16) -> tuple[MemoryByteStream, MemoryByteStream]:
    """Two connected byte streams; each direction holds at most ``buffer`` chunks."""
    a_send, b_receive = anyio.create_memory_object_stream[bytes](buffer)
    b_send, a_receive = anyio.create_memory_object_stream[bytes](buffer)
    _MEMORY_STREAMS.extend((a_send, b_receive, b_send, a_receive))
    return MemoryByteStream(a_send, a_receive), MemoryByteStream(b_send, b_receive)


def close_memory_pipes() -> None:
    """Close every stream of the pairs made so far (closing twice is harmless)."""
    while _MEMORY_STREAMS:
        stream = _MEMORY_STREAMS.pop()
        stream.close()  # type: ignore[union-attr]  # the memory streams' synchronous close


def close_pipes(proc: subprocess.Popen[bytes]) -> None:
    """Close our ends of ``proc``'s pipes (what ``with Popen(...)`` does on exit), for a test
    that keeps a process past a ``with``; ignores a pipe whose last write fails (EPIPE)."""
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def end_process(proc: subprocess.Popen[bytes], timeout: float, *, terminate: bool = False) -> None:
    """A test's process ended whatever happened in the test: its input closed (and SIGTERM with
    ``terminate``), ``timeout`` seconds to exit, then SIGKILL; our ends of its pipes closed. A
    test that failed with the process's output still full (a paused client) leaves no process
    behind."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if terminate and proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    close_pipes(proc)


# -- backpressure, seen from outside -------------------------------------------------------------
def unread_in_pipe(fd: int) -> tuple[int, int]:
    """(bytes written to the pipe of ``fd`` and not read yet, its capacity): Linux answers
    ``FIONREAD`` on either end of a pipe."""
    raw = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    return int.from_bytes(raw, sys.byteorder), fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)


def pipe_full(fd: int) -> bool:
    """The pipe of ``fd`` (either end) holds all it can: its reader has stopped reading. Less
    than 16 KiB free counts as full: the kernel fills a pipe page by page, and a writer that
    writes whole lines (the proxy) leaves the rest of a page unused."""
    unread, capacity = unread_in_pipe(fd)
    return unread > capacity - 16 * 1024


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux: ``/proc/PID/task/*/children``)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(x) for x in (task / "children").read_text().split()]
    return found


def _fd_pipe_full(pid: int, fd: int) -> bool:
    """Descriptor ``fd`` of process ``pid`` is a pipe that holds all it can. False while it
    cannot be opened (not there yet, not a pipe)."""
    try:
        opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return pipe_full(opened)
    except OSError:
        return False
    finally:
        os.close(opened)


# ``write`` in /proc/PID/syscall: x86-64, then arm64 and riscv64 (the generic table).
_WRITE_SYSCALLS = frozenset((1, 64))


def blocked_writing(pid: int, fd: int = 1) -> bool:
    """A thread of process ``pid`` sleeps in ``write(fd, ...)``: the pipe is full and its reader
    (the proxy, for an agent's stdout) is not reading it. How full a pipe is cannot tell that:
    the kernel fills it page by page, and small writes leave part of each page unused."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            state = (task / "stat").read_text().rpartition(")")[2].split()[0]
            call = (task / "syscall").read_text().split()
        except (OSError, IndexError):
            continue
        writing = len(call) > 1 and call[0].isdigit() and int(call[0]) in _WRITE_SYSCALLS
        if state == "S" and writing and int(call[1], 16) == fd:
            return True
    return False


def stdin_full(pid: int) -> bool:
    """Process ``pid``'s stdin is a full pipe: ``pid`` is not reading it."""
    return _fd_pipe_full(pid, 0)


async def wait_until(
    condition: Callable[[], bool], what: str, *, settle: float = 0.2, timeout: float = 30.0
) -> None:
    """Poll ``condition`` every 20 ms until it has held at every poll for ``settle`` seconds (a
    reader that stopped, not one that is between two reads); fail with ``what`` after
    ``timeout``."""
    with anyio.move_on_after(timeout):
        since: float | None = None
        while since is None or anyio.current_time() - since < settle:
            held = condition()
            since = (since if since is not None else anyio.current_time()) if held else None
            await anyio.sleep(0.02)
        return
    raise AssertionError(f"not within {timeout:g} s: {what}")


class SocketAsProcess:
    """A connected byte stream as a test client drives a process: ``stdin`` to send, ``stdout``
    to read (the same client code for stdio and for ``--listen``)."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stdin = self.stdout = stream


@contextlib.asynccontextmanager
async def running(cmd: list[str]) -> AsyncIterator[anyio.abc.Process]:
    """``cmd`` (a proxy, a conductor) run from the repository with the test environment; killed
    if the test leaves it running."""
    async with await anyio.open_process(cmd, env=proxy_env(), cwd=str(REPO)) as proc:
        try:
            yield proc
        finally:
            if proc.returncode is None:
                proc.kill()


async def wait_for_path(path: Path) -> None:
    """Until ``path`` exists (a Unix socket a proxy binds), at most ``TIMEOUT``."""
    with anyio.fail_after(TIMEOUT):
        while not path.exists():
            await anyio.sleep(0.02)
