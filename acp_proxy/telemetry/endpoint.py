"""The address forms of the proxy's HTTP endpoints: ``--metrics`` and ``--ui``.

Contract: owns which spellings ``--metrics``, ``--ui`` (and ``metrics:``, ``ui.address:`` in the
config) accept besides the listener syntax ``tcp://HOST:PORT`` / ``unix:///PATH``: ``HOST:PORT``
and ``http://HOST:PORT`` (with an optional path, ignored: each endpoint serves its own paths),
as a Prometheus target or a browser URL is written. One function for both, so that the two
options never accept different forms. Pure: it rewrites the text, the socket layer parses and
checks the result (``shell.sockets.address.parse_endpoint``).
"""

from __future__ import annotations


def endpoint_url(url: str) -> str:
    """``url`` in the listener syntax; anything it does not recognise is returned unchanged
    (the address parser then explains what is expected)."""
    if url.startswith("http://"):
        authority = url.removeprefix("http://").partition("/")[0]
        return f"tcp://{authority}" if authority else url
    if "://" not in url and ":" in url and "/" not in url:
        return f"tcp://{url}"
    return url
