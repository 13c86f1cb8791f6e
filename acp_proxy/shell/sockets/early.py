"""HTTP endpoints bound before the event loop, so that the agent can start early with them.

Contract: owns the proxy's HTTP endpoints (``Endpoint``: ``--metrics``, ``--ui``) and their
binding by URL, with the refusals said the same way wherever it happens (``bind_endpoint``):
"--OPTION: ..." for an address that is not one (exit 2), the fatal "cannot serve WHAT" for one
that cannot be bound. At start-up, before anyio is imported, ``bind_early`` binds an endpoint
whose address needs no lookup (an IP literal, a Unix path) and keeps its listener for the server
that serves it, which takes it once (``take_early``); an address that needs a lookup is bound
later, in the event loop, as before. A listener nobody took is closed at exit (its Unix socket
file removed). Never imports anyio: the agent's early start (``shell.agent.spawn``) comes after
this and before the event loop.
"""

from __future__ import annotations

import atexit
import sys
from typing import Any, Final

from acp_proxy.base.values import value
from acp_proxy.shell.log.logsetup import say_fatal
from acp_proxy.shell.sockets.address import Address, AddressError, parse_endpoint
from acp_proxy.shell.sockets.listening import Listener, ListenError, listen_now


@value
class Endpoint:
    """An HTTP endpoint of the proxy: its option (``metrics``: ``--metrics URL``), what it
    serves (for "cannot serve WHAT"), whether its address is a browser's (TCP only), and what a
    non-loopback address exposes, with its own consent."""

    option: str
    what: str
    browser: bool
    exposure: tuple[str, str]


# What a non-loopback metrics port exposes, and its own consent (not --allow-remote's).
METRICS_EXPOSURE: Final = (
    "anyone who can reach it can read the metrics and the health of the proxy",
    "pass --metrics-allow-remote (metrics_allow_remote: true in the config) to serve it there",
)
METRICS: Final = Endpoint("metrics", "metrics", browser=False, exposure=METRICS_EXPOSURE)
# What a non-loopback live view exposes, and its own consent (refusal's advice).
UI_EXPOSURE: Final = (
    "anyone who has its URL (with the token) can read the session",
    "pass --ui-allow-remote (ui.allow_remote: true in the config) to serve it there",
)
LIVE_VIEW: Final = Endpoint("ui", "the live view", browser=True, exposure=UI_EXPOSURE)

# Listeners bound at start-up, by (option, URL), until their server takes them: at most one per
# endpoint (two), each closed at exit if never taken.
_EARLY: dict[tuple[str, str], Listener] = {}


def endpoint_address(url: str, endpoint: Endpoint) -> Address | int:
    """The address of ``endpoint`` at ``url``, or 2 when it is not one (said on stderr)."""
    try:
        return parse_endpoint(url, browser=endpoint.browser)
    except AddressError as exc:
        print(f"acp-proxy: --{endpoint.option}: {exc}", file=sys.stderr)
        return 2


def refused(endpoint: Endpoint, exc: ListenError, log: Any) -> int:
    """Say that ``endpoint`` cannot be served (``exc``: why) and return the exit code."""
    say_fatal(log, f"cannot serve {endpoint.what}", f"--{endpoint.option}: {exc}")
    return exc.exit_code


def bind_early(url: str, endpoint: Endpoint, *, allow_remote: bool, log: Any) -> int | None:
    """Bind ``endpoint`` at ``url`` now if no lookup is needed, kept for ``take_early``: the
    exit code of a refusal, else None (bound, or left for the event loop)."""
    address = endpoint_address(url, endpoint)
    if isinstance(address, int):
        return address
    try:
        listener = listen_now(
            address, allow_remote=allow_remote, log=log, exposure=endpoint.exposure
        )
    except ListenError as exc:
        return refused(endpoint, exc, log)
    if listener is not None:
        if not _EARLY:
            atexit.register(_close_untaken)
        _EARLY[(endpoint.option, url)] = listener
    return None


def bound_early(endpoint: Endpoint, url: str) -> bool:
    """Whether ``endpoint`` at ``url`` was bound at start-up and not taken yet."""
    return (endpoint.option, url) in _EARLY


def take_early(endpoint: Endpoint, url: str) -> Listener | None:
    """The listener ``bind_early`` bound for ``endpoint`` at ``url``, once; else None."""
    return _EARLY.pop((endpoint.option, url), None)


def _close_untaken() -> None:
    for listener in _EARLY.values():
        listener.close()
    _EARLY.clear()
