"""``--ui`` and ``acp-proxy ui``: the live view's HTTP server on the proxy's own event loop.

Contract: owns the listener of the live view and what it answers; never writes to a session
(there is no route that could: every request is a ``GET``). Every request passes the checks of
``acp_proxy.ui.security`` first (token, Host, Origin, method). Routes:

- ``/`` the page (one self-contained HTML file shipped in the package);
- ``/events`` the observer stream (Server-Sent Events, ``acp_proxy.ui.events``): a replay of
  what the server holds (``?since=SEQ``, or the ``Last-Event-ID`` a reconnecting EventSource
  sends; ``?since=now``: new events only), then every new event;
- ``/history?since=SEQ`` the same replay as one JSON Lines body (what the page loads first);
- ``/api/sessions`` and ``/api/entities?conn=N`` (the entity panel, ``acp_proxy.ui.entities``);
- ``/export?conn=N&format=record|zed`` a session as a record file or as Zed's "Copy All
  Messages" JSON.

Why Server-Sent Events rather than a WebSocket: the stream is one-way by construction (an
observer cannot send anything on it, so "read-only" needs no enforcement code), it is plain
HTTP that ``curl -N`` reads, EventSource reconnects by itself and resumes from ``Last-Event-ID``,
and there is no framing, masking or upgrade to implement.
"""

from __future__ import annotations

import base64
import errno
import functools
import io
import os
import pkgutil
import signal
import socket
import stat
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final

import anyio
import orjson

from acp_proxy.config.model import UiConfig
from acp_proxy.record.escape import visible
from acp_proxy.record.settings import RecordConfig
from acp_proxy.shell.log.logsetup import get_logger
from acp_proxy.shell.session import hooks
from acp_proxy.shell.sockets import serving
from acp_proxy.shell.sockets.early import LIVE_VIEW, UI_EXPOSURE, Endpoint
from acp_proxy.shell.sockets.streams import SocketStream, close_with
from acp_proxy.shell.streams.transports import STREAM_ERRORS, gone
from acp_proxy.shell.ui import routes
from acp_proxy.shell.ui.hub import DRAIN_SLICE, HubLimits, Observer, UiHub, sse_chunk
from acp_proxy.shell.ui.routes import SECURITY_HEADERS, text
from acp_proxy.telemetry.endpoint import Request, parse_head
from acp_proxy.ui import events, security
from acp_proxy.ui.history import GZIP_HEADER, deflated

if TYPE_CHECKING:
    from acp_proxy.record.format import Redactor

MAX_HEAD: Final = 8 * 1024
HEAD_TIMEOUT_S: Final = 10.0  # a request head must be whole by then
MAX_CLIENTS: Final = 128  # requests and subscriptions (that passed the checks) at once
MAX_HEADS: Final = 128  # connections not yet let in; past it the oldest is closed
KEEPALIVE_S: Final = 15.0  # an SSE comment this often: a dead observer is noticed
FLUSH_INTERVAL_S: Final = 0.05  # an observer is written to at most this often (batches)...
PACE_BELOW: Final = 4  # ... while its backlog is below a quarter of its bound
CUTOFF_SEND_S: Final = 1.0  # how long a cut-off observer gets to read why
SEND_TIMEOUT_S: Final = 30.0  # a write that makes no progress this long ends the observer
BATCH_BYTES: Final = 4 * 1024 * 1024  # an observer is given at most this much per write
CATCH_UP_S: Final = 2.0  # at exit, how long observers may take to receive the last events
IOV_SLICE: Final = 512  # buffers per sendmsg (below IOV_MAX)

RECORDS_EXPOSURE: Final = (
    "anyone who has its URL (with the token) can read the records",
    "pass --allow-remote to serve them there",
)


def page_bytes() -> bytes:
    """The page (package data: ``acp_proxy/ui/page.html``)."""
    page = pkgutil.get_data("acp_proxy.ui", "page.html")
    assert page is not None, "the package's loader reads its data"
    return page


