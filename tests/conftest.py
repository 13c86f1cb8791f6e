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

# Property tests (hypothesis) run hundreds of examples each: seconds on an idle machine, but
# 20-60 s each on the shared 2-core machine under a load of 10 (measured), and the suite's
# SIGALRM timeout firing inside hypothesis's data generation is reported as a flaky strategy.
# They get this timeout unless they state their own; every other test keeps the default.
PROPERTY_TEST_TIMEOUT_S = 300


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Property tests get ``PROPERTY_TEST_TIMEOUT_S`` unless they state their own, and with
    ``ACP_PROXY_MAX_EXAMPLES=N`` every one is capped at N examples.

    scripts/check runs the suite at full strength without coverage, then the core's own tests
    again under branch coverage (the 100 % gate), where tracing makes each example about twice
    as dear and breadth, not depth, is what is measured: there the examples are capped."""
    cap = os.environ.get("ACP_PROXY_MAX_EXAMPLES")
    for item in items:
        test = getattr(item, "obj", None)
        is_property = getattr(test, "is_hypothesis_test", False)
        if is_property and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(PROPERTY_TEST_TIMEOUT_S))
        current = getattr(test, "_hypothesis_internal_use_settings", None)
        if cap and is_property and isinstance(current, settings):
            limit = min(current.max_examples, int(cap))
            test._hypothesis_internal_use_settings = settings(current, max_examples=limit)  # type: ignore[union-attr]


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


@pytest.fixture
def looks(parses: list[bytes], monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What the coalescer looks at from here on, in order: every line it parses
    (``orjson.loads``, as ``parses``) or scans for its shape (the bytes path)."""
    from acp_proxy.wire.coalesce import bytes_merge as coalesce_bytes
    from acp_proxy.wire.coalesce import run as coalesce_run
    from acp_proxy.wire.coalesce import shape as coalesce_shape

    real = coalesce_shape.update_shape

    def scanning(raw: bytes, fields: Any, idents: int, table: bytes, kinds: Any) -> Any:
        parses.append(raw)
        return real(raw, fields, idents, table, kinds)

    monkeypatch.setattr(coalesce_run, "update_shape", scanning)
    monkeypatch.setattr(coalesce_bytes, "update_shape", scanning)
    return parses
