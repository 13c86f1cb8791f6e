"""The record writer and the record file: real proxies, FIFOs, ``ulimit -f``, hostile paths.

The writer never holds up the session or its exit: a file that does not take lines (a FIFO
with no reader or a paused one, a file at its size limit) costs dropped, counted lines (a
``lost`` line once the file takes lines again, the log at the end), and the exit waits at most
``EXIT_WAIT_S``. A record path is never followed through a link, and an existing file takes a
record only when it is the user's own and private.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from proxy_harness import REPO, TIMEOUT, proxy_cmd, proxy_env, request

from acp_proxy.record.settings import refusal
from acp_proxy.shell.record.recorder import EXIT_WAIT_S

BIG = 1024 * 1024
# Enough record lines to fill the pipe and the writer's queue (16 MiB) twice over.
BIG_REQUESTS = 24


def events(stderr: bytes, name: str) -> list[dict[str, Any]]:
    out = []
    for line in stderr.splitlines():
        if line.startswith(b"{"):
            event = orjson.loads(line)
            if event.get("event") == name:
                out.append(event)
    return out


def big_session(n: int = BIG_REQUESTS, size: int = BIG) -> bytes:
    return request(0, "initialize", {}) + b"".join(
        request(i, "_test/big", {"size": size}) for i in range(1, n + 1)
    )


class PausedReader(threading.Thread):
    """Opens the FIFO, reads a little, waits for ``resume``, then reads to EOF."""

    def __init__(self, fifo: Path) -> None:
        super().__init__(daemon=True)
        self.fifo = fifo
        self.resume = threading.Event()
        self.data = bytearray()
        self.lock = threading.Lock()

    def run(self) -> None:
        with open(self.fifo, "rb", buffering=0) as f:
            self.data += f.read(100)
            self.resume.wait(60)
            while chunk := f.read(1 << 16):
                with self.lock:
                    self.data += chunk

    def snapshot(self) -> bytes:
        with self.lock:
            return bytes(self.data)


def private_fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "record.fifo"
    os.mkfifo(fifo, 0o600)
    return fifo


def test_a_paused_fifo_reader_never_holds_up_the_session_or_its_exit(tmp_path: Path) -> None:
    fifo = private_fifo(tmp_path)
    reader = PausedReader(fifo)
    reader.start()
    with subprocess.Popen(
        proxy_cmd("--log-format", "json", "--record", str(fifo)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=proxy_env(),
        cwd=str(REPO),
    ) as proxy:
        assert proxy.stdin is not None and proxy.stdout is not None
        proxy.stdin.write(big_session())
        proxy.stdin.flush()
        answers = [proxy.stdout.readline() for _ in range(BIG_REQUESTS + 1)]
        proxy.stdin.close()  # the client is done
        answered = time.monotonic()
        stderr = proxy.stderr.read() if proxy.stderr else b""
        assert proxy.wait(TIMEOUT) == 0, stderr[-2000:]
        lag = time.monotonic() - answered
    reader.resume.set()
    reader.join(TIMEOUT)
    assert all(a.endswith(b"}\n") for a in answers)  # every answer, whole
    # The proxy exits once the session is over, waiting EXIT_WAIT_S at most for the record
    # (before: the writer's 10 s join).
    assert lag < EXIT_WAIT_S + 3, lag
    [missing] = events(stderr, "the record is missing lines the file did not take")
    assert missing["lost"] > 0
    lines = bytes(reader.data).split(b"\n")
    assert json.loads(lines[0])["acp-proxy-record"] == 1
    for line in lines[1:-1]:  # all complete lines are whole records lines
        json.loads(line)


def test_lines_dropped_while_the_reader_paused_are_counted_in_a_lost_line(
    tmp_path: Path,
) -> None:
    fifo = private_fifo(tmp_path)
    reader = PausedReader(fifo)
    reader.start()
    with subprocess.Popen(
        proxy_cmd("--log-format", "json", "--record", str(fifo)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=proxy_env(),
        cwd=str(REPO),
    ) as proxy:
        assert proxy.stdin is not None and proxy.stdout is not None
        proxy.stdin.write(big_session())
        proxy.stdin.flush()
        for _ in range(BIG_REQUESTS + 1):
            assert proxy.stdout.readline()
        reader.resume.set()
        # Small requests until one is recorded after the drops: its "lost" line comes first.
        for rid in range(100, 300):
            proxy.stdin.write(request(rid, "ping", {}))
            proxy.stdin.flush()
            assert proxy.stdout.readline()
            if b'"event":"lost"' in reader.snapshot():
                break
            time.sleep(0.05)
        proxy.stdin.close()
        stderr = proxy.stderr.read() if proxy.stderr else b""
        assert proxy.wait(TIMEOUT) == 0
    reader.join(TIMEOUT)
    record = [orjson.loads(line) for line in bytes(reader.data).splitlines()]
    lost = [e for e in record if e.get("event") == "lost"]
    assert lost
    [missing] = events(stderr, "the record is missing lines the file did not take")
    assert sum(e["frames"] for e in lost) == missing["lost"]  # every drop is in the file
    assert record[-1]["event"] == "end"
    shown = subprocess.run(
        [sys.executable, "-m", "acp_proxy", "show", "/dev/stdin"],
        input=bytes(reader.data),
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert b"lines lost (the record file did not take them)" in shown.stdout


def test_a_fifo_with_no_reader_never_blocks_the_session(tmp_path: Path) -> None:
    fifo = private_fifo(tmp_path)
    started = time.monotonic()
    done = subprocess.run(
        proxy_cmd("--log-format", "json", "--record", str(fifo)),
        input=request(0, "initialize", {}) + request(1, "ping", {}),
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout.splitlines()) == 2
    assert time.monotonic() - started < EXIT_WAIT_S + 5
    [missing] = events(done.stderr, "the record is missing lines the file did not take")
    # The header, initialize, the version, its answer, ping, its answer and the end.
    assert missing["lost"] == 7


def test_a_record_at_its_size_limit_drops_and_counts_every_line(tmp_path: Path) -> None:
    record = tmp_path / "limited.jsonl"
    n = 40
    cmd = " ".join(
        [
            "ulimit -f 16 &&",  # 16 KiB: the header and a few frames fit
            "exec",
            *(f"'{a}'" for a in proxy_cmd("--log-format", "json", "--record", str(record))),
        ]
    )
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", cmd],
        input=big_session(n, 1000),
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout.splitlines()) == n + 1  # the wire is never touched
    assert time.monotonic() - started < EXIT_WAIT_S + 5
    [failed] = events(
        done.stderr,
        "cannot write the record; lines are dropped and counted until it takes them again",
    )
    assert failed["error"] == "File too large"
    [missing] = events(done.stderr, "the record is missing lines the file did not take")
    data = record.read_bytes()
    assert len(data) <= 16 * 1024
    # Every line the recorder made is in the file whole or counted: the header, the version,
    # both frames of each request and the end.
    assert data.count(b"\n") + missing["lost"] == 1 + 1 + 2 * (n + 1) + 1
    # The file reads back: its complete lines are records, a torn tail is reported.
    shown = subprocess.run(
        [sys.executable, "-m", "acp_proxy", "show", str(record)],
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr


# --- the record file -----------------------------------------------------------------------------


def run_proxy(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        proxy_cmd("--log-format", "json", *args),
        input=request(0, "initialize", {}),
        capture_output=True,
        env=proxy_env(),
        cwd=str(REPO),
        timeout=TIMEOUT,
        check=False,
    )


def refused(done: subprocess.CompletedProcess[bytes]) -> str:
    assert done.returncode == 2, done.stderr
    [answer] = [orjson.loads(line) for line in done.stdout.splitlines()]  # the editor is told
    assert answer["error"]["message"].startswith("acp-proxy could not start (--record ")
    [event] = events(done.stderr, "cannot open the record file")
    return str(event["error"])


def test_an_existing_record_file_others_can_read_is_refused(tmp_path: Path) -> None:
    record = tmp_path / "shared.jsonl"
    record.write_bytes(b"")
    record.chmod(0o644)
    assert refused(run_proxy("--record", str(record))) == (
        "others may access it (mode 0644); a record must be private: chmod 600 it, or choose "
        "a new path"
    )
    assert record.read_bytes() == b""
    record.chmod(0o600)  # the user's own, private: appended to
    assert run_proxy("--record", str(record)).returncode == 0
    assert run_proxy("--record", str(record)).returncode == 0
    assert record.read_bytes().count(b'{"acp-proxy-record":1') == 2


def test_a_link_at_the_record_path_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"keep\n")
    target.chmod(0o600)
    link = tmp_path / "record.jsonl"
    link.symlink_to(target)
    assert refused(run_proxy("--record", str(link))) == (
        "it is a symbolic link (a record is never written through a link)"
    )
    assert target.read_bytes() == b"keep\n"
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "created-through-the-link.jsonl")
    assert "symbolic link" in refused(run_proxy("--record", str(dangling)))
    assert not (tmp_path / "created-through-the-link.jsonl").exists()


def test_a_new_record_is_private_and_only_own_private_files_are_taken(tmp_path: Path) -> None:
    record = tmp_path / "new.jsonl"
    assert run_proxy("--record", str(record)).returncode == 0
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    me = os.geteuid()
    regular, fifo = stat.S_IFREG | 0o600, stat.S_IFIFO | 0o600
    assert refusal(regular, me, me) is None
    assert refusal(fifo, me, me) is None
    assert refusal(regular, me + 1, me) == f"it is owned by another user (uid {me + 1})"
    assert refusal(stat.S_IFREG | 0o640, me, me) is not None
    assert refusal(stat.S_IFCHR | 0o600, me, me) == "it is not a regular file or a FIFO"
    assert refused(run_proxy("--record", "/dev/null")) == "it is not a regular file or a FIFO"


def test_a_write_error_after_the_last_line_is_still_reported(tmp_path: Path) -> None:
    """The writer thread may first fail while the recorder closes (a file at its ``ulimit -f``
    as the session ends): the error is logged once, before the count of lines it cost."""
    from acp_proxy.config import Config
    from acp_proxy.shell.record.recorder import Recorder, build_redactor

    logged: list[tuple[str, str, dict[str, Any]]] = []

    class Log:
        def error(self, event: str, **fields: Any) -> None:
            logged.append(("error", event, fields))

        def warning(self, event: str, **fields: Any) -> None:
            logged.append(("warning", event, fields))

    config = Config()
    recorder = Recorder(
        str(tmp_path / "r.jsonl"),
        config.record,
        build_redactor(config.record),
        log=Log(),
        agent=["agent"],
        connect=None,
        config=config,
    )
    writer = recorder._writer
    close = writer.close

    def failing_close(timeout: float) -> int:
        close(timeout)
        writer.error = OSError(27, "File too large")
        return 3

    writer.close = failing_close  # type: ignore[method-assign]
    recorder.finish()
    assert [(level, event) for level, event, _ in logged] == [
        (
            "error",
            "cannot write the record; lines are dropped and counted until it takes them again",
        ),
        ("warning", "the record is missing lines the file did not take"),
    ]
    assert logged[0][2]["error"] == "File too large" and logged[1][2]["lost"] == 3
