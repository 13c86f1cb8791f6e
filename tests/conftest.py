"""Shared pytest configuration: anyio's built-in plugin on the asyncio backend only, and a
fixture that records what ``orjson.loads`` parses (the coalescer's tests count parses)."""

from __future__ import annotations

import os
from typing import Any

import orjson
import pytest
from hypothesis import settings


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
    from acp_proxy.wire import coalesce_bytes, coalesce_run, coalesce_shape

    real = coalesce_shape.update_shape

    def scanning(raw: bytes, fields: Any, idents: int, table: bytes, kinds: Any) -> Any:
        parses.append(raw)
        return real(raw, fields, idents, table, kinds)

    monkeypatch.setattr(coalesce_run, "update_shape", scanning)
    monkeypatch.setattr(coalesce_bytes, "update_shape", scanning)
    return parses


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
