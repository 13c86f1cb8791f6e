"""acp-proxy: a sidecar for the Agent Client Protocol that observes and annotates traffic.

The package is split into a pure core (framing, JSON-RPC classification, the metadata-patch
algebra, rules, the middleware chain, coalescing) and a thin I/O shell (runtime, process,
transports, cli, logsetup, demo). See docs/architecture.md.
"""

from __future__ import annotations

# The one version: pyproject.toml reads it, CHANGELOG.md's newest entry names it (a test checks).
__version__ = "0.3.0"
