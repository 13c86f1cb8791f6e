"""The package layout (issue 14): the public import path, the old one, and the rooms' rule."""

from __future__ import annotations

import ast
from pathlib import Path

import acp_proxy.chain as old
import acp_proxy.middleware as public
from acp_proxy.wire import chain

PACKAGE = Path(__file__).resolve().parent.parent / "acp_proxy"
PURE = ("meta", "wire", "config", "record", "telemetry")


def test_public_names_have_one_stable_path_and_the_old_one_still_works() -> None:
    for name in public.__all__:
        assert getattr(public, name) is getattr(chain, name, getattr(public, name))
    for name in old.__all__:
        assert getattr(old, name) is getattr(public, name)


def test_no_pure_package_imports_the_shell() -> None:
    # ruff's banned-api enforces it too; this test says it without a linter.
    offenders = []
    for room in PURE:
        for path in (PACKAGE / room).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names: list[str] = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                for name in names:
                    if name.split(".")[:2] in (["acp_proxy", "shell"], ["acp_proxy", "cli"]):
                        offenders.append(f"{path.relative_to(PACKAGE)}: {name}")
                    if name.split(".")[0] in ("anyio", "asyncio", "structlog", "socket"):
                        offenders.append(f"{path.relative_to(PACKAGE)}: {name}")
    assert offenders == []


def test_every_module_starts_with_its_contract() -> None:
    missing = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" or path.stat().st_size
        if not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert missing == []
