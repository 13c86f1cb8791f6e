"""Shared pytest configuration: anyio's built-in plugin on the asyncio backend only, a fixture
that records what ``orjson.loads`` parses (the coalescer's tests count parses), and the memory
pipes of ``proxy_harness.memory_pipe_pair`` closed after each test (an unclosed memory stream is
a ``ResourceWarning``, and every warning is an error)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import settings
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``ACP_PROXY_MAX_EXAMPLES=N`` caps every hypothesis test at N examples.

    scripts/check runs the suite at full strength without coverage, then the core's own tests
    again under branch coverage (the 100 % gate), where tracing makes each example about twice
    as dear and breadth, not depth, is what is measured: there the examples are capped."""
    cap = os.environ.get("ACP_PROXY_MAX_EXAMPLES")
    if not cap:
        return
    for item in items:
        test = getattr(item, "obj", None)
        inner = getattr(test, "hypothesis", None)
        current = getattr(test, "_hypothesis_internal_use_settings", None)
        if inner is None or not isinstance(current, settings):
            continue
        limit = min(current.max_examples, int(cap))
        test._hypothesis_internal_use_settings = settings(current, max_examples=limit)  # type: ignore[union-attr]
