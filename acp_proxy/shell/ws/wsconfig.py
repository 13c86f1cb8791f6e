"""What a WebSocket address needs from the config, judged without ``websockets`` loaded.

Contract: owns the rule of a WebSocket listener's address (``listen_consent``: a non-loopback
one needs ``auth:``, a plain ``ws://`` one also ``allow_remote``), the message when the library
is not installed, and check-config's refusals of a file's WebSocket settings
(``websocket_checks``: the same rule, and the token, certificate and key files readable), so
that a file check-config accepts also starts. Reads files' metadata, never a token's content
into a message.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Callable

from acp_proxy.config import Config
from acp_proxy.shell.sockets.address import Address, AddressError, is_loopback_ip, parse_address

MISSING = (
    "ws:// and wss:// addresses need the websockets library (the remote extra): "
    "pip install 'acp-proxy[remote]'"
)
NO_AUTH = (
    "no auth is configured: anyone who can reach it could drive the agent",
    "set auth: {token_file: FILE} in the config (docs/remote.md)",
)
CLEAR_TEXT = (
    "ws:// is unencrypted: the bearer token would cross the network readable",
    "use wss:// with tls: {cert: FILE, key: FILE}, or pass --allow-remote (allow_remote: true) "
    "when TLS ends in front of the proxy",
)
TOKEN_HOLDERS = ("anyone who has the token can drive the agent", "")


def available() -> bool:
    return importlib.util.find_spec("websockets") is not None


def has_auth(config: Config) -> bool:
    auth = config.auth
    return any(v is not None for v in (auth.token_file, auth.token_env, auth.jwks_file))


def jwt_problem(config: Config) -> str | None:
    """What the JWT settings lack, or ``None``."""
    auth = config.auth
    given = [auth.jwks_file, auth.jwt_issuer, auth.jwt_audience]
    if all(v is None for v in given):
        return None
    if any(v is None for v in given):
        return "JWTs need auth.jwks_file, auth.jwt_issuer and auth.jwt_audience together"
    if importlib.util.find_spec("jwt") is None:
        return "auth.jwks_file needs PyJWT (the jwt extra): pip install 'acp-proxy[jwt]'"
    return None


def listen_consent(config: Config, scheme: str) -> tuple[bool, tuple[str, str]]:
    """Whether a ``scheme`` (``ws``/``wss``) listener may bind a non-loopback address, and what
    the refusal says when it may not."""
    if not has_auth(config):
        return False, NO_AUTH
    if scheme == "ws" and not config.allow_remote:
        return False, CLEAR_TEXT
    return True, TOKEN_HOLDERS


def websocket_checks(config: Config, where: Callable[[str], str]) -> list[str]:
    """check-config's refusals of the WebSocket settings (``FILE:LINE: KEY: REASON``)."""
    problems: list[str] = []
    addresses: dict[str, Address] = {}
    for key, listening in (("listen", True), ("connect", False)):
        url = getattr(config, key)
        try:
            address = parse_address(url, listen=listening) if url else None
        except AddressError:
            continue  # said by the address checks
        if address is not None and address.websocket:
            addresses[key] = address
    if not addresses:
        return problems
    if not available():
        problems.append(f"{where(next(iter(addresses)))}: {MISSING}")
    files = [("auth", config.auth.token_file), ("auth", config.auth.jwks_file)]
    problem = jwt_problem(config)
    if problem is not None and "listen" in addresses:
        problems.append(f"{where('auth')}: {problem}")
    env = config.auth.token_env
    if env is not None and config.auth.token_file is None and not os.environ.get(env, "").strip():
        problems.append(
            f"{where('auth')}: the variable {config.auth.token_env} (auth.token_env) is not "
            "set or empty"
        )
    listen = addresses.get("listen")
    if listen is not None and listen.scheme == "wss":
        if config.tls.cert is None or config.tls.key is None:
            problems.append(
                f"{where('listen')}: a wss:// listener needs tls: {{cert: FILE, key: FILE}}"
            )
        files += [("tls", config.tls.cert), ("tls", config.tls.key)]
    connect = addresses.get("connect")
    if connect is not None and connect.scheme == "wss":
        files.append(("tls", config.tls.ca))
    for key, path in files:
        if path is not None and not os.access(path, os.R_OK):
            problems.append(f"{where(key)}: cannot read {path}")
    if listen is not None:
        consent, exposure = listen_consent(config, listen.scheme)
        if not consent:
            try:  # the listener's own lookup
                infos = socket.getaddrinfo(
                    listen.host, listen.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
                )
            except OSError as exc:
                problems.append(f"{where('listen')}: cannot resolve {listen.host}: {exc}")
                return problems
            remote = list(dict.fromkeys(str(i[4][0]) for i in infos))
            remote = [ip for ip in remote if not is_loopback_ip(ip)]
            if remote:
                problems.append(
                    f"{where('listen')}: {', '.join(remote)} is not a loopback address "
                    f"({exposure[0]}); the proxy refuses to listen there: {exposure[1]}"
                )
    return problems
