"""Which frames must be parsed: the byte tests that let most frames pass unparsed.

Contract: pure functions of a frame's bytes, no state. A frame is parsed when a middleware may
act on it (the chain's needle prefilter, ``LinkInterest``, which also passes every frame with a
JSON escape), when the request tables need it (``agent_needs_parse`` / ``client_needs_parse``),
or when everything is inspected; everything else is forwarded unparsed, and so unvalidated,
exactly as a transparent relay would. ``passes_unparsed`` is that decision, the one every path
of the connection asks. ``parse_cost`` bounds the
memory a parse may take (the parse budget, docs/bounds.md).
"""

from __future__ import annotations

from acp_proxy.wire.raw.block_scan import contains

# The bytes of an ``id`` key (see ``agent_needs_parse``).
ID_KEY = b'"id"'

# What one parsed container or element costs at least (an empty dict is 64 bytes in CPython).
_CONTAINER_COST = 64
_NESTING_SLACK = 1024  # values not after a comma: at most one per nesting level (see parse_cost)

# The escapes ``Chain.interested`` treats as hiding a needle.
ESCAPES = (b"\\u", b"\\/")

# The first two bytes of a line that can be a frame with nothing before its opener: diversion
# that matches what a JSON reader accepts (``rawjson.could_be_frame`` is the general check, for
# the rest).
FRAME_STARTS = frozenset(
    [b"{" + bytes([c]) for c in b' \t\r"}'] + [b"[" + bytes([c]) for c in b" \t\r]{["]
)


def parse_cost(raw: bytes, budget: int) -> int:
    """An upper estimate of the memory a parse of ``raw`` takes (bounded memory: a 60 MiB frame
    of ``{}`` parses into 20 million dicts, about 2 GB).

    Every value after the first of a container follows a comma, so ``_CONTAINER_COST`` per comma
    bounds what the values cost; the values that follow no comma are the first of each container,
    and a chain of those is as deep as the nesting, which parsers cap near a thousand. Cheap: one
    ``bytes.count`` pass, and only for frames big enough to matter.
    """
    n = len(raw)
    if n * 33 <= budget:  # even ``{},{},...`` (64 bytes per 3 input bytes) fits
        return n
    return n + _CONTAINER_COST * (raw.count(b",") + _NESTING_SLACK)


def agent_needs_parse(raw: bytes) -> bool:
    """Whether the tracker must see an agent frame that no middleware wants.

    Requests and responses carry a top-level ``"id"``; the bulk of agent traffic is
    ``session/update`` notifications, which have none. The bytes ``"id"`` (quote, i, d, quote)
    cannot occur inside a JSON string (its quotes would be escaped), so a frame without them
    has no ``id`` key at any depth and is forwarded unparsed. A frame with them is parsed (a
    nested ``id`` costs a parse, never a wrong answer). Not caught: an ``id`` key written with a
    ``\\u`` escape; missing one only leaves an entry in ``pending_agent_requests`` or (for a
    response) an extra -32603 answer from ``abort_pending``, which a client ignores. The block
    fast path (``acp_proxy.wire.connection.blocks``) uses the same test (``passes_unparsed``), so
    both paths agree frame for frame.
    """
    return contains(raw, ID_KEY)


def client_needs_parse(raw: bytes) -> bool:
    """Client requests and responses carry ``"id"``; notifications (no ``"id"``) are skipped.

    Client traffic is small, so this one is exact: a full scan, and escaped frames are parsed.
    """
    return contains(raw, ID_KEY) or has_escape(raw)


def passes_unparsed(a2c: bool, raw: bytes) -> bool:
    """Whether a line that no middleware may act on passes as it came, unparsed: the one test
    every path of the connection asks (the line path, a read's lines, a block's picked lines).

    From the agent: it starts like a frame with nothing before its opener (``FRAME_STARTS``;
    anything else is diverted or parsed by the line path) and the request tables do not need it
    (``agent_needs_parse``). From the client: the tables do not need it (``client_needs_parse``).
    The caller has checked that no middleware may act on it and that not every frame is
    inspected (``ConnState.inspect_all``)."""
    if a2c:
        return raw[:2] in FRAME_STARTS and not contains(raw, ID_KEY)
    return not (contains(raw, ID_KEY) or has_escape(raw))


def has_any(raw: bytes, escapes: tuple[bytes, ...]) -> bool:
    """One of ``escapes`` occurs in ``raw`` (``escapes`` all start with a backslash)."""
    p = raw.find(b"\\")  # memchr: most frames have no backslash at all
    return p >= 0 and any(raw.find(e, p) >= 0 for e in escapes)


def has_escape(raw: bytes) -> bool:
    """A ``\\u`` or ``\\/`` escape (the ones ``Chain.interested`` treats as hiding a needle)."""
    p = raw.find(b"\\")  # memchr: most frames have no backslash at all
    return p >= 0 and (raw.find(b"\\u", p) >= 0 or raw.find(b"\\/", p) >= 0)
