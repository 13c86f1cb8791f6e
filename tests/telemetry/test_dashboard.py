"""The Grafana dashboard in ``deploy/``: valid JSON whose every query names only metric families
(and their histogram series) the proxy exports, laid out on Grafana's 24-column grid."""

from __future__ import annotations

import json
import re
from typing import Any

from proxy_harness import REPO

from acp_proxy.telemetry.metrics import Metrics

DASHBOARD = REPO / "deploy" / "grafana-dashboard.json"


def _families() -> set[str]:
    """The names of the metric families the proxy exports (its own, without the process and
    build ones the HTTP responder adds)."""
    return {family.name for family in Metrics(max_pending=10).collect()}


def _queries() -> list[tuple[str, str]]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def test_every_query_names_an_exported_family() -> None:
    names = _families()
    for family in list(names):
        names |= {f"{family}_bucket", f"{family}_count", f"{family}_sum", f"{family}_total"}
    queries = _queries()
    assert len(queries) >= 18
    used = set()
    for title, expr in queries:
        for name in re.findall(r"\bacp_proxy_[a-z_]+", expr):
            assert name in names, (title, name)
            used.add(name)
    # The numbers the dashboard exists for are all on it.
    for family in (
        "acp_proxy_turn_duration_seconds_bucket",
        "acp_proxy_turn_first_output_seconds_bucket",
        "acp_proxy_tool_call_duration_seconds_bucket",
        "acp_proxy_permission_wait_seconds_bucket",
        "acp_proxy_request_errors_total",
        "acp_proxy_frames_total",
        "acp_proxy_outbound_queue_bytes",
    ):
        assert family in used, family


def test_panels_fit_the_grid_without_overlap() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, panel["title"]
        taken |= cells
    assert dashboard["uid"] == "acp-proxy-sessions"
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "job"]
