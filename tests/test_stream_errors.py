"""The stream errors: one tuple (``transports.STREAM_ERRORS``) every reader and writer catches,
and one mapping at the stream boundary (``transports.gone``: an OS error on a stream is the peer
gone, ``anyio.BrokenResourceError``)."""

from __future__ import annotations

import ast
import os
import socket
from pathlib import Path

import anyio
import pytest

from acp_proxy.shell.sockets.streams import SocketStream
from acp_proxy.shell.transports import STREAM_ERRORS, FdStream, gone
from acp_proxy.shell.ui_server import _send_all

PACKAGE = Path(__file__).resolve().parent.parent / "acp_proxy"
_NAMES = {"EndOfStream", "BrokenResourceError", "ClosedResourceError"}


def _spelled(node: ast.expr) -> int:
    """How many of anyio's stream errors a tuple (or call arguments) names one by one."""
    elements = node.elts if isinstance(node, ast.Tuple) else [node]
    return sum(
        1
        for e in elements
        if isinstance(e, ast.Attribute) and e.attr in _NAMES and ast.unparse(e.value) == "anyio"
    )


def copies_of_the_tuple(package: Path) -> list[str]:
    """Where a module other than ``transports`` names two or more of the stream errors in one
    ``except``, ``suppress`` or tuple it names: a copy of the tuple, where the set drifts."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "transports.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                count = _spelled(node.type)
            elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("suppress"):
                count = sum(_spelled(arg) for arg in node.args)
            elif isinstance(node, ast.Assign):
                count = _spelled(node.value)
            else:
                continue
            if count >= 2:
                found.append(f"{path.relative_to(package)}:{node.lineno}")
    return found


def test_the_stream_errors_tuple_is_spelled_once() -> None:
    assert copies_of_the_tuple(PACKAGE) == []


def test_the_check_sees_a_copy(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import anyio\n"
        "try:\n    pass\nexcept (anyio.EndOfStream, anyio.BrokenResourceError):\n    pass\n"
        "with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):\n"
        "    pass\nERRORS = (anyio.EndOfStream, anyio.ClosedResourceError)\n"
    )
    assert sorted(copies_of_the_tuple(tmp_path)) == ["m.py:4", "m.py:6", "m.py:8"]


def test_gone_is_broken_resource_caused_by_the_os_error() -> None:
    cause = BrokenPipeError(32, "Broken pipe")
    err = gone(cause)
    assert isinstance(err, anyio.BrokenResourceError) and err.__cause__ is cause
    assert isinstance(err, STREAM_ERRORS)


def test_a_write_to_a_pipe_whose_reader_is_gone_raises_broken() -> None:
    read, write = os.pipe()
    os.close(read)

    async def main() -> None:
        stream = FdStream(None, write)
        try:
            with pytest.raises(anyio.BrokenResourceError) as caught:
                await stream.send(b"x\n")
            assert isinstance(caught.value.__cause__, BrokenPipeError)
            with pytest.raises(anyio.BrokenResourceError):
                stream.try_send(b"x\n")
        finally:
            await stream.aclose()

    anyio.run(main)


def test_the_live_view_s_scatter_write_to_a_reset_socket_raises_broken() -> None:
    ours, theirs = socket.socketpair()
    theirs.close()

    async def main() -> None:
        stream = SocketStream(ours)
        try:
            with pytest.raises(anyio.BrokenResourceError) as caught:
                await _send_all(stream, [b"HTTP/1.1 200 OK\r\n", b"\r\n"])
            assert isinstance(caught.value.__cause__, OSError)
        finally:
            await stream.aclose()

    anyio.run(main)
