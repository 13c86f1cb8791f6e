"""Shared pytest configuration: anyio's built-in plugin on the asyncio backend only, and a
fixture that records what ``orjson.loads`` parses (the coalescer's tests count parses)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest


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
