"""``--connect ws://`` / ``wss://``: the upgrade of a connection to a remote agent.

Contract: owns the client's half of the WebSocket opening over a connected socket: TLS for
``wss://`` (the system's authorities or ``tls.ca``, the host name checked), the upgrade request
with ``Authorization: Bearer TOKEN`` when ``auth:`` gives a token (a file or an environment
variable, never the command line or the URL), the 101 within the connect timeout, then the
connection as a ``websocket.WsStream``. A refusal raises ``UpgradeRefused`` with the server's
status and reason; the token is never in a message. Connecting the socket itself (retries,
timeout) is ``connect.connect``'s.
"""

from __future__ import annotations

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream
from websockets.client import ClientProtocol
from websockets.http11 import Response
from websockets.uri import parse_uri

from acp_proxy.config import Config
from acp_proxy.shell.sockets.address import Address
from acp_proxy.shell.ws.websocket import (
    SILENT,
    WEBSOCKET_ERRORS,
    TokenError,
    WsStream,
    client_tls,
    close_transport,
    load_token,
    send_all,
)


class UpgradeRefused(Exception):
    """The agent's address did not open a WebSocket (refused, TLS failed, no answer)."""


async def upgrade(
    stream: anyio.abc.ByteStream, address: Address, config: Config, timeout_s: float
) -> WsStream:
    """Open the WebSocket of ``address`` over the connected ``stream``. Raises
    ``UpgradeRefused`` (the stream closed)."""
    try:
        token = load_token(config)
        context = client_tls(config) if address.scheme == "wss" else None
    except (TokenError, ValueError) as exc:
        await close_transport(stream)
        raise UpgradeRefused(str(exc)) from None
    transport = stream
    protocol = ClientProtocol(
        parse_uri(str(address)), max_size=config.max_frame_bytes, logger=SILENT
    )
    events: list[object] = []
    try:
        with anyio.fail_after(timeout_s):
            if context is not None:
                transport = await TLSStream.wrap(
                    stream, hostname=address.host, ssl_context=context, standard_compatible=False
                )
            request = protocol.connect()
            if token is not None:
                request.headers["Authorization"] = f"Bearer {token}"
            protocol.send_request(request)
            await send_all(transport, protocol.data_to_send())
            while not events:
                try:
                    data = await transport.receive()
                except anyio.EndOfStream:
                    protocol.receive_eof()
                    break
                protocol.receive_data(data)
                events = list(protocol.events_received())
    except TimeoutError:
        await close_transport(transport)
        raise UpgradeRefused(f"no WebSocket upgrade within {timeout_s:g} s") from None
    except WEBSOCKET_ERRORS as exc:
        await close_transport(transport)
        raise UpgradeRefused(f"the WebSocket opening failed: {exc}") from None
    response = events[0] if events else None
    if not isinstance(response, Response) or response.status_code != 101:
        await close_transport(transport)
        if isinstance(response, Response):
            body = (response.body or b"").decode("utf-8", "replace").strip()
            raise UpgradeRefused(
                f"the server refused the WebSocket upgrade: {response.status_code} "
                f"{response.reason_phrase}" + (f" ({body})" if body else "")
            )
        raise UpgradeRefused("the server closed the connection without an upgrade")
    if protocol.handshake_exc is not None:
        await close_transport(transport)
        raise UpgradeRefused(f"the WebSocket upgrade is not valid: {protocol.handshake_exc}")
    ws = WsStream(transport, protocol, ping_s=config.ws_ping_interval_s)
    ws.absorb(events[1:])
    return ws