class UiServer:
    """Answers the live view's requests for one hub on bound sockets."""

    def __init__(
        self,
        hub: UiHub,
        *,
        token: str,
        port: int,
        names: Sequence[str],
        allow_remote: bool,
    ) -> None:
        self.hub = hub
        self.token = token
        self.port = port
        self.names = tuple(names)
        self.allow_remote = allow_remote
        self.page = page_bytes()
        self.max_clients = MAX_CLIENTS
        self.max_heads = MAX_HEADS
        self.refused = 0  # requests refused by the checks
        self.evicted = 0  # connections closed unanswered to make room for a newer one
        self.failed = 0  # requests the view failed to answer (logged, answered 500)
        self.cut_off: list[str] = []  # why observers were cut off (the last 100)
        # Connections not yet let in (still sending their head, or being refused), oldest
        # first: past ``max_heads`` the oldest is closed to make room.
        self._waiting: dict[anyio.CancelScope, None] = {}

    async def serve(self, sock: socket.socket) -> None:
        """Accept and answer on ``sock`` (non-blocking, listening) until cancelled.

        A connection holds one of ``max_clients`` slots only once its request passed the
        checks: until then it is one of at most ``max_heads`` waiting connections, the oldest
        of which is closed when a new one comes. Connections that never send a whole request
        (or never one with the token) therefore cannot keep a request with the token waiting."""
        slots = anyio.Semaphore(self.max_clients)

        def start(client: socket.socket) -> Callable[[], Coroutine[Any, Any, None]]:
            while len(self._waiting) >= self.max_heads:
                oldest = next(iter(self._waiting))
                del self._waiting[oldest]
                oldest.cancel()
                self.evicted += 1
            scope = anyio.CancelScope()
            self._waiting[scope] = None
            return functools.partial(self._client, client, slots, scope)

        await serving.serve(sock, start)

    async def _client(
        self, client: socket.socket, slots: anyio.Semaphore, waiting: anyio.CancelScope
    ) -> None:
        """One connection: its head, the checks, then its answer in a slot. Whatever goes wrong
        in answering is logged and answered 500 (or the connection closed, when part of the
        answer went out already): it never reaches the server's task group, nor the session."""
        stream = SocketStream(client)
        request = None
        try:
            with waiting:
                request = await self._admit(stream)
            self._waiting.pop(waiting, None)
            if request is None:
                return
            async with slots:
                await self._answer(stream, request)
        except Exception as exc:  # the view's own failure: the session goes on
            self._failed(request, exc)
            with anyio.move_on_after(CUTOFF_SEND_S):
                await close_with(stream, text(500, "the live view failed to answer this request"))
        finally:
            self._waiting.pop(waiting, None)
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    def _failed(self, request: Request | None, exc: Exception) -> None:
        self.failed += 1
        get_logger().error(
            "the live view failed to answer a request",
            path=request.path if request is not None else None,
            error=f"{type(exc).__name__}: {exc}",
        )

    async def _admit(self, stream: SocketStream) -> Request | None:
        """The request of a connection, once it passed the checks (else refused: ``None``)."""
        head = await serving.read_head(stream, max_bytes=MAX_HEAD, timeout_s=HEAD_TIMEOUT_S)
        request = parse_head(head) if head is not None else None
        if request is None:
            await close_with(stream, text(400, "bad request"))
            return None
        refused = security.refusal(
            request,
            token=self.token,
            port=self.port,
            names=self.names,
            allow_remote=self.allow_remote,
        )
        if refused is not None:
            self.refused += 1
            await close_with(stream, text(refused.status, refused.reason))
            return None
        return request

    async def _answer(self, stream: SocketStream, request: Request) -> None:
        if request.path not in ("/", "/index.html"):
            await self.hub.catch_up()  # what was tapped before the request, described
        if request.path == "/events" and request.method == "GET":
            try:
                await self._events(stream, request)
            except Exception as exc:  # part of the stream went out: the connection just ends
                self._failed(request, exc)
            return
        answer = await self.respond(request)
        if isinstance(answer, bytes):
            if request.method == "HEAD":
                answer = answer.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
            await close_with(stream, answer)
            return
        head, pieces = answer
        try:
            await _send_all(stream, [head])
            if request.method != "HEAD":
                async for piece in pieces:
                    await _send_all(stream, [piece])
        except (TimeoutError, *STREAM_ERRORS):
            return  # the reader went away or stopped reading
        except Exception as exc:  # part of the body went out: the connection just ends
            self._failed(request, exc)
            return
        finally:
            await pieces.aclose()
        await close_with(stream, b"")

    async def respond(self, request: Request) -> routes.Body:
        """The answer to a request that is not a subscription (``acp_proxy.shell.ui.routes``)."""
        return await routes.respond(self.hub, self.page, request)

    async def _stream(
        self, stream: SocketStream, observer: Observer, first: list[bytes | memoryview]
    ) -> None:
        """The head and the replay, then each new batch from the history, until the observer
        is cut off (which cancels this) or goes away. The history's blocks go out with one
        ``sendmsg`` per batch (slices of the shared blocks: no copy per observer)."""
        observer.writing = True
        await _send_all(stream, first)
        observer.writing = False
        hub = self.hub
        keepalive = _KEEPALIVE_GZ if observer.gzip else _KEEPALIVE
        while observer.cut is None:
            if hub.caught_up(observer):
                with anyio.move_on_after(KEEPALIVE_S):
                    await hub.wait_published(observer)
                if observer.cut is not None:
                    return
            chunks = hub.take(observer, BATCH_BYTES) or [keepalive]
            observer.writing = True
            await _send_all(stream, chunks)
            observer.writing = False
            if hub.end - observer.offset < observer.bound // PACE_BELOW:
                # Batch what comes next: one write per interval, however fast events come
                # (what an observer costs the session is then its bytes, not its wake-ups).
                await anyio.sleep(FLUSH_INTERVAL_S)

    async def _events(self, stream: SocketStream, request: Request) -> None:
        hub = self.hub
        since_text = request.query.get("since") or request.headers.get("last-event-id") or "0"
        since = hub.builder.head if since_text == "now" else (routes.parse_int(since_text) or 0)
        observer = hub.subscribe()
        if observer is None:
            await close_with(stream, text(503, f"too many observers ({hub.max_observers})"))
            return
        try:
            # Compressed for a reader that accepts it (a browser): the history's blocks are
            # compressed once for every such observer, a fraction of the bytes to write.
            observer.gzip = gzip = accepts_gzip(request.headers.get("accept-encoding", ""))
            replay, missing = hub.replay(since, gzip)
            encoding = "Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n" if gzip else ""
            head = (
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                f"{SECURITY_HEADERS}{encoding}X-Accel-Buffering: no\r\nConnection: close\r\n\r\n"
            ).encode("latin-1")
            opening = [b"retry: 2000\n\n"]
            opening.append(sse_chunk(None, orjson.dumps(events.hello(hub.mode, hub.builder.head))))
            if missing:
                notice = {"event": "truncated", "lost": missing}
                opening.append(sse_chunk(None, orjson.dumps(notice)))
            first: list[bytes | memoryview] = [head]
            if gzip:
                first += [GZIP_HEADER, deflated(b"".join(opening))]
            else:
                first += opening
            with anyio.CancelScope() as observer.scope:
                await self._stream(stream, observer, [*first, *replay])
            if observer.cut is not None:
                self.cut_off = [*self.cut_off[-99:], observer.cut]
                # Told why, if it reads within CUTOFF_SEND_S; then closed either way.
                notice = {"event": "cutoff", "reason": observer.cut}
                # (after a blank line: a write cut short leaves no half event before it; a
                # compressed one leaves half a segment, after which nothing can be read)
                last = b"\n\n" + sse_chunk(None, orjson.dumps(notice))
                if gzip and not observer.writing:
                    last = deflated(last)
                if not (gzip and observer.writing):
                    with anyio.move_on_after(CUTOFF_SEND_S):
                        await stream.send(last)
        except (TimeoutError, *STREAM_ERRORS):
            pass
        finally:
            hub.unsubscribe(observer)


