"""The golden session files (tests/golden): each side's lines."""

from __future__ import annotations

from proxy_harness import (
    GOLDEN,
)


def golden_sides(name: str) -> tuple[bytes, bytes]:
    """(what the client sends, what the agent sends) of a golden "C "/"A " session file."""
    client: list[bytes] = []
    agent: list[bytes] = []
    for line in (GOLDEN / name).read_bytes().split(b"\n"):
        if line:
            (client if line[:2] == b"C " else agent).append(line[2:] + b"\n")
    return b"".join(client), b"".join(agent)
