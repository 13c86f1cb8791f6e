"""acp-proxy: a sidecar for the Agent Client Protocol that observes and annotates traffic.

The package is split into a pure core (framing, JSON-RPC classification, the metadata-patch
algebra, rules, the middleware chain, coalescing) and a thin I/O shell (runtime, process,
transports, cli, logsetup, demo). See README.md.
"""

from __future__ import annotations

__version__ = "0.2.0"
