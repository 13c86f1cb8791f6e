"""The demo's client: one scripted ACP v2 session against a child process, recorded frame by frame.

Contract: owns the scripted client (the messages it sends, when it waits for what) and running
it against a child (the scripted agent directly, or the proxy in front of it): every frame the
child writes is recorded with its bytes. It never judges what it recorded (``pairing`` and
``stored`` do) and always ends its child process (a deadline on every wait).
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Final

import orjson

from acp_proxy import __version__
from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.wire.framing import Line, LineSplitter

PROTOCOL_VERSION: Final = 2
CLIENT_INFO: Final[JsonObject] = {
    "name": "acp-proxy-demo-client",
    "title": "acp-proxy demo client",
    "version": __version__,
}
DEMO_CWD: Final = "/workspace/project"
PROMPT_TEXT: Final = "Check config.yaml and run the tests."
DEFAULT_TIMEOUT_S: Final = 30.0
DEFAULT_PACE_MS: Final = 20
STDERR_TAIL_BYTES: Final = 16 * 1024


class DemoError(Exception):
    """The demo could not complete (the proxy failed, timed out or answered with an error)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One line a peer wrote, without its newline, and its decoded JSON (``None`` if not JSON)."""

    raw: bytes
    message: JsonValue


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """Everything one run of the scripted session sent and received."""

    argv: tuple[str, ...]
    sent: tuple[JsonObject, ...]
    received: tuple[Frame, ...]
    session_id: str
    negotiated_version: int
    agent_info: JsonValue
    returncode: int | None
    stderr: str


class _Child:
    """A child speaking NDJSON on stdin/stdout, read by threads so every wait has a deadline."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], deadline: float) -> None:
        self.argv = tuple(argv)
        self._deadline = deadline
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        except OSError as exc:
            raise DemoError(f"cannot start {self.argv[0]}: {exc}") from exc
        assert self._proc.stdin is not None and self._proc.stdout is not None
        assert self._proc.stderr is not None
        self._stdin: IO[bytes] = self._proc.stdin
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._stderr = bytearray()
        self._stderr_lock = threading.Lock()
        self._eof = False
        self._threads = [
            threading.Thread(target=self._read_stdout, args=(self._proc.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(self._proc.stderr,), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read_stdout(self, stream: IO[bytes]) -> None:
        # Split as the proxy splits (a line over the limit comes as its head, which no parser
        # reads); os.read returns what is there.
        splitter = LineSplitter()
        for chunk in iter(lambda: os.read(stream.fileno(), 65536), b""):
            for event in splitter.feed(chunk):
                self._lines.put(event.raw if isinstance(event, Line) else event.head)
        for event in splitter.end():
            self._lines.put(event.raw if isinstance(event, Line) else event.head)
        self._lines.put(None)

    def _read_stderr(self, stream: IO[bytes]) -> None:
        # Always drained, so a chatty proxy never blocks on a full pipe; only the tail is kept.
        # os.read returns what is there (a buffered read(n) would wait for n bytes or EOF).
        for chunk in iter(lambda: os.read(stream.fileno(), 65536), b""):
            with self._stderr_lock:
                self._stderr += chunk
                del self._stderr[:-STDERR_TAIL_BYTES]

    def stderr_text(self) -> str:
        with self._stderr_lock:
            return self._stderr.decode("utf-8", "replace")

    def send(self, message: JsonObject) -> None:
        try:
            self._stdin.write(orjson.dumps(message) + b"\n")
            self._stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise self._failure("stopped reading its input") from exc

    def next_frame(self, waiting_for: str) -> Frame:
        """The next line; raises ``DemoError`` at EOF or when the deadline passes."""
        if self._eof:
            raise self._failure(f"closed its output while the client waited for {waiting_for}")
        remaining = self._deadline - time.monotonic()
        try:
            line = self._lines.get(timeout=max(remaining, 0.0))
        except queue.Empty:
            raise DemoError(
                f"timed out waiting for {waiting_for} from: {' '.join(self.argv)}"
                + self._stderr_suffix()
            ) from None
        if line is None:
            self._eof = True
            raise self._failure(f"closed its output while the client waited for {waiting_for}")
        raw = line.rstrip(b"\r\n")
        try:
            message: JsonValue = orjson.loads(raw)
        except orjson.JSONDecodeError:
            message = None
        return Frame(raw, message)

    def close(self) -> int | None:
        """Close stdin (the client's EOF), then wait for the exit; kill past the deadline."""
        with contextlib.suppress(OSError, ValueError):
            self._stdin.close()
        remaining = max(self._deadline - time.monotonic(), 0.5)
        try:
            return self._proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            return None
        finally:
            for thread in self._threads:
                thread.join(timeout=1.0)
            # Its output is at EOF and read (or its readers gave up): our ends close now, not
            # whenever the garbage collector finds them (a ResourceWarning then).
            for stream in (self._proc.stdout, self._proc.stderr):
                if stream is not None and not any(t.is_alive() for t in self._threads):
                    stream.close()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5.0)

    def _stderr_suffix(self) -> str:
        tail = self.stderr_text().strip()
        return f"\n--- its stderr ---\n{tail}" if tail else ""

    def _failure(self, what: str) -> DemoError:
        code = self._proc.poll()
        if code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(timeout=2.0)
        status = f" (exit status {code})" if code is not None else ""
        return DemoError(f"{' '.join(self.argv)} {what}{status}" + self._stderr_suffix())


def client_messages(session_id: str) -> list[JsonObject]:
    """The three requests of the scripted client (``session/prompt`` needs the session id)."""
    return [
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            # v2 request shape: role-agnostic `info` and `capabilities` (acp-digest §2.3).
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "info": CLIENT_INFO,
                "capabilities": {},
            },
        },
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session/new",
            "params": {"cwd": DEMO_CWD, "mcpServers": []},
        },
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session/prompt",
            "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": PROMPT_TEXT}]},
        },
    ]


