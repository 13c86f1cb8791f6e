"""Build the optional C accelerator of the block scan, MarkupSafe-style.

Everything else is declared in pyproject.toml. ``acp_proxy/wire/raw/_scan.c`` is compiled when a C
compiler and the Python headers are present; when the build fails (no compiler, no headers, an
unsupported interpreter), the install goes on without it and ``acp_proxy.wire.raw.block_scan`` uses
its
pure-Python fallback (same results, slower: README "Dependencies"). ``acp-proxy --version``
says which scanner is active. ``ACP_PROXY_NO_C=1`` skips the build on purpose.
"""

from __future__ import annotations

import os
import platform
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

EXTENSIONS = [Extension("acp_proxy.wire.raw._scan", ["acp_proxy/wire/raw/_scan.c"], optional=False)]


class BuildFailed(Exception):
    pass


class OptionalBuildExt(build_ext):
    """``build_ext`` that turns a compiler failure into ``BuildFailed`` (caught below)."""

    def run(self) -> None:
        try:
            super().run()
        except PlatformError as exc:
            raise BuildFailed(exc) from exc

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError, OSError) as exc:
            raise BuildFailed(exc) from exc


def show(*lines: str) -> None:
    print("=" * 78, *lines, "=" * 78, sep="\n", file=sys.stderr)


def run_setup(with_c: bool) -> None:
    setup(cmdclass={"build_ext": OptionalBuildExt}, ext_modules=EXTENSIONS if with_c else [])


if os.environ.get("ACP_PROXY_NO_C") == "1":
    run_setup(False)
    show("acp-proxy: ACP_PROXY_NO_C=1: the C scanner is not built; the pure-Python one is used.")
elif platform.python_implementation() != "CPython":
    run_setup(False)
    show("acp-proxy: the C scanner needs CPython; the pure-Python one is used.")
else:
    try:
        run_setup(True)
    except BuildFailed as exc:
        show(
            f"WARNING: acp-proxy's C scanner could not be compiled ({exc}).",
            "Retrying without it: acp-proxy works the same, with the pure-Python scanner",
            "(slower pass-through; README 'Dependencies'). Failure information is above.",
        )
        run_setup(False)