async def _send_all(stream: SocketStream, chunks: list[bytes | memoryview]) -> None:
    """Write ``chunks`` in order (scatter-gather, at most ``IOV_SLICE`` buffers a call);
    ``TimeoutError`` when the socket takes nothing for ``SEND_TIMEOUT_S``,
    ``anyio.BrokenResourceError`` when the reader is gone."""
    sock = stream.sock
    first = 0  # chunks[:first] are sent
    head: memoryview | None = None  # what is left of chunks[first] after a partial write
    while first < len(chunks):
        buffers: list[bytes | memoryview] = [head if head is not None else chunks[first]]
        buffers += chunks[first + 1 : first + IOV_SLICE]
        try:
            sent = sock.sendmsg(buffers)
        except BlockingIOError:
            with anyio.fail_after(SEND_TIMEOUT_S):
                await anyio.wait_writable(sock)
            continue
        except OSError as exc:  # the reader went away (EPIPE, ECONNRESET)
            raise gone(exc) from exc
        for buffer in buffers:
            if sent < len(buffer):
                head = memoryview(buffer)[sent:]
                break
            sent -= len(buffer)
            first += 1
            head = None
        await anyio.lowlevel.checkpoint()


def accepts_gzip(header: str) -> bool:
    """Whether an ``Accept-Encoding`` value names gzip (without ``q=0``)."""
    for item in header.split(","):
        name, _, params = item.partition(";")
        if name.strip().lower() not in ("gzip", "x-gzip"):
            continue
        for param in params.split(";"):
            key, _, weight = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    return float(weight) > 0
                except ValueError:
                    return False
        return True
    return False


_KEEPALIVE: Final = b": keepalive\n\n"
_KEEPALIVE_GZ: Final = deflated(_KEEPALIVE)


