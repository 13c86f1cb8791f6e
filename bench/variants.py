"""The variants the benchmark compares, and their titles.

Contract: owns the names of the variants of every scenario (the baselines, the proxy's
configurations, the peers), their titles in the report, the data set profiles, and the
baselines the ratio columns divide by. Data only: it runs nothing.
"""

from __future__ import annotations

import setup_peers

# Variants of scenarios 1 and 2, in run order. Baselines first, then the proxy.
BASELINES = ("pipe-cat", "c-relay", "py-line", "py-inject")
PROXY_VARIANTS = (
    "proxy-passthrough",
    "proxy-passthrough-nc",
    "proxy-annotate",
    "proxy-annotate-nc",
    "proxy-example",
    "proxy-passthrough-policy",
    "proxy-annotate-policy",
)
# The variants with the team policy (bench/policy-team.yaml) beside their rules, and the
# variant each is compared with in the same run (scenarios 1 and 2, "with a policy").
POLICY_VARIANTS = {
    "proxy-passthrough-policy": "proxy-passthrough",
    "proxy-annotate-policy": "proxy-annotate",
}
VARIANT_TITLES = {
    "pipe-cat": "cat between two pipes",
    "c-relay": "C byte relay (bench/relay.c)",
    "py-line": "Python line relay (relay_min.py line)",
    "py-inject": "Python orjson parse+inject (relay_min.py inject)",
    "proxy-passthrough": "acp-proxy, pass-through rules",
    "proxy-passthrough-nc": "acp-proxy, pass-through rules, coalescing off",
    "proxy-annotate": "acp-proxy, annotation rule",
    "proxy-annotate-nc": "acp-proxy, annotation rule, coalescing off",
    "proxy-example": "acp-proxy, config/example.yaml",
    "proxy-passthrough-policy": "acp-proxy, pass-through rules and a team policy",
    "proxy-annotate-policy": "acp-proxy, annotation rule and a team policy",
}
PROFILES = (("mixed", 2), ("mixed", 1), ("chunks", 2))
# The peers (installed by bench/setup_peers.py into the build dir). Scenario 3 has the
# two peers; scenarios 1, 2 and 4 also the conductor with one annotating component.
_CONDUCTOR = setup_peers.CONDUCTOR.removeprefix("@thinkwell/conductor@")
_SDK = setup_peers.SDK.removeprefix("agent-client-protocol==")
PEER_TITLES = {
    "conductor": f"TypeScript conductor (@thinkwell/conductor {_CONDUCTOR}, no components)",
    "sdk-relay": f"Python SDK relay (agent-client-protocol {_SDK}, a Connection each way)",
}
PEER_VARIANTS = ("conductor", "conductor-annotate", "sdk-relay")
VARIANT_TITLES.update(PEER_TITLES)
VARIANT_TITLES["conductor-annotate"] = (
    f"TypeScript conductor ({_CONDUCTOR}), one annotating component (in-process)"
)
# Scenario 5: why a peer has no socket row.
PEER_NO_LISTEN = {
    "conductor": "n/a: the conductor cannot listen for ACP clients: it serves one client through "
    "a ComponentConnection its embedder supplies; its connectors are stdio and in-process, its "
    "only listener the MCP bridge's HTTP one",
    "sdk-relay": "n/a: the SDK has no newline-delimited JSON listener; its servers are an "
    "experimental ASGI app (Streamable HTTP, WebSocket; the [http] extra and an ASGI server), "
    "another framing than --listen",
}
# The ratio columns of scenarios 1 and 2: each row divided by these baselines, rep by rep.
# "proxy-passthrough": the peers against the proxy, this row ÷ the proxy's.
RATIO_BASES = ("py-line", "py-inject", "c-relay", "proxy-passthrough")
