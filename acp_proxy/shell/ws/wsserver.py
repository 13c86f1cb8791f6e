"""``--listen ws://`` / ``wss://``: each accepted connection's upgrade, after its checks.

Contract: owns what a WebSocket listener needs beyond the ``--listen`` server: its settings,
read once before it binds (``websocket_server``: the token, the TLS context, the consent a
non-loopback address needs), and the upgrade of one accepted connection (``WsServer.upgrade``:
TLS, the request head bounded in size and time, the checks, then the 101 or a refusal). No
session starts, and the agent is never sent a byte, before a request passed every check:

* a URL with a query: 401 (a token in a URL ends up in histories and logs: refused, never read);
* not ``GET``: 405; not the listener's path: 404;
* ``Host`` must name the server (``ui.security.host_allowed``, as the live view: a loopback name
  or the bound host; on a non-loopback listener also the machine's names and any IP), else 421;
* ``Origin``, when present, must be the server's own (``http(s)://`` + Host) and the request not
  ``Sec-Fetch-Site: cross-site``, else 403 (a web page cannot drive the agent);
* with a token: ``Authorization: Bearer TOKEN``, compared in constant time, else 401 with
  ``WWW-Authenticate: Bearer``;
* a request that is not a valid upgrade: 400 or 426 (``websockets``' own checks).

The rule of the address: a non-loopback listener needs ``auth:`` (it refuses to start without
it), and a plain ``ws://`` one also ``allow_remote`` (the token would cross the network
unencrypted unless TLS ends in front of the proxy). The token is never logged.
"""

from __future__ import annotations

import hmac
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio.abc
from anyio.streams.tls import TLSStream
from websockets.http11 import Request as WsRequest
from websockets.server import ServerProtocol

from acp_proxy.config import Config
from acp_proxy.shell.sockets.address import Address, is_loopback_ip
from acp_proxy.shell.sockets.serving import read_head
from acp_proxy.shell.ws.websocket import (
    MAX_HEAD,
    SILENT,
    WEBSOCKET_ERRORS,
    TokenError,
    WsStream,
    close_transport,
    load_token,
    send_all,
    server_tls,
    token_file_exposed,
)
from acp_proxy.shell.ws.wsconfig import jwt_problem, listen_consent
from acp_proxy.telemetry.endpoint import Request, parse_head
from acp_proxy.ui.security import host_allowed

if TYPE_CHECKING:
    from acp_proxy.shell.ws.wsjwt import JwtVerifier


