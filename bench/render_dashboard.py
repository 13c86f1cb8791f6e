"""Render deploy/grafana-dashboard.json as a picture, from real data, without Grafana.

``python bench/render_dashboard.py OUT.png [--seconds N]`` starts the proxy with ``--listen``
and ``--metrics`` in front of the demo agent (``--ask-permission``), drives sessions against it
for N seconds (prompts, permission answers after a varying wait, some cancellations), has
Debian's ``prometheus`` scrape it every second, evaluates every panel's PromQL over the run
with Prometheus's ``query_range`` API (``$__rate_interval`` as 10 s, ``$job`` as all) and
draws the panels as SVG in one HTML page, screenshotted by ``chromium --headless``. What the
image shows is what the dashboard's queries return for that run. Needs ``prometheus`` and
``chromium`` on PATH; a development tool, not part of the package.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "deploy" / "grafana-dashboard.json"
COLORS = ["#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#b877d9", "#f2495c", "#8ab8ff", "#96d98d"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")


def _session(port: int, rng: random.Random) -> None:
    """One client connection: initialize, session/new, a few prompts (see the module)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        reader = sock.makefile("rb")

        def until(predicate: Any) -> dict[str, Any]:
            while True:
                line = reader.readline()
                if not line:
                    raise EOFError
                message: dict[str, Any] = json.loads(line)
                if predicate(message):
                    return message

        _send(sock, {"id": 0, "method": "initialize", "params": {"protocolVersion": 2}})
        until(lambda m: m.get("id") == 0)
        _send(sock, {"id": 1, "method": "session/new", "params": {"cwd": "/w"}})
        session = until(lambda m: m.get("id") == 1)["result"]["sessionId"]
        for n in range(rng.randint(1, 3)):
            time.sleep(rng.uniform(0.2, 1.0))  # the user types
            prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
            _send(sock, {"id": 10 + n, "method": "session/prompt", "params": prompt})
            ask = until(lambda m: m.get("method") == "session/request_permission")
            time.sleep(rng.expovariate(1 / 1.5))  # the user reads and decides
            if rng.random() < 0.15:
                _send(sock, {"method": "session/cancel", "params": {"sessionId": session}})
                outcome: dict[str, Any] = {"outcome": "cancelled"}
            else:
                option = "allow" if rng.random() < 0.8 else "deny"
                outcome = {"outcome": "selected", "optionId": option}
            _send(sock, {"id": ask["id"], "result": {"outcome": outcome}})
            until(lambda m: m.get("params", {}).get("update", {}).get("state") == "idle")


def _drive(port: int, seconds: float) -> None:
    import threading

    rng = random.Random(7)
    end = time.monotonic() + seconds
    threads: list[threading.Thread] = []
    while time.monotonic() < end:
        seed = rng.random()
        t = threading.Thread(target=_session, args=(port, random.Random(seed)), daemon=True)
        t.start()
        threads.append(t)
        time.sleep(rng.uniform(0.3, 1.2))
    for t in threads:
        t.join(timeout=30)


def _query_range(prom: int, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "2"})
    with urllib.request.urlopen(f"http://127.0.0.1:{prom}/api/v1/query_range?{query}") as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _legend(fmt: str, labels: dict[str, str]) -> str:
    out = fmt
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out or "value"


