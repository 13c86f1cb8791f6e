"""The metrics and health endpoints: a tiny HTTP/1.1 responder on the proxy's loop.

Contract: owns the ``--metrics`` listener and what it answers: ``GET /metrics`` (the Prometheus
text format, rendered by ``prometheus_client`` from ``telemetry.metrics.Metrics``), ``/healthz``
(200 while the proxy runs) and ``/readyz`` (200 once the agent answered ``initialize``; with
``--listen``, while the listener accepts). It never touches a session's streams: sessions report
through ``shell.session.hooks``, and the scrape reads counters and live sessions' sizes.

Why a responder of our own on the event loop rather than ``prometheus_client``'s
``start_http_server``: that server is a thread per scrape that reads the counters while the loop
writes them (our counters are lock-free dicts, safe only on the loop's thread); it binds any
address it is given (our loopback rule would have to be checked beside it), and it starts a
thread at start-up. Three GET paths need 100 lines: bind through ``open_listener`` (same URL
syntax, loopback rule and Unix socket handling as ``--listen``), read the request line
(``shell.sockets.serving``, as the live view does; bounded: 8 KiB, ``HEAD_TIMEOUT_S``), answer,
close. A slow scraper holds one task, never a session, and never a probe's turn: accepting
never waits, and beyond ``MAX_CONNECTIONS`` the oldest connection is closed.
"""

from __future__ import annotations

import functools
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio

from acp_proxy import __version__
from acp_proxy.shell.log.logsetup import get_logger
from acp_proxy.shell.session import hooks
from acp_proxy.shell.sockets import serving
from acp_proxy.shell.sockets.early import METRICS
from acp_proxy.shell.sockets.streams import SocketStream, close_with
from acp_proxy.telemetry.endpoint import parse_head
from acp_proxy.telemetry.metrics import Metrics, SessionMetrics

MAX_HEAD = 8 * 1024  # a scraper's request head is a few hundred bytes
HEAD_TIMEOUT_S = 5.0  # a connection's whole request head must arrive within this
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
# Connections open at once (each holds at most MAX_HEAD bytes); beyond it, the oldest one is
# closed to make room: a probe or a scrape is answered as soon as its request line is in, so
# the oldest is one that is slow to send its request or to read its answer.
MAX_CONNECTIONS = 256


