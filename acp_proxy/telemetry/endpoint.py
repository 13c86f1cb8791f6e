"""The proxy's HTTP endpoints, ``--metrics`` and ``--ui``: their address forms and request heads.

Contract: owns what both endpoints read the same way; pure (the I/O is
``shell.sockets.serving``). ``parse_head``: the one parser of an HTTP/1.x request head (the
request line, then headers up to the blank line): its method, path, query and headers, or
``None`` when malformed. ``endpoint_url``: which spellings ``--metrics``, ``--ui`` (and
``metrics:``, ``ui.address:`` in the config) accept besides the listener syntax
``tcp://HOST:PORT`` / ``unix:///PATH``: ``HOST:PORT`` and ``http://HOST:PORT`` (with an optional
path, ignored: each endpoint serves its own paths), as a Prometheus target or a browser URL is
written. One function for both, so that the two options never accept different forms; it
rewrites the text, the socket layer parses and checks the result
(``shell.sockets.address.parse_endpoint``).
"""

from __future__ import annotations

from acp_proxy.base.values import value


def endpoint_url(url: str) -> str:
    """``url`` in the listener syntax; anything it does not recognise is returned unchanged
    (the address parser then explains what is expected)."""
    if url.startswith("http://"):
        authority = url.removeprefix("http://").partition("/")[0]
        return f"tcp://{authority}" if authority else url
    if "://" not in url and ":" in url and "/" not in url:
        return f"tcp://{url}"
    return url


@value
class Request:
    """The parts of a request head the servers read (the live view's checks and router,
    ``/metrics``'s paths)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names; the last of repeated headers


def parse_head(head: bytes) -> Request | None:
    """The request of an HTTP/1.x head (up to the blank line), or ``None`` if malformed."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return None
    lines = text.replace("\r\n", "\n").split("\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    method, target = parts[0], parts[1]
    if not target.startswith("/"):
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            break
        name, colon, rest = line.partition(":")
        if not colon or not name or name != name.strip():
            return None
        headers[name.lower()] = rest.strip()
    # (Imported on the first request: ``--ui`` and ``--metrics`` start without it.)
    from urllib.parse import parse_qs, urlsplit

    split = urlsplit(target)
    query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
    return Request(method, split.path, query, headers)
