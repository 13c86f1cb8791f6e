"""The middleware chain: the interface every middleware implements and how a message passes it.

Contract: this module owns the middleware interface (what a middleware receives, what it may
return) and the fold of an ordered list of middleware into one chain. It never does I/O and never
logs: a middleware that raises becomes a ``MiddlewareFailure`` value in the outcome, and the shell
decides how to report it (style.md, habits 1 and 3; mitmproxy's isolated addons).

Writing a middleware (see docs/middleware.md)::

    class Tag(BaseMiddleware):
        needles = (b'"session/update"',)       # optional byte prefilter, see below

        def __init__(self, value: str = "x") -> None:   # `with:` from the YAML file
            self.value = value

        def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
            if message.get("method") != "session/update":
                return FORWARD
            params = dict(message["params"]); params["_meta"] = {"example.dev/tag": self.value}
            return Replace((dict(message, params=params),))

Rules of the interface:

* A middleware receives one JSON-RPC message (never a batch: batches are split entry by entry by
  the pipeline and reassembled in order) and a ``MessageContext``. It must not mutate
  ``message``: build new dicts for what it changes (values, not mutation).
* It returns a ``Verdict``: ``FORWARD`` (unchanged; the original bytes leave the proxy),
  ``Replace(messages)`` (send these instead: the first takes the original's place, inside its batch
  if it was in one; the others follow as separate frames right after, never wrapped into a batch
  the sender did not send; ``Replace(messages, replies=...)`` also sends ``replies`` back to the
  sender), ``Drop(reason)``, or ``Reply(message)`` (answer the sender instead of
  forwarding, e.g. a JSON-RPC error response).
* ``needles`` (optional): byte strings of which at least one must occur in the raw frame for the
  middleware to be called. ``None`` (the default) means "call me for every message". It lets the
  proxy skip parsing frames no middleware can need. Frames containing a JSON escape that could
  hide a needle (``\\u``, and ``\\/`` when a needle contains ``/``) are always parsed.
* A verdict names the middleware's parts that acted: ``Replace(..., by=("edge-route",))`` (the
  rules middleware names the rules that changed the message; the chain then reports
  ``"NAME:PART"`` instead of ``NAME`` in ``Outcome.changed_by``, for the debug log), and
  ``Forward(skipped=...)`` / ``Replace(..., skipped=...)`` the parts that matched but chose not
  to act (``Outcome.skipped``).
* ``on_initialize`` (optional): a method called with the ``initialize`` response, which the
  chain itself never sees (it runs once that response fixed the version); it must not raise.
* ``concerns`` (optional): a ``Concerns`` value saying which requests the middleware acts on,
  by their method: the pipeline, which parses every request anyway to track it, hands it those
  (whatever its needles say) and no other request, so its ``needles`` are only for the
  notifications it reads; and which client requests' responses it must be told of
  (``on_answer(method, response)``, called as the response passes; it must not raise). A
  middleware that declares ``concerns`` never changes a notification (it may answer its
  sender, ``Forward(replies=...)``), so the fused annotation path stays on beside it.
* ``marks`` (optional): a list the middleware appends values to while it handles a message
  (the policy: its decisions); the chain takes them into ``Outcome.marks`` after each call, for
  the observers (metrics, the live view), who read them when ``ctx.observed``.
* ``on_initialize_request`` (optional): the same for the client's ``initialize`` request.
* ``Ticking`` (optional base): ``on_tick()``, called about once a second while the session runs,
  gives messages toward the agent and toward the client that fall due with time.
* Instances are created per connection, so a middleware may keep per-connection state.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import Field
from typing import Any, ClassVar, Protocol, TypeAlias, runtime_checkable

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.base.values import value
from acp_proxy.wire.errors import INTERNAL_ERROR, error_object


class Direction(enum.StrEnum):
    """Which way a message travels through the proxy."""

    AGENT_TO_CLIENT = "agent_to_client"
    CLIENT_TO_AGENT = "client_to_agent"

    @property
    def reverse(self) -> Direction:
        """The opposite direction (where replies to this direction's sender go)."""
        if self is Direction.AGENT_TO_CLIENT:
            return Direction.CLIENT_TO_AGENT
        return Direction.AGENT_TO_CLIENT


@value
class MessageContext:
    """What a middleware knows about a message besides its content."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    direction: Direction
    # The protocol version negotiated on this connection (``result.protocolVersion`` of the
    # ``initialize`` response), or ``None`` before it is known.
    protocol_version: int | None
    # True when the message is an entry of a JSON-RPC batch (a JSON array frame).
    in_batch: bool = False
    # True when observers (metrics, the live view, tracing) read this connection's frames:
    # a middleware's ``marks`` are read only then.
    observed: bool = False


@value
class Forward:
    """Forward the message unchanged (its bytes leave as they came), and send ``replies`` back
    to its sender (a notification the sender must act on, such as the policy's
    ``session/cancel``)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    replies: tuple[JsonObject, ...] = ()
    # Parts of the middleware that matched but chose not to act, with their reason (the rules
    # middleware's v1 ``safe`` skips), for the debug log.
    skipped: tuple[str, ...] = ()


FORWARD = Forward()


@value
class Replace:
    """Send ``messages`` instead of the original, in order (see the module docstring), and
    ``replies`` back to the original's sender (a notification of the proxy's own, such as the
    ``session/cancel`` a budget sends while the agent's update goes on to the client)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    messages: tuple[JsonObject, ...]
    replies: tuple[JsonObject, ...] = ()
    # The parts of the middleware that made the change (the rules middleware: its rules' names);
    # ``()``: the middleware as a whole.
    by: tuple[str, ...] = ()
    # Parts that matched but chose not to act (as ``Forward.skipped``).
    skipped: tuple[str, ...] = ()


@value
class Drop:
    """Do not forward the message."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    reason: str


@value
class Reply:
    """Do not forward the message; send ``message`` back to its sender instead."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    message: JsonObject


Verdict: TypeAlias = Forward | Replace | Drop | Reply


@value
class Concerns:
    """What a middleware acts on beyond its needles (see the module docstring): requests by
    method and direction, and the client requests whose responses it is told of."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    requests: frozenset[tuple[Direction, str]] = frozenset()
    answers: frozenset[str] = frozenset()


@runtime_checkable
class Middleware(Protocol):
    """A link of the chain. ``needles`` is optional (see the module docstring)."""

    @property
    def name(self) -> str: ...

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict: ...


class Ticking(abc.ABC):
    """A middleware with work that falls due with time rather than with a message: a turn that
    runs past a limit while its agent says nothing (the budgets' ``turn_seconds``). The session
    calls ``on_tick`` about once a second while it runs; it gives the messages to send toward
    the agent and toward the client (usually none; a few at most: they are queued without
    waiting for room) and must not raise. Implementations name it among their bases."""

    @abc.abstractmethod
    def on_tick(self) -> tuple[tuple[JsonObject, ...], tuple[JsonObject, ...]]: ...


class FastAnnotator(abc.ABC):
    """A middleware that can annotate a v2 `session/update` without the message being built (the
    annotation hot path): the rules middleware. A chain takes the fast path when exactly one link
    is one with ``fusable`` true and every other link declares its ``concerns``.

    ``fused_v2(message, direction)`` gives ``OMITTED`` when the message stays as it is, an edit
    (the new values of ``params._meta`` and ``params.update._meta``) otherwise, or ``None`` to
    leave the message to ``__call__``; its answer must be the one ``__call__`` gives.
    Implementations name it among their bases, so the chain's test is nominal, not a probe.
    """

    @property
    @abc.abstractmethod
    def fusable(self) -> bool: ...

    @abc.abstractmethod
    def fused_v2(self, message: JsonObject, direction: Direction) -> Any: ...


class BaseMiddleware:
    """Convenience base class: a default ``name`` (the class name) and no prefilter."""

    needles: tuple[bytes, ...] | None = None

    @property
    def name(self) -> str:
        return type(self).__name__

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        return FORWARD


@value
class Link:
    """A middleware in its place in the chain, with its failure policy."""

    middleware: Middleware
    # fail-closed: if the middleware raises, the message is dropped (a request is answered with a
    # JSON-RPC error; a response becomes an error for its id). Default fail-open: the message
    # continues unchanged.
    fail_closed: bool = False


@value
class MiddlewareFailure:
    """A middleware raised while handling a message."""

    middleware: str
    error: str
    fail_closed: bool


@value
class Outcome:
    """What the chain decided for one message."""

    # Messages to forward, in order; () when dropped. When ``changed`` is False this is
    # ``(original,)`` and the pipeline forwards the original bytes.
    messages: tuple[JsonObject, ...]
    # Messages to send back to the sender.
    replies: tuple[JsonObject, ...] = ()
    changed: bool = False
    changed_by: tuple[str, ...] = ()
    dropped_by: str | None = None
    failures: tuple[MiddlewareFailure, ...] = ()
    # Parts of middleware that matched but chose not to act, with their reason (the rules
    # middleware's v1 ``safe`` skips: ``("rules:edge-route", ...)``), for the debug log.
    skipped: tuple[str, ...] = ()
    # What the links marked the message with (their ``marks``), for the observers.
    marks: tuple[object, ...] = ()


def _needles_of(middleware: Middleware) -> tuple[bytes, ...] | None:
    needles = getattr(middleware, "needles", None)
    if needles is None:
        return None
    return tuple(needles)


def needle_escapes(needles: Sequence[tuple[bytes, ...] | None]) -> tuple[bytes, ...]:
    """The JSON escapes that could hide one of ``needles`` in a raw frame.

    Any character may be written ``\\uXXXX``; ``/`` may also be written ``\\/``, which only
    matters when a needle contains a ``/`` (a method name; ``sessionUpdate`` kinds have none).
    Scanning for an escape that cannot hide anything would cost a pass over every frame.
    """
    if not any(group is None or group for group in needles):
        return ()  # no needle to hide
    slash = any(b"/" in needle for group in needles if group for needle in group)
    return (b"\\u", b"\\/") if slash else (b"\\u",)


class Chain:
    """An ordered list of links, built once per connection and run per message."""

    __slots__ = (
        "_answer_watchers",
        "_escapes",
        "_init_watchers",
        "_links",
        "_marking",
        "_needles",
        "_request_watchers",
        "answers",
        "concerned",
        "routes",
    )

    def __init__(self, links: Sequence[Link]) -> None:
        self._links = tuple(links)
        self._needles = tuple(_needles_of(link.middleware) for link in self._links)
        self._escapes = needle_escapes(self._needles)
        # The links with an ``on_initialize`` method (the policy: the agent's name); usually
        # none.
        self._init_watchers = tuple(
            watcher
            for link in self._links
            if callable(watcher := getattr(link.middleware, "on_initialize", None))
        )
        # Per link, whether it marks messages (its ``marks`` list is drained after each call).
        self._marking = tuple(
            isinstance(getattr(link.middleware, "marks", None), list) for link in self._links
        )
        concerns = [getattr(link.middleware, "concerns", None) for link in self._links]
        # Per link, whether it declares its concerns (see the module docstring).
        self.concerned = tuple(isinstance(c, Concerns) for c in concerns)
        # Per direction, the request methods some link is handed by name: method -> the links.
        self.routes: dict[Direction, dict[str, tuple[bool, ...]]] = {d: {} for d in Direction}
        for direction in Direction:
            names = {m for c in concerns if isinstance(c, Concerns) for d, m in c.requests
                     if d is direction}  # fmt: skip
            for name in names:
                self.routes[direction][name] = tuple(
                    isinstance(c, Concerns) and (direction, name) in c.requests for c in concerns
                )
        # The client requests whose responses links are told of, and who is told.
        self.answers = frozenset(m for c in concerns if isinstance(c, Concerns) for m in c.answers)
        self._answer_watchers = tuple(
            (c.answers, link.middleware.on_answer)  # type: ignore[attr-defined]
            for c, link in zip(concerns, self._links, strict=True)
            if isinstance(c, Concerns) and c.answers
        )
        # The links with an ``on_initialize_request`` method (the budgets: whether the client
        # shows notices).
        self._request_watchers = tuple(
            watcher
            for link in self._links
            if callable(watcher := getattr(link.middleware, "on_initialize_request", None))
        )

    def initialize_requested(self, request: JsonObject) -> None:
        """Tell the links that want it the client's ``initialize`` request (which ``run``
        never sees: it comes before the version is known)."""
        for watcher in self._request_watchers:
            watcher(request)

    def initialized(self, response: JsonObject) -> None:
        """Tell the links that want it the ``initialize`` response (which ``run`` never sees:
        the chain runs once that response fixed the version)."""
        for watcher in self._init_watchers:
            watcher(response)

    def answered(self, method: str, response: JsonObject) -> None:
        """Tell the links that asked (``Concerns.answers``) the response to a ``method``
        request of the client."""
        for methods, watcher in self._answer_watchers:
            if method in methods:
                watcher(method, response)

    @property
    def links(self) -> tuple[Link, ...]:
        return self._links

    def __len__(self) -> int:
        return len(self._links)

    def interested(self, raw: bytes) -> tuple[bool, ...]:
        """For each link, whether it may act on the frame ``raw`` (its needle prefilter)."""
        escaped = any(e in raw for e in self._escapes)
        return tuple(
            n is None or (bool(n) and (escaped or any(needle in raw for needle in n)))
            for n in self._needles
        )

    def wants(self, raw: bytes) -> bool:
        """True if any link may act on the frame ``raw``; False means forward it unparsed."""
        return any(self.interested(raw))

    def run(
        self,
        message: JsonObject,
        ctx: MessageContext,
        interested: tuple[bool, ...] | None = None,
    ) -> Outcome:
        """Pass ``message`` through every interested link in order.

        A ``Replace`` feeds each of its messages to the remaining links (flat-map), so later
        links see what earlier ones produced. ``Drop`` and ``Reply`` stop the chain for that
        message only (its siblings go on). A link that raises is skipped (fail-open) or drops the
        message (fail-closed): a request is answered with a JSON-RPC internal error, and a
        response is replaced by one for its id, so its request does not hang.
        """
        if interested is None:
            interested = tuple(True for _ in self._links)
        current: list[JsonObject] = [message]
        replies: list[JsonObject] = []
        changed_by: list[str] = []
        failures: list[MiddlewareFailure] = []
        changed = False
        dropped_by: str | None = None
        skipped: list[str] = []
        marks: list[object] = []
        for link, wanted, marking in zip(self._links, interested, self._marking, strict=True):
            if not wanted:
                continue
            mw = link.middleware
            following: list[JsonObject] = []
            # Each message is handled on its own: dropping or answering one of several (after a
            # Replace) never stops its siblings, and they still pass every later link.
            for msg in current:
                try:
                    verdict = mw(msg, ctx)
                except Exception as exc:  # isolate the failure; the shell logs it
                    if marking:
                        mw.marks.clear()  # type: ignore[attr-defined]  # (of a call that failed)
                    failures.append(
                        MiddlewareFailure(mw.name, f"{type(exc).__name__}: {exc}", link.fail_closed)
                    )
                    if not link.fail_closed:
                        following.append(msg)
                        continue
                    changed = True
                    dropped_by = dropped_by or mw.name
                    error = f"acp-proxy: middleware {mw.name} failed"
                    if "id" in msg and "method" in msg:  # a request: answer its sender
                        replies.append(error_object(msg["id"], INTERNAL_ERROR, error))
                    elif "id" in msg and ("result" in msg or "error" in msg):
                        # A response: its request must not hang; the receiver gets an error for
                        # the same id instead of the response the middleware choked on.
                        following.append(error_object(msg["id"], INTERNAL_ERROR, error))
                    continue
                if marking:
                    made = mw.marks  # type: ignore[attr-defined]
                    if made:
                        marks.extend(made)
                        made.clear()
                if isinstance(verdict, Forward):
                    following.append(msg)
                    if verdict.skipped:
                        skipped.extend(f"{mw.name}:{p}" for p in verdict.skipped)
                    if verdict.replies:
                        replies.extend(verdict.replies)
                    continue
                changed = True
                if isinstance(verdict, Replace):
                    following.extend(verdict.messages)
                    replies.extend(verdict.replies)
                    # A verdict may name the parts of its middleware that acted (the rules
                    # middleware names its rules); logs then show "rules:edge-route".
                    if verdict.skipped:
                        skipped.extend(f"{mw.name}:{p}" for p in verdict.skipped)
                    for name in [f"{mw.name}:{p}" for p in verdict.by] or [mw.name]:
                        if name not in changed_by:
                            changed_by.append(name)
                else:
                    dropped_by = dropped_by or mw.name
                    if isinstance(verdict, Reply):
                        replies.append(verdict.message)
            current = following
        return Outcome(
            tuple(current),
            tuple(replies),
            changed,
            tuple(changed_by),
            dropped_by,
            tuple(failures),
            tuple(dict.fromkeys(skipped)),
            tuple(marks),
        )
