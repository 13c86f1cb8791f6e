"""Rows of the benchmark's report: the record of one measurement, its statistics, its cells.

Contract: owns the ``Row`` (one variant of one scenario and profile: metrics, ratios, the
output check; its JSON form is the results file's), the statistics of repeated measurements,
the ratios paired by repetition, and the formatting helpers every scenario's Markdown table
uses (``fmt``, ``status``, ``table``, ``output_check``). Pure: it neither runs nor measures.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness import Run, json_check_text


# -- statistics -----------------------------------------------------------------------------
def stats(values: Sequence[float]) -> dict[str, float | int] | None:
    """Median, min, max and count of finite values; None when there are none."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


# -- rows -----------------------------------------------------------------------------------
@dataclass(slots=True)
class Row:
    scenario: int
    profile: str
    variant: str
    title: str
    status: str = "ok"  # ok | skipped | error
    reason: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, Any] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"s{self.scenario}/{self.profile}/{self.variant}"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["id"] = self.id
        return d


def skipped(scenario: int, profile: str, variant: str, title: str, reason: str) -> Row:
    return Row(scenario, profile, variant, title, status="skipped", reason=reason)


def paired_ratios(
    runs: dict[str, list[Run]], variant: str, base: str, value: Callable[[Run], float]
) -> dict[str, float | int] | None:
    """Repetition-by-repetition ratio ``value(variant) / value(base)`` (interleaved pairs)."""
    out: list[float] = []
    for a, b in zip(runs.get(variant, []), runs.get(base, []), strict=False):
        if a.ok and b.ok:
            va, vb = value(a), value(b)
            if vb > 0 and math.isfinite(va) and math.isfinite(vb):
                out.append(va / vb)
    return stats(out)


# -- cells and tables -----------------------------------------------------------------------
def fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, dict):
        med = x.get("median")
        if med is None:
            return "-"
        if x.get("n", 1) > 1:
            return f"{fmt(med, digits)} [{fmt(x['min'], digits)}..{fmt(x['max'], digits)}]"
        return fmt(med, digits)
    if isinstance(x, float):
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        return f"{x:.{digits}f}"
    return str(x)


def output_check(check: dict[str, Any]) -> str:
    """The "output" cell: identical bytes, same line count, or how many lines came out."""
    ident, lines_out = check.get("identical") or [], check.get("lines_out") or []
    if check.get("json"):  # a peer: checked as JSON, message by message
        texts = [
            json_check_text(jc, check["lines_in"], n)
            for jc, n in zip(check["json"], lines_out, strict=False)
            if jc is not None
        ]
        return " / ".join(dict.fromkeys(texts)) or "-"
    if ident and all(ident):
        return "identical bytes"
    if lines_out and all(n == check["lines_in"] for n in lines_out):
        return "same line count"
    if lines_out:
        return f"{min(lines_out)}-{max(lines_out)} of {check['lines_in']} lines (merged)"
    return "-"


def status(r: dict[str, Any]) -> str | None:
    """A skipped or failed row's cell (``"skipped: why"``); None for a row that ran."""
    return None if r["status"] == "ok" else f"{r['status']}: {r['reason']}"


def table(out: list[str], header: list[str], body: list[list[str]]) -> None:
    """Append a Markdown table (and a blank line) to ``out``."""
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "|".join("---" for _ in header) + "|")
    out.extend("| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in body)
    out.append("")