@dataclass(slots=True)
class WsServer:
    """A WebSocket listener's settings (``websocket_server``); ``bind`` fills in where it
    listens once the socket is bound."""

    address: Address
    token: str | None
    tls: ssl.SSLContext | None
    max_bytes: int
    timeout_s: float
    consent: bool  # may bind a non-loopback address
    exposure: tuple[str, str]  # what a refusal to bind says
    jwt: JwtVerifier | None = None
    ping_s: float = 0.0  # ``ws_ping_interval``
    remote: bool = False
    port: int = 0
    names: list[str] = field(default_factory=list)

    def bind(self, sockets: list[socket.socket]) -> None:
        host, port = sockets[0].getsockname()[:2]
        self.port = port
        self.remote = any(not is_loopback_ip(s.getsockname()[0]) for s in sockets)
        self.names = [self.address.host, str(host)]
        if self.remote:
            self.names += [socket.gethostname(), socket.getfqdn()]

    @property
    def remote_note(self) -> str:
        if self.tls is not None:
            return "clients must present the bearer token, over TLS"
        return "clients must present the bearer token; ws:// is unencrypted (TLS must end in front)"

    @property
    def url(self) -> str:
        return str(Address(self.address.scheme, self.address.host, self.port, self.address.path))

    def busy(self, limit: int) -> bytes:
        """What a connection over ``max_connections`` is sent at accept: a 503 on ``ws://``;
        nothing on ``wss://`` (no TLS handshake is spent on it: it is closed)."""
        if self.tls is not None:
            return b""
        return _text(503, f"too many connections (max_connections {limit}); try again later")

    def refusal(self, request: Request) -> tuple[int, str] | None:
        """Why ``request`` is refused (the module's checks, in order), or ``None``."""
        return self.checked(request)[0]

    def checked(self, request: Request) -> tuple[tuple[int, str] | None, str | None]:
        """Why ``request`` is refused (or ``None``), and the principal its token names."""
        why = self._refusal(request)
        if why is not None or (self.token is None and self.jwt is None):
            return why, None
        bad, principal = self.bearer(request.headers)
        if bad is not None:
            return (
                401,
                f"a valid bearer token is required in the Authorization header ({bad})",
            ), None
        return None, principal

    def _refusal(self, request: Request) -> tuple[int, str] | None:
        if request.query:
            return 401, "a token goes in the Authorization header, never in the URL"
        if request.method != "GET":
            return 405, "a WebSocket upgrade is a GET"
        if request.path != self.address.path:
            return 404, f"this server serves ACP at {self.address.path}"
        headers = request.headers
        if not host_allowed(headers.get("host"), self.port, self.names, self.remote):
            return 421, "this server answers only to its own address as Host"
        if not origin_allowed(headers, secure=self.tls is not None):
            return 403, "cross-origin requests are refused"
        return None

    def bearer(self, headers: Mapping[str, str]) -> tuple[str | None, str | None]:
        """Why the request's bearer token is not accepted (the shared token, or a JWT), or
        ``None``, never the token itself; and the principal it names (a JWT's issuer and
        subject; ``None`` for the shared token, whose holders are one principal)."""
        auth = headers.get("authorization", "")
        if auth[:7].lower() != "bearer ":
            return "none given", None
        given = auth[7:].strip()
        if self.token is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            return None, None
        if self.jwt is not None:
            return self.jwt.check(given)
        return "not the token", None

    async def upgrade(
        self, stream: anyio.abc.ByteStream, peer: str, log: Any
    ) -> tuple[WsStream | None, str]:
        """The connection upgraded (``(stream, "")``), or refused and closed (``(None, why)``);
        bounded by the handshake timeout from TLS to the 101."""
        transport = stream
        deadline = anyio.current_time() + self.timeout_s
        if self.tls is not None:
            with anyio.move_on_after(self.timeout_s):
                try:
                    transport = await TLSStream.wrap(
                        stream, server_side=True, ssl_context=self.tls, standard_compatible=False
                    )
                except WEBSOCKET_ERRORS as exc:
                    log.warning("TLS handshake failed", peer=peer, error=str(exc))
                    await close_transport(stream)
                    return None, "TLS handshake failed"
            if transport is stream:
                await close_transport(stream)
                return None, f"handshake timeout: no TLS handshake within {self.timeout_s:g} s"
        left = max(deadline - anyio.current_time(), 0.0)
        head = await read_head(transport, max_bytes=MAX_HEAD, timeout_s=left)
        if head is None:
            return await self._refuse(
                transport, 431, "the request head is too large", peer=peer, log=log
            )
        if not head.endswith((b"\r\n\r\n", b"\n\n")):  # silent or slow until the bound, or gone
            timed_out = anyio.current_time() >= deadline
            if head:
                log.warning("handshake timeout: no whole upgrade request", peer=peer)
                await close_transport(transport, _text(400, "no whole request in time"))
            else:
                await close_transport(transport)
            if timed_out:
                return None, f"handshake timeout: no upgrade within {self.timeout_s:g} s"
            return None, "client closed the connection before a request"
        request = parse_head(head)
        if request is None:
            return await self._refuse(transport, 400, "not an HTTP request", peer=peer, log=log)
        why, principal = self.checked(request)
        if why is not None:
            return await self._refuse(transport, *why, peer=peer, log=log, path=request.path)
        protocol = ServerProtocol(max_size=self.max_bytes, logger=SILENT)
        protocol.receive_data(head)
        events = protocol.events_received()
        if not events or not isinstance(events[0], WsRequest):
            return await self._refuse(
                transport, 400, "not a valid upgrade request", peer=peer, log=log
            )
        response = protocol.accept(events[0])
        protocol.send_response(response)
        if response.status_code != 101:
            reason = (response.body or b"").decode("utf-8", "replace").strip()
            log.warning(
                "WebSocket upgrade refused", peer=peer, status=response.status_code, reason=reason
            )
            await close_transport(transport, b"".join(protocol.data_to_send()))
            return None, f"refused: {response.status_code} {reason}"
        try:
            await send_all(transport, protocol.data_to_send())
        except WEBSOCKET_ERRORS:
            await close_transport(transport)
            return None, "client connection lost during the upgrade"
        upgraded = WsStream(transport, protocol, ping_s=self.ping_s)
        upgraded.principal = principal
        if principal is not None:
            log.info("WebSocket client authenticated", principal=principal)
        return upgraded, ""

    async def _refuse(
        self,
        transport: anyio.abc.ByteStream,
        status: int,
        reason: str,
        *,
        peer: str,
        log: Any,
        path: str | None = None,
    ) -> tuple[None, str]:
        log.warning("WebSocket upgrade refused", peer=peer, status=status, reason=reason, path=path)
        await close_transport(transport, _text(status, reason))
        return None, f"refused: {status} {reason}"


def _text(status: int, reason: str) -> bytes:
    """A plain-text refusal (``ServerProtocol.reject``'s form); a 401 says the scheme."""
    protocol = ServerProtocol(logger=SILENT)
    response = protocol.reject(status, reason + "\n")
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="acp-proxy"'
    protocol.send_response(response)
    return b"".join(protocol.data_to_send())


def origin_allowed(headers: Mapping[str, str], *, secure: bool) -> bool:
    """A same-origin request (or one that says nothing of its origin, like a non-browser
    client); never a ``Sec-Fetch-Site: cross-site`` one."""
    if headers.get("sec-fetch-site") == "cross-site":
        return False
    origin = headers.get("origin")
    scheme = "https" if secure else "http"
    return origin is None or origin == f"{scheme}://{headers.get('host', '')}"


def websocket_server(config: Config, address: Address, log: Any) -> WsServer:
    """A WebSocket listener's settings from ``config``. Raises ``ValueError`` with the reason
    it cannot serve (a token or a certificate that cannot be read)."""
    try:
        token = load_token(config)
    except TokenError as exc:
        raise ValueError(str(exc)) from None
    if token_file_exposed(config):
        log.warning(
            "the token file can be read by other users; make it private (chmod 600)",
            token_file=config.auth.token_file,
        )
    tls = server_tls(config) if address.scheme == "wss" else None
    problem = jwt_problem(config)
    if problem is not None:
        raise ValueError(problem)
    verifier = None
    auth = config.auth
    if auth.jwks_file is not None and auth.jwt_issuer and auth.jwt_audience:
        from acp_proxy.shell.ws.wsjwt import JwtVerifier

        verifier = JwtVerifier(auth.jwks_file, auth.jwt_issuer, auth.jwt_audience)
    consent, exposure = listen_consent(config, address.scheme)
    return WsServer(
        address,
        token,
        tls,
        max_bytes=config.max_frame_bytes,
        timeout_s=config.handshake_timeout_s,
        consent=consent,
        exposure=exposure,
        jwt=verifier,
        ping_s=config.ws_ping_interval_s,
    )
