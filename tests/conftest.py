"""Shared pytest configuration: anyio's built-in plugin on the asyncio backend only, a fixture
that records what ``orjson.loads`` parses (the coalescer's tests count parses), and the memory
pipes of ``proxy_harness.memory_pipe_pair`` closed after each test (an unclosed memory stream is
a ``ResourceWarning``, and every warning is an error)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from proxy_harness import close_memory_pipes


@pytest.fixture(autouse=True)
def _close_memory_pipes() -> Iterator[None]:
    yield
    close_memory_pipes()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What ``orjson.loads`` is given from here on, in order."""
    seen: list[bytes] = []
    real = orjson.loads

    def counting(data: bytes) -> Any:
        seen.append(data)
        return real(data)

    monkeypatch.setattr(orjson, "loads", counting)
    return seen
