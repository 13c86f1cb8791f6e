"""Who may read the live view: the checks every request to the ``--ui`` server passes.

Contract: pure functions from a parsed request head to a refusal (status and reason) or
``None``. The server (``acp_proxy.shell.ui.live_server``) calls ``refusal`` before it reads anything
of a session; nothing is served without it. Four rules, each against a known attack:

- **the token**: an unguessable token (the server draws 32 random bytes) must come with every
  request, in the URL (``?token=``) or an ``Authorization: Bearer`` header; compared in
  constant time. Another user or process of the machine cannot read the session without it.
- **Host**: must name the server as bound (a loopback name or address, or with
  ``--allow-remote`` the bound or an IP address), with its port. A page of another site that
  rebinds its DNS name to 127.0.0.1 sends its own name as ``Host`` (DNS rebinding): refused.
- **Origin**: when present, must be the server's own origin (``http://`` + the Host), and a
  ``Sec-Fetch-Site: cross-site`` request is refused: a page the user visits cannot read the
  stream cross-origin, even with a guessed URL.
- **read-only**: ``GET`` and ``HEAD`` only; the server has nothing that writes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Final

from acp_proxy.base.values import value
from acp_proxy.telemetry.endpoint import Request

LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})


@value
class Refusal:
    status: int
    reason: str


def _host_port(host: str) -> tuple[str, str]:
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1].lower(), host[end + 2 :] if end >= 0 else ""
    name, _, port = host.rpartition(":") if ":" in host else (host, "", "")
    return name.lower(), port


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def host_allowed(host: str | None, port: int, names: Iterable[str], allow_remote: bool) -> bool:
    """Whether ``Host: host`` names this server (``names``: the bound host and loopback names;
    with ``allow_remote`` any IP address too)."""
    if not host:
        return False
    name, host_port = _host_port(host)
    if host_port != str(port):
        return False
    allowed = {n.lower() for n in names} | LOOPBACK_NAMES
    return name in allowed or (allow_remote and _is_ip(name))


def origin_allowed(headers: Mapping[str, str]) -> bool:
    """A same-origin request (or one that says nothing of its origin, like curl)."""
    if headers.get("sec-fetch-site") == "cross-site":
        return False
    origin = headers.get("origin")
    if origin is None:
        return True
    return origin == f"http://{headers.get('host', '')}"


def token_matches(request: Request, token: str) -> bool:
    given = request.query.get("token")
    if given is None:
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
    import hmac  # (here: its ``hashlib`` is not loaded at start-up for a check made later)

    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def refusal(
    request: Request, *, token: str, port: int, names: Iterable[str], allow_remote: bool
) -> Refusal | None:
    """Why ``request`` is refused (see the module docstring), or ``None`` to serve it."""
    if not host_allowed(request.headers.get("host"), port, names, allow_remote):
        return Refusal(421, "this server answers only to its own address as Host")
    if not origin_allowed(request.headers):
        return Refusal(403, "cross-origin requests are refused")
    if request.method not in ("GET", "HEAD"):
        return Refusal(405, "the live view is read-only: GET only")
    if not token_matches(request, token):
        return Refusal(403, "a valid token is required (the URL the proxy printed)")
    return None
