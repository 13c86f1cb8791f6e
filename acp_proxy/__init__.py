"""acp-proxy: a sidecar for the Agent Client Protocol that observes and annotates traffic.

The package is split into a pure core and a thin I/O shell (docs/architecture.md). The pure rooms:
``base`` (JSON types and values), ``meta`` (the metadata-patch algebra and the client model),
``wire`` (framing, the connection, the middleware chain, coalescing, proxy chains), ``config`` (the
file format), ``rules`` (the annotation rules engine), ``record`` (session records), ``telemetry``
(metrics and turns), ``ui`` (the live view's events), ``policy`` (the permission policy) and
``budget`` (the session budgets). The I/O: ``shell`` (processes, streams, sockets, logs, files),
``cli`` (the command line, ``__main__`` its ``python -m`` entry) and ``demo`` (the embedded demo
session). ``middleware`` is the public import path of the middleware interface.
"""

from __future__ import annotations

# The one version: pyproject.toml reads it, CHANGELOG.md's newest entry names it (a test checks).
__version__ = "0.3.0"