def _unit(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "bytes":
        return f"{value / 1024:.0f} KiB" if value >= 1024 else f"{value:.0f} B"
    return f"{value:.3g}"


def _svg(series: list[tuple[str, list[tuple[float, float]]]], unit: str, w: int, h: int) -> str:
    points = [p for _, pts in series for p in pts]
    if not points:
        return f'<svg width="{w}" height="{h}"><text x="10" y="20" fill="#888">no data</text></svg>'
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    top = max(p[1] for p in points) or 1.0
    left, bottom = 60, 20
    parts = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">']
    for i in range(5):
        y = 5 + (h - bottom - 5) * i / 4
        parts.append(f'<line x1="{left}" x2="{w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#2c3235"/>')
        label = _unit(top * (1 - i / 4), unit)
        parts.append(
            f'<text x="{left - 4}" y="{y + 4:.1f}" fill="#8e8e8e" font-size="10" '
            f'text-anchor="end">{label}</text>'
        )
    for n, (_, pts) in enumerate(series):
        coords = " ".join(
            f"{left + (w - left) * (t - t0) / max(t1 - t0, 1):.1f},"
            f"{5 + (h - bottom - 5) * (1 - v / top):.1f}"
            for t, v in pts
        )
        color = COLORS[n % len(COLORS)]
        parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _page(prom: int, start: float, end: float) -> str:
    dashboard = json.loads(DASHBOARD.read_text())
    cell = 58  # pixels per grid unit (24 wide)
    row_h = 30
    blocks = []
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        x, y, w, h = pos["x"] * cell, pos["y"] * row_h, pos["w"] * cell - 8, pos["h"] * row_h - 8
        style = f"left:{x}px;top:{y}px;width:{w}px;height:{h}px"
        if panel["type"] == "row":
            blocks.append(f'<div class="row" style="{style}">{html.escape(panel["title"])}</div>')
            continue
        unit = panel["fieldConfig"]["defaults"]["unit"]
        series: list[tuple[str, list[tuple[float, float]]]] = []
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "10s").replace("$job", ".*")
            for result in _query_range(prom, expr, start, end):
                pts = [
                    (float(t), float(v)) for t, v in result["values"] if v not in ("NaN", "+Inf")
                ]
                series.append((_legend(target["legendFormat"], result["metric"]), pts))
        title = f'<div class="title">{html.escape(panel["title"])}</div>'
        if panel["type"] == "stat":
            last = series[0][1][-1][1] if series and series[0][1] else 0.0
            body = f'<div class="stat">{_unit(last, unit)}</div>'
        else:
            legend = "".join(
                f'<span style="color:{COLORS[n % len(COLORS)]}">&#9644; {html.escape(name)}</span>'
                for n, (name, _) in enumerate(series[:8])
            )
            body = _svg(series, unit, w - 16, h - 58) + f'<div class="legend">{legend}</div>'
        blocks.append(f'<div class="panel" style="{style}">{title}{body}</div>')
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"]) * row_h
    css = (
        "body{margin:0;background:#111217;font-family:sans-serif;color:#ccccdc}"
        ".panel{position:absolute;background:#181b1f;border:1px solid #2c3235;border-radius:2px;"
        "padding:4px 8px;box-sizing:border-box;overflow:hidden}"
        ".row{position:absolute;font-weight:bold;font-size:15px;padding-top:6px}"
        ".title{font-size:13px;font-weight:500;margin-bottom:4px}"
        ".legend{font-size:10px;display:flex;flex-wrap:wrap;gap:8px}"
        ".stat{font-size:48px;color:#73bf69;text-align:center;margin-top:50px}"
        "h1{font-size:18px;margin:0;padding:10px 12px}"
        ".grid{position:relative;margin:0 8px}"
    )
    title = html.escape(dashboard["title"])
    return (
        f"<html><head><meta charset='utf-8'><style>{css}</style></head><body>"
        f"<h1>{title}</h1><div class='grid' style='height:{height}px'>{''.join(blocks)}</div>"
        "</body></html>"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/render_dashboard.py")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=90.0)
    args = parser.parse_args(argv)
    for tool in ("prometheus", "chromium"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        listen, metrics, prom = _free_port(), _free_port(), _free_port()
        agent = [sys.executable, "-m", "acp_proxy.demo.agent", "--ask-permission"]
        proxy = subprocess.Popen(
            [sys.executable, "-m", "acp_proxy", "--log-level", "warning", "--listen",
             f"tcp://127.0.0.1:{listen}", "--metrics", f"127.0.0.1:{metrics}", "--", *agent],
            cwd=REPO,
        )  # fmt: skip
        config = Path(tmp) / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: acp-proxy\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{metrics}']}}]\n"
        )
        prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{prom}", "--log.level=error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_port(listen, time.monotonic() + 20)
            _wait_port(prom, time.monotonic() + 30)
            start = time.time()
            _drive(listen, args.seconds)
            time.sleep(3)  # the last scrapes
            page = Path(tmp) / "dashboard.html"
            page.write_text(_page(prom, start, time.time()))
            subprocess.run(
                ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 f"--screenshot={args.out.resolve()}", "--window-size=1400,1290",
                 page.as_uri()],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, "HOME": tmp},
            )  # fmt: skip
        finally:
            for process in (prometheus, proxy):
                process.terminate()
                process.wait(timeout=30)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
