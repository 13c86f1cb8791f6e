"""Listening sockets: bind an ``Address``, and give a Unix socket file back when done.

Contract: owns resolving a TCP address (``resolve_tcp``: an IP literal at once, a name by the
resolver in a worker thread), binding and listening (every address a TCP host resolves to; the
loopback rule unless remote clients are allowed; ``listen_now`` without an event loop when no
lookup is needed: anyio is imported only for a lookup), Unix socket files (created 0600 with no
wider window, a stale file replaced, a live one or a non-socket never), and removing only the
file it created. It never accepts a connection (``server`` does) and never reads one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from typing import Any

from acp_proxy.base.values import value
from acp_proxy.shell.sockets.address import (
    EXIT_FAILURE,
    EXIT_USAGE,
    Address,
    is_ip_literal,
    is_loopback_ip,
)

LISTEN_BACKLOG = 128


class ListenError(Exception):
    """The proxy cannot listen where asked; ``exit_code`` is 2 (usage) or 1 (environment)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@value(frozen=False)
class Listener:
    """Bound, listening sockets for one address, and the Unix socket file they own."""

    address: Address  # the bound address (an ephemeral port resolved)
    sockets: list[socket.socket]
    unix_identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file we created
    closed: bool = False

    def close(self) -> None:
        """Stop listening and remove our Unix socket file (only if it is still ours)."""
        if self.closed:
            return
        self.closed = True
        for sock in self.sockets:
            sock.close()
        if self.unix_identity is not None:
            path = self.address.path
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                # Another proxy may have replaced a file we thought stale: never remove theirs.
                if (st.st_dev, st.st_ino) == self.unix_identity:
                    os.unlink(path)


# What a non-loopback listener exposes, and the consent it needs: (risk, refusal's advice).
ACP_EXPOSURE = (
    "anyone who can reach it can drive the agent",
    "pass --allow-remote (allow_remote: true in the config) to accept remote clients",
)


async def open_listener(
    address: Address,
    *,
    allow_remote: bool,
    log: Any,
    exposure: tuple[str, str] = ACP_EXPOSURE,
    remote_note: str = "traffic is unauthenticated and unencrypted",
) -> Listener:
    """Bind and listen on ``address``. Raises ``ListenError`` with a one-line reason.
    ``exposure``: what a remote peer could do there, and the consent to pass (refusal);
    ``remote_note``: the warning's word on what guards a non-loopback one."""
    listener = listen_now(
        address, allow_remote=allow_remote, log=log, exposure=exposure, remote_note=remote_note
    )
    if listener is not None:
        return listener
    try:
        infos = await resolve_tcp(address, passive=True)
    except OSError as exc:
        raise ListenError(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    return _bind_tcp(
        address, infos, allow_remote=allow_remote, log=log, exposure=exposure, note=remote_note
    )


def listen_now(
    address: Address,
    *,
    allow_remote: bool,
    log: Any,
    exposure: tuple[str, str] = ACP_EXPOSURE,
    remote_note: str = "traffic is unauthenticated and unencrypted",
) -> Listener | None:
    """``open_listener`` without waiting (no event loop needed): ``address`` bound now, or
    None when its host is a name, whose lookup may block (``open_listener`` does it)."""
    if address.scheme == "unix":
        return _listen_unix(address, log)
    if not is_ip_literal(address.host):
        return None
    infos = _numeric(address, socket.AI_PASSIVE)
    return _bind_tcp(
        address, infos, allow_remote=allow_remote, log=log, exposure=exposure, note=remote_note
    )


def _numeric(address: Address, flags: int) -> list[tuple[Any, ...]]:
    """``getaddrinfo`` of an IP literal: a conversion, no lookup (the host as bytes: a ``str``
    would be IDNA-encoded, which imports ``unicodedata``)."""
    return socket.getaddrinfo(
        address.host.encode("ascii"),
        address.port,
        type=socket.SOCK_STREAM,
        flags=flags | socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
    )


async def resolve_tcp(address: Address, *, passive: bool = False) -> list[tuple[Any, ...]]:
    """``getaddrinfo`` of a TCP ``address`` (stream sockets; ``passive``: to bind). An IP literal
    is converted here (``AI_NUMERICHOST``: no lookup, nothing that can block); only a name goes
    to the resolver, which runs in a worker thread. A thread for ``127.0.0.1`` cost every
    ``--ui``, ``--metrics`` and ``--listen`` a second thread with its own malloc arena (some
    2,400 page faults) and a third to stop it at exit."""
    flags = socket.AI_PASSIVE if passive else 0
    if is_ip_literal(address.host):
        return _numeric(address, flags)
    import anyio  # (not at import: the agent may start before anyio is imported)

    return await anyio.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM, flags=flags)


def _bind_tcp(
    address: Address,
    infos: list[tuple[Any, ...]],
    *,
    allow_remote: bool,
    log: Any,
    exposure: tuple[str, str],
    note: str,
) -> Listener:
    """Listen on every address of ``infos`` (what ``address``'s host resolved to)."""
    ips = list(dict.fromkeys((family, str(sockaddr[0])) for family, *_, sockaddr in infos))
    remote = [ip for _, ip in ips if not is_loopback_ip(ip)]
    if remote and not allow_remote:
        raise ListenError(
            f"refusing to listen on {address}: {', '.join(remote)} is not a loopback address "
            f"({exposure[0]}); {exposure[1]}",
            EXIT_USAGE,
        )
    if remote:
        log.warning(
            f"listening on a non-loopback address: {note}; " + exposure[0],
            address=str(address),
            addresses=remote,
        )
    sockets: list[socket.socket] = []
    port = address.port
    try:
        for family, ip in ips:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            # SO_REUSEADDR only skips TIME_WAIT; a live listener on the port still fails.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((ip, port))
            port = sock.getsockname()[1]  # port 0: the others share the first one's port
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(
                f"cannot listen on {address}: port {port} is already in use "
                "(another process is listening on it)"
            ) from exc
        raise ListenError(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    return Listener(Address("tcp", host=address.host, port=port), sockets)


def _unix_is_live(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # e.g. EAGAIN (backlog full) or a timeout: someone is there
    finally:
        probe.close()
    return True


def _listen_unix(address: Address, log: Any) -> Listener:
    path = address.path
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ListenError(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise ListenError(
                f"cannot listen on {address}: {path} exists and is not a socket; "
                "refusing to replace it"
            )
        if _unix_is_live(path):
            raise ListenError(f"cannot listen on {address}: another process is listening on {path}")
        log.info("replacing a stale socket file (nothing listening on it)", path=path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Create the file as 0600 from the start (no window with wider permissions): the umask
    # applies to bind(). Nothing else in this process creates files while the loop starts up.
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(
                f"cannot listen on {address}: {path} was created by another process"
            ) from exc
        raise ListenError(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    finally:
        os.umask(old_umask)
    try:
        os.chmod(path, 0o600)
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
        st = os.lstat(path)
    except OSError as exc:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise ListenError(f"cannot listen on {address}: {exc.strerror or exc}") from exc
    return Listener(address, [sock], unix_identity=(st.st_dev, st.st_ino))
