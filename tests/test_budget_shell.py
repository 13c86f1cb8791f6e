"""The budgets' shell on real files: the state file's rules, the config watch, the metrics."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest

from acp_proxy.budget.ledger import Ledger
from acp_proxy.budget.middleware import BudgetEvent
from acp_proxy.budget.model import Limit, Meter, Per
from acp_proxy.shell.budgets import BudgetReport, ConfigWatch, StateFile

COST = Limit("cost", Meter.COST, 5.0)
TURNS = Limit("turns", Meter.TURNS, 10.0, Per.PROCESS)


def test_two_proxies_on_one_file_add_up(tmp_path: Path) -> None:
    path = str(tmp_path / "b.json")
    a, b = Ledger((COST,)), Ledger((COST,))
    sa, sb = StateFile(path, a), StateFile(path, b)
    a.add(COST, "s", 1.0, time.time())
    b.add(COST, "s", 2.5, time.time())
    assert sa.sync() is None and sb.sync() is None and sa.sync() is None
    assert a.status(COST, "s", time.time()).spent == 3.5
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert orjson.loads(Path(path).read_bytes())["limits"]["cost"]["spend"]["s"]["spent"] == 3.5


@pytest.mark.parametrize(
    ("prepare", "reason"),
    [
        (lambda p: (p.write_text("not json"), p.chmod(0o600)), "not JSON"),
        (
            lambda p: (p.write_text('{"version": 9}'), p.chmod(0o600)),
            "not a budget state (version 1 expected)",
        ),
        (lambda p: (p.write_text("{}"), p.chmod(0o644)), "others may access it (mode 0644)"),
        (lambda p: p.symlink_to(p.parent / "elsewhere"), "it is a symbolic link"),
    ],
)
def test_a_state_file_that_is_not_ours_is_refused_and_kept(
    tmp_path: Path, prepare: object, reason: str
) -> None:
    path = tmp_path / "b.json"
    prepare(path)  # type: ignore[operator]
    before = path.read_bytes() if path.exists() else None
    got = StateFile(str(path), Ledger((COST,))).sync()
    assert got is not None and got.startswith(f"{path}: {reason}")
    assert (path.read_bytes() if path.exists() else None) == before


def test_a_raised_max_in_the_config_file_is_taken_at_the_next_write(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    text = "budgets:\n  limits:\n    - {name: cost, meter: cost, max: 5}\n"
    config.write_text(text)
    ledger = Ledger((COST,))
    store = StateFile(str(tmp_path / "budgets.json"), ledger, ConfigWatch(str(config), ledger))
    ledger.add(COST, "s", 6.0, time.time())
    assert store.sync() is None and ledger.status(COST, "s", time.time()).crossed
    config.write_text(text.replace("max: 5", "max: 8"))
    os.utime(config, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert store.sync() is None
    status = ledger.status(ledger.limits[0], "s", time.time())
    assert (status.max, status.crossed) == (8.0, False)
    config.write_text("budgets: [oops\n")
    os.utime(config, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    assert store.sync() is None and ledger.limits[0].max == 8.0  # a broken file changes nothing


def test_the_metrics_name_each_limit_and_event_kind() -> None:
    ledger = Ledger((COST, TURNS))
    report = BudgetReport(ledger, None)
    ledger.add(COST, "s1", 4.0, time.time())
    ledger.add(TURNS, "process", 3.0, time.time())
    report(BudgetEvent("warning", "s1", "cost", "cost", "s1", 4.0, 5.0, 0.8))
    report(BudgetEvent("refused", "s1", "cost", "cost", "s1", 4.0, 5.0))
    report(BudgetEvent("unrecorded", "s1", reason="b.json: Permission denied"))
    families = {f.name: f for f in report.collect()}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert samples == {
        ("acp_proxy_budget_events_total", (("kind", "refused"), ("limit", "cost"))): 1,
        ("acp_proxy_budget_events_total", (("kind", "unrecorded"), ("limit", ""))): 1,
        ("acp_proxy_budget_events_total", (("kind", "warning"), ("limit", "cost"))): 1,
        ("acp_proxy_budget_spent", (("limit", "cost"),)): 4.0,
        ("acp_proxy_budget_spent", (("limit", "turns"),)): 3.0,
        ("acp_proxy_budget_remaining", (("limit", "cost"),)): 1.0,
        ("acp_proxy_budget_remaining", (("limit", "turns"),)): 7.0,
    }
