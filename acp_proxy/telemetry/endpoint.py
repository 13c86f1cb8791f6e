"""The metrics endpoint's address forms.

Contract: owns which spellings ``--metrics`` (and ``metrics:`` in the config) accepts besides the
listener syntax ``tcp://HOST:PORT`` / ``unix:///PATH``: ``HOST:PORT`` and ``http://HOST:PORT``
(with an optional path, ignored: the endpoint serves /metrics, /healthz and /readyz), as a
Prometheus target or a browser URL is written. Pure: it rewrites the text, the socket layer
parses and checks the result.
"""

from __future__ import annotations


def metrics_url(url: str) -> str:
    """``url`` in the listener syntax; anything it does not recognise is returned unchanged
    (the address parser then explains what is expected)."""
    if url.startswith("http://"):
        authority = url.removeprefix("http://").partition("/")[0]
        return f"tcp://{authority}" if authority else url
    if "://" not in url and ":" in url and "/" not in url:
        return f"tcp://{url}"
    return url