class Telemetry:
    """The ``ProcessObserver`` behind ``--metrics``: feeds ``Metrics`` and renders it."""

    def __init__(self, metrics: Metrics) -> None:
        from prometheus_client import CollectorRegistry, ProcessCollector
        from prometheus_client.core import GaugeMetricFamily

        self.metrics = metrics
        self._open = 0  # connections accepted and not closed yet
        # Open connections, oldest first (the first to drop at the cap).
        self._conns: OrderedDict[int, anyio.CancelScope] = OrderedDict()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(metrics)
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds...: what
        # every Prometheus target is expected to export (read from /proc at scrape time).
        ProcessCollector(registry=self.registry)

        class _Build:
            def collect(self) -> Any:
                info = GaugeMetricFamily(
                    "acp_proxy_build_info", "The running version (always 1).", labels=["version"]
                )
                info.add_metric([__version__], 1)
                yield info

        self.registry.register(_Build())

    # -- hooks.ProcessObserver ------------------------------------------------------------------

    def session_observer(self, session: Any) -> SessionMetrics:
        return self.metrics.session(session)

    def agent_exited(self, returncode: int) -> None:
        self.metrics.agent_exited(returncode)

    def listening(self, accepting: bool) -> None:
        if not self.metrics.ready_on_initialize:
            self.metrics.ready = accepting

    def detach_event(self, event: str, replayed: int) -> None:
        self.metrics.detach_event(event, replayed)

    # -- HTTP ------------------------------------------------------------------------------------

    def respond(self, method: str, path: str) -> tuple[str, str, bytes]:
        """(status line text, content type, body) for one request (``path`` without its query)."""
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain; charset=utf-8", b"GET only\n"
        if path == "/metrics":
            from prometheus_client.exposition import generate_latest

            # The classic text format: what every Prometheus version and scraper reads.
            return "200 OK", TEXT_FORMAT, generate_latest(self.registry)
        if path == "/healthz":
            return "200 OK", "text/plain; charset=utf-8", b"ok\n"
        if path == "/readyz":
            if self.metrics.ready:
                return "200 OK", "text/plain; charset=utf-8", b"ready\n"
            why = (
                b"not ready: the agent has not answered initialize\n"
                if self.metrics.ready_on_initialize
                else b"not ready: not accepting connections\n"
            )
            return "503 Service Unavailable", "text/plain; charset=utf-8", why
        return "404 Not Found", "text/plain; charset=utf-8", b"/metrics, /healthz, /readyz\n"

    async def _client(self, client: socket.socket, scope: anyio.CancelScope) -> None:
        stream = SocketStream(client)
        try:
            with scope:
                # Answered as soon as the request line is in (a probe never waits for the rest
                # of a slow head); the rest is not needed for three GET paths.
                head = await serving.read_head(
                    stream, max_bytes=MAX_HEAD, timeout_s=HEAD_TIMEOUT_S, line_only=True
                )
                request = parse_head(head) if head is not None else None
                if request is not None:
                    method = request.method
                    status, ctype, body = self.respond(method, request.path)
                else:
                    method = "GET"
                    status, ctype, body = "400 Bad Request", "text/plain", b"bad request\n"
                response = (
                    f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                ).encode("latin-1")
                with anyio.move_on_after(HEAD_TIMEOUT_S):
                    await close_with(stream, response if method == "HEAD" else response + body)
        finally:
            self._conns.pop(id(scope), None)
            self._open -= 1
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    def _make_room(self) -> bool:
        """At the cap: close the oldest open connection (one that is slow to send its head or
        to take its answer: an answer is written at once). False if there is none."""
        if self._open < MAX_CONNECTIONS:
            return True
        if not self._conns:
            return False
        _, oldest = self._conns.popitem(last=False)
        oldest.cancel()
        return True

    async def serve(self, sock: socket.socket) -> None:
        """Accept and answer on ``sock`` (non-blocking, listening) until cancelled. Never
        waits for a slot: a new connection (a probe) always gets in (see ``MAX_CONNECTIONS``)."""

        def start(client: socket.socket) -> Callable[[], Coroutine[Any, Any, None]] | None:
            if not self._make_room():
                return None  # every open connection is being answered: closed, try again
            scope = anyio.CancelScope()
            self._conns[id(scope)] = scope
            self._open += 1
            return functools.partial(self._client, client, scope)

        await serving.serve(sock, start)


async def run_with_metrics(
    url: str,
    allow_remote: bool,
    ready_on_initialize: bool,
    max_pending: int,
    main: Callable[..., Awaitable[int]],
    *args: Any,
) -> int:
    """Serve the endpoints on ``url`` while ``main(*args)`` runs; returns its exit code.

    The listener is bound before ``main`` starts (a probe never sees a half-started proxy);
    when it cannot be bound the proxy exits 1 (2 for a non-loopback address without
    ``allow_remote``) before spawning anything.
    """
    log = get_logger()
    listener = await serving.open_endpoint(url, METRICS, allow_remote=allow_remote, log=log)
    if isinstance(listener, int):
        return listener
    telemetry = Telemetry(Metrics(max_pending=max_pending, ready_on_initialize=ready_on_initialize))
    log.info(
        "serving metrics",
        address=str(listener.address),
        paths=["/metrics", "/healthz", "/readyz"],
    )
    hooks.install(telemetry)
    try:
        async with anyio.create_task_group() as tg:
            for sock in listener.sockets:
                tg.start_soon(telemetry.serve, sock)
            code = await main(*args)
            tg.cancel_scope.cancel()
    finally:
        hooks.uninstall(telemetry)
        listener.close()
    return code