def token_url(host: str, port: int, token: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/?token={token}"


async def _serving(
    url: str, allow_remote: bool, hub: UiHub, *, what: str, exposure: tuple[str, str]
) -> tuple[Any, UiServer] | int:
    """Bind ``url`` and make the server (or the exit code of a refusal)."""
    log = get_logger()
    endpoint = Endpoint(LIVE_VIEW.option, LIVE_VIEW.what, LIVE_VIEW.browser, exposure=exposure)
    listener = await serving.open_endpoint(url, endpoint, allow_remote=allow_remote, log=log)
    if isinstance(listener, int):
        return listener
    # 32 random bytes, URL-safe (``secrets.token_urlsafe``, without loading ``secrets``, whose
    # ``random`` and ``hashlib`` cost the start-up more than the rest of the view).
    token = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode("ascii")
    host = listener.address.host
    names = [host]
    if allow_remote:
        names.append(socket.gethostname())
    server = UiServer(
        hub, token=token, port=listener.address.port, names=names, allow_remote=allow_remote
    )
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    link = token_url(shown_host, listener.address.port, token)
    print(f"acp-proxy: {what} at {link}", file=sys.stderr, flush=True)
    # The token is a password: whole on stderr (the user's copy), never in a log line (a log
    # file outlives the session and may be shared); its first characters tell which it was.
    log.info("serving the live view", url=link.partition("?")[0], token=token[:4] + "…")
    return listener, server


async def run_with_ui(
    settings: UiConfig,
    record: RecordConfig,
    main: Callable[..., Awaitable[int]],
    *args: Any,
) -> int:
    """Serve the live view at ``settings.address`` while ``main(*args)`` runs; returns its
    exit code. The listener is bound before ``main`` starts; a refusal exits before anything
    is spawned. What it shows is redacted by the ``record:`` settings' rules."""
    limits = HubLimits(settings.history_bytes, settings.observer_bytes, settings.max_observers)
    # The redactor is built when the view first describes something (nobody may ever look).
    hub = UiHub(mode="live", redactor=lambda: _redactor(record), limits=limits)
    assert settings.address is not None
    made = await _serving(
        settings.address, settings.allow_remote, hub, what="live view", exposure=UI_EXPOSURE
    )
    if isinstance(made, int):
        return made
    listener, server = made
    hooks.install(hub)
    hooks.install_stderr(hub.agent_stderr)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(hub.run)
            for sock in listener.sockets:
                tg.start_soon(server.serve, sock)
            code = await main(*args)
            while hub.observers and hub.drain(DRAIN_SLICE):  # in slices: the observers take
                await anyio.sleep(0)  # their share between (nobody looks: nothing to describe)
            # The observers get what the session produced (briefly), then the reason they end.
            with anyio.move_on_after(CATCH_UP_S):
                while any(o.cut is None and not hub.caught_up(o) for o in hub.observers):
                    await anyio.sleep(0.01)
            hub.close("the proxy is exiting")
            with anyio.move_on_after(CUTOFF_SEND_S):
                while hub.observers:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    finally:
        hooks.uninstall_stderr(hub.agent_stderr)
        hooks.uninstall(hub)
        listener.close()
    return code


def _redactor(record: RecordConfig) -> Redactor:
    """The redactor of the ``record:`` settings (its module loaded only then)."""
    from acp_proxy.shell.record.recorder import build_redactor

    return build_redactor(record)


def open_record(path: str) -> io.BufferedReader:
    """``path`` opened for reading, when it is a regular file: a FIFO, a device or a
    directory is refused (``OSError``) before it is opened, so that ``acp-proxy ui`` never
    waits for a writer that may not come, nor reads a device without end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, unread
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(
                errno.EINVAL,
                "not a regular file (acp-proxy ui reads record files written by --record; "
                "to look at a session while it runs, use --ui)",
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


async def serve_records(
    paths: Sequence[str], url: str, allow_remote: bool, limits: HubLimits
) -> int:
    """``acp-proxy ui FILE...``: serve the recorded sessions until interrupted."""
    from acp_proxy.record.format import parse_line
    from acp_proxy.shell.record.recordread import EndOfFile, RecordLines, first_header

    hub = UiHub(mode="records", limits=limits)
    for path in paths:
        try:
            with open_record(path) as file:
                lines = RecordLines(file)
                header = first_header(lines)
                if isinstance(header, str):
                    print(f"acp-proxy: {visible(path)}: {header}", file=sys.stderr)
                    return 2
                conn = hub.open_session(dict(header))
                while not isinstance(raw := lines.read(), EndOfFile):
                    line = parse_line(raw) if raw is not None else None
                    if line is not None:
                        hub.add_line(conn, line)
        except OSError as exc:
            print(f"acp-proxy: {visible(path)}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    made = await _serving(
        url, allow_remote, hub, what=f"{len(paths)} record(s)", exposure=RECORDS_EXPOSURE
    )
    if isinstance(made, int):
        return made
    listener, server = made
    try:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:
                for sock in listener.sockets:
                    tg.start_soon(server.serve, sock)
                async for _ in signals:
                    break
                hub.close("the server is exiting")
                with anyio.move_on_after(CUTOFF_SEND_S):
                    while hub.observers:
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
    finally:
        listener.close()
    return 0