def _response_to(frame: Frame, request_id: int) -> JsonObject | None:
    message = frame.message
    if isinstance(message, dict) and "method" not in message and message.get("id") == request_id:
        return message
    return None


def _is_idle(frame: Frame, session_id: str) -> bool:
    message = frame.message
    if not isinstance(message, dict) or message.get("method") != "session/update":
        return False
    params = message.get("params")
    if not isinstance(params, dict) or params.get("sessionId") != session_id:
        return False
    update = params.get("update")
    return (
        isinstance(update, dict)
        and update.get("sessionUpdate") == "state_update"
        and update.get("state") == "idle"
    )


def _result_of(response: JsonObject, method: str, argv: Sequence[str]) -> JsonObject:
    if "error" in response:
        error = orjson.dumps(response["error"]).decode()
        raise DemoError(f"{method} failed through {' '.join(argv)}: {error}")
    result = response.get("result")
    if not isinstance(result, dict):
        raise DemoError(f"{method}: the response has no result object: {response!r}")
    return result


def run_session(argv: Sequence[str], env: dict[str, str], timeout_s: float) -> SessionRecord:
    """Play the scripted client against ``argv``: initialize, session/new, session/prompt.

    Reads until the prompt response *and* the idle ``state_update`` have arrived (v2: the prompt
    response acknowledges the user message; the idle state ends the turn), then closes the
    child's stdin and waits for it to exit. Raises ``DemoError`` on any failure or timeout.
    """
    child = _Child(argv, env, time.monotonic() + timeout_s)
    received: list[Frame] = []
    sent: list[JsonObject] = []
    try:

        def request(message: JsonObject, until: Callable[[], bool], what: str) -> None:
            child.send(message)
            sent.append(message)
            while not until():
                received.append(child.next_frame(what))

        def answer(request_id: int) -> JsonObject | None:
            for frame in received:
                response = _response_to(frame, request_id)
                if response is not None:
                    return response
            return None

        init, new, _ = client_messages("")
        request(init, lambda: answer(0) is not None, "the initialize response")
        init_result = _result_of(answer(0) or {}, "initialize", argv)
        version = init_result.get("protocolVersion")
        if version != PROTOCOL_VERSION:
            raise DemoError(f"the agent negotiated protocolVersion {version!r}, not 2")
        request(new, lambda: answer(1) is not None, "the session/new response")
        session_id = _result_of(answer(1) or {}, "session/new", argv).get("sessionId")
        if not isinstance(session_id, str):
            raise DemoError("session/new returned no sessionId")
        prompt = client_messages(session_id)[2]
        request(
            prompt,
            lambda: answer(2) is not None and any(_is_idle(f, session_id) for f in received),
            "the session/prompt response and the idle state_update",
        )
        _result_of(answer(2) or {}, "session/prompt", argv)
    except BaseException:
        child.kill()
        raise
    returncode = child.close()
    return SessionRecord(
        argv=tuple(argv),
        sent=tuple(sent),
        received=tuple(received),
        session_id=session_id,
        negotiated_version=PROTOCOL_VERSION,
        agent_info=init_result.get("info"),
        returncode=returncode,
        stderr=child.stderr_text(),
    )
