"""A live session for the live-view tests: the proxy with ``--ui`` between the demo's scripted
client and agent, kept open (the client has not closed its input) while a test looks at it."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.demo import _child_env
from acp_proxy.demo.session import _Child, _is_idle, _response_to, client_messages

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "acp_proxy" / "data" / "default.yaml"
URL = re.compile(r"live view at (http://\S+)")


@dataclass
class LiveSession:
    url: str
    child: _Child
    session_id: str
    received: int = 0

    def prompt(self, request_id: int) -> None:
        """One more prompt; returns once its idle state_update arrived."""
        message: JsonObject = dict(client_messages(self.session_id)[2])
        message["id"] = request_id
        self.child.send(message)
        while True:
            frame = self.child.next_frame("the idle state_update")
            self.received += 1
            if _is_idle(frame, self.session_id):
                return


@contextmanager
def live_session(*extra: str, timeout_s: float = 30.0) -> Iterator[LiveSession]:
    """Start the proxy with ``--ui`` and play initialize, session/new and one prompt."""
    argv = [
        sys.executable,
        "-m",
        "acp_proxy",
        "--ui",
        "tcp://127.0.0.1:0",
        "--config",
        str(RULES),
        *extra,
        "--",
        sys.executable,
        "-m",
        "acp_proxy.demo.agent",
        "--pace-ms",
        "0",
    ]
    child = _Child(argv, _child_env(), time.monotonic() + timeout_s)
    try:
        deadline = time.monotonic() + timeout_s
        while (found := URL.search(child.stderr_text())) is None:
            assert time.monotonic() < deadline, child.stderr_text()
            time.sleep(0.02)
        init, new, _ = client_messages("")
        child.send(init)
        received = 0
        while _response_to(child.next_frame("initialize"), 0) is None:
            received += 1
        child.send(new)
        while True:
            frame = child.next_frame("session/new")
            received += 1
            response = _response_to(frame, 1)
            if response is not None:
                break
        result = response["result"]
        assert isinstance(result, dict)
        session = LiveSession(found.group(1), child, str(result["sessionId"]), received + 1)
        session.prompt(2)
        yield session
    finally:
        child.close()
