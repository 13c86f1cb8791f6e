"""Shared pytest configuration: anyio's built-in plugin on the asyncio backend only."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
