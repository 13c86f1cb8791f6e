"""Socket addresses: ``tcp://HOST:PORT``, ``tcp://[IPV6]:PORT``, ``unix:///ABSOLUTE/PATH``, and
the WebSocket URLs ``ws://HOST:PORT/PATH`` / ``wss://HOST:PORT/PATH`` (docs/remote.md).

Contract: owns parsing the socket URLs of ``--listen``, ``--connect``, ``--metrics`` and
``--ui`` into an ``Address`` (with an error that says what would be valid), the loopback rule's
test of an IP, and the exit codes of the socket modes. Pure: it never opens a socket or resolves
a name.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from acp_proxy.base.values import value

EXIT_FAILURE = 1  # cannot listen / cannot connect / agent connection lost
EXIT_USAGE = 2  # bad address, non-loopback without --allow-remote
_HELP = (
    "tcp://HOST:PORT, tcp://[IPV6]:PORT or unix:///ABSOLUTE/PATH (ws[s]://HOST:PORT/PATH for "
    "--listen and --connect over WebSocket)"
)
WEBSOCKET_SCHEMES = ("ws", "wss")


class AddressError(ValueError):
    """A ``--listen`` / ``--connect`` URL that is not valid; the message says what would be."""


@value
class Address:
    """A parsed socket URL: ``tcp`` with ``host``/``port``, ``unix`` with ``path``, or ``ws`` /
    ``wss`` with ``host``/``port`` and the HTTP ``path`` (``/`` when the URL has none)."""

    scheme: Literal["tcp", "unix", "ws", "wss"]
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.scheme in WEBSOCKET_SCHEMES:
            return f"{self.scheme}://{host}:{self.port}{self.path}"
        return f"tcp://{host}:{self.port}"

    @property
    def websocket(self) -> bool:
        return self.scheme in WEBSOCKET_SCHEMES

    def socket_address(self) -> Address:
        """The TCP address a WebSocket URL is served on or reached at (itself otherwise)."""
        return Address("tcp", self.host, self.port) if self.websocket else self


def parse_address(url: str, *, listen: bool) -> Address:
    """Parse ``tcp://host:port``, ``tcp://[v6]:port`` or ``unix:///abs/path``.

    Port 0 (an ephemeral port, logged once bound) is allowed only for ``listen``.
    Raises ``AddressError``.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("tcp", "unix", *WEBSOCKET_SCHEMES):
        raise AddressError(f"{url!r}: expected {_HELP}")
    if scheme in WEBSOCKET_SCHEMES:
        return _parse_websocket(url, scheme, rest, listen=listen)
    if scheme == "unix":
        if not rest.startswith("/"):
            raise AddressError(
                f"{url!r}: a Unix socket path must be absolute (three slashes: "
                f"unix:///run/acp.sock)"
            )
        if "\0" in rest:
            raise AddressError(f"{url!r}: a Unix socket path cannot contain NUL")
        return Address("unix", path=rest)
    if "/" in rest or "?" in rest or "#" in rest:
        raise AddressError(f"{url!r}: a tcp address has no path: expected tcp://HOST:PORT")
    host, colon, port_text = rest.rpartition(":")
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            raise AddressError(f"{url!r}: expected tcp://[IPV6]:PORT")
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise AddressError(f"{url!r}: {host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise AddressError(f"{url!r}: put an IPv6 address in brackets: tcp://[{host}]:PORT")
    if not colon:
        raise AddressError(f"{url!r}: missing :PORT (expected tcp://HOST:PORT)")
    if not host:
        raise AddressError(f"{url!r}: missing HOST (expected tcp://HOST:PORT)")
    if not port_text.isdigit() or not (0 if listen else 1) <= int(port_text) <= 65535:
        low = 0 if listen else 1
        raise AddressError(f"{url!r}: the port must be a number from {low} to 65535")
    return Address("tcp", host=host, port=int(port_text))


def _parse_websocket(url: str, scheme: str, rest: str, *, listen: bool) -> Address:
    """``ws://HOST:PORT/PATH``: the authority as ``tcp://``'s, then an absolute path. A query
    or fragment is refused: a token never travels in a URL, and the proxy serves one path."""
    if "?" in rest or "#" in rest:
        raise AddressError(
            f"{url!r}: a WebSocket address has no query or fragment (a token goes in a file, "
            "never in a URL: see auth in docs/remote.md)"
        )
    authority, slash, path = rest.partition("/")
    try:
        tcp = parse_address(f"tcp://{authority}", listen=listen)
    except AddressError as exc:
        reason = str(exc).partition(": ")[2]
        raise AddressError(f"{url!r}: {reason} (expected {scheme}://HOST:PORT/PATH)") from None
    return Address(scheme, tcp.host, tcp.port, slash + path if slash else "/")  # type: ignore[arg-type]


BROWSER_NEEDS_TCP = "the live view needs a tcp:// address (a browser speaks TCP)"


def parse_endpoint(url: str, *, browser: bool) -> Address:
    """The listening address of an HTTP endpoint (``--metrics``; ``--ui`` with ``browser``): the
    listener syntax or the forms of ``telemetry.endpoint`` (``HOST:PORT``, ``http://HOST:PORT``).
    A page for a browser needs TCP. Raises ``AddressError``."""
    from acp_proxy.telemetry.endpoint import endpoint_url

    address = parse_address(endpoint_url(url), listen=True)
    if address.websocket:
        raise AddressError(f"{url!r}: an HTTP endpoint is served on tcp:// or unix://, not ws://")
    if browser and address.scheme != "tcp":
        raise AddressError(BROWSER_NEEDS_TCP)
    return address


def is_ip_literal(host: str) -> bool:
    """True when ``host`` is an IPv4 or IPv6 address as written (no name to look up)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback_ip(text: str) -> bool:
    """True for 127.0.0.0/8, ::1 and their IPv4-mapped forms; False for anything else."""
    try:
        ip = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback
