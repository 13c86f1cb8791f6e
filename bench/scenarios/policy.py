"""Scenario 9: the permission policy's decision cost, and a frame it does not concern.

Contract: runs ``bench/policy.py --json`` (its own process, once per repetition) and reports
the cost of one decision with 200 rules (p50, p99 and max per request, wall and the thread's
CPU time; the target is p99 at most 50 µs) and the median cost of a 2 KiB notification no rule
concerns through a connection without and with the policy link. Measures; never asserts.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

from harness import BENCH, PY, Harness, env_with
from rows import Row, fmt, stats, status, table

RULES = 200
TARGET_P99_US = 50.0


def run(h: Harness, log: Callable[[str], None]) -> list[Row]:
    requests = 2000 if h.s.quick else 20000
    got: list[dict[str, Any]] = []
    errors: list[str] = []
    for rep in range(h.s.reps):
        proc = subprocess.run(
            [
                PY,
                str(BENCH / "policy.py"),
                "--rules",
                str(RULES),
                "--requests",
                str(requests),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env_with(),
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            errors.append(proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed")
            continue
        got.append(json.loads(proc.stdout))
        d = got[-1]["decision"]
        log(f"  s9 rep {rep + 1}/{h.s.reps}: p50 {d['p50_us']:.1f} µs, p99 {d['p99_us']:.1f} µs")
    profile = f"policy-{RULES}-rules"
    if not got:
        reason = errors[0] if errors else "no run"
        return [
            Row(9, profile, v, t, "error", reason)
            for v, t in (
                ("decision", "one decision"),
                ("decision-audited", "one decision and its audit entry"),
                ("frame-no-policy", "a frame, no policy"),
                ("frame-policy", "a frame, with the policy"),
            )
        ]
    keys = ("p50_us", "p99_us", "max_us", "cpu_p50_us", "cpu_p99_us", "cpu_max_us")
    rows = [
        Row(
            9,
            profile,
            variant,
            title,
            metrics={k: stats([g[part][k] for g in got]) for k in keys},
            check={"requests": requests, "target_p99_us": TARGET_P99_US},
        )
        for variant, part, title in (
            ("decision", "decision", f"one permission request decided against {RULES} rules"),
            (
                "decision-audited",
                "audited",
                "the same, building its audit entry (an audit file, without its I/O)",
            ),
        )
    ]
    for variant, name, title in (
        ("frame-no-policy", "no policy", "a 2 KiB message chunk, no policy"),
        ("frame-policy", "policy", "a 2 KiB message chunk, with the policy link"),
    ):
        frames = [g["frames"][name] for g in got]
        rows.append(
            Row(
                9,
                profile,
                variant,
                title,
                metrics={"p50_us": stats([f["p50_us"] for f in frames])},
                check={"unchanged": all(f["unchanged"] for f in frames)},
            )
        )
    return rows


def markdown(rows: list[dict[str, Any]], out: list[str]) -> None:
    out.append(
        f"### 9. Policy decision cost ({RULES} rules; bench/policy.py; target p99 ≤ "
        f"{TARGET_P99_US:.0f} µs)"
    )
    out.append("")
    body = []
    for r in rows:
        if r["scenario"] != 9:
            continue
        st = status(r)
        m = r["metrics"]
        if st:
            body.append([r["title"], st, "", "", "", ""])
            continue
        body.append(
            [
                r["title"],
                fmt(m.get("p50_us"), 2),
                fmt(m.get("p99_us"), 1),
                fmt(m.get("cpu_p50_us"), 1),
                fmt(m.get("cpu_p99_us"), 1),
                "bytes unchanged" if r["check"].get("unchanged") else "",
            ]
        )
    table(out, ["measure", "p50 µs", "p99 µs", "CPU p50 µs", "CPU p99 µs", "output"], body)
