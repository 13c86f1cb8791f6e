"""The cost guard (``bench/costguard.py``) passes on the tree as it is, and fails, naming the path,
when a path costs twice its budget: a proxy patched to take one more Python step per line on
the block path, and a budget scaled down by half.

One subprocess measures (the guard's budget holds for the pure-Python scanner, chosen before
``acp_proxy`` is imported, and this process imported it already); the comparison with a scaled
budget runs here, on the figures it wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import costguard  # noqa: E402  (bench/ is not a package)

# In the subprocess: the guard on the tree as it is (two paths: the whole guard runs in .ci/run
# before the tests), then on a proxy whose block path takes one more Python step per line.
_DRIVER = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/bench"]
import costguard

as_is = costguard.main(["--paths", "passthrough,queued-no-merge", "--json", sys.argv[2]])
print("=== dearer")

from acp_proxy.wire.framing import Block
from acp_proxy.wire.pipeline import Connection

handle_many = Connection.handle_many

def dearer(self, direction, events, *, join=False):
    events = list(events)
    for event in events:
        if isinstance(event, Block):
            for _line in event.raw.split(b"\\n"):  # one more step per line
                pass
    return handle_many(self, direction, events, join=join)

Connection.handle_many = dearer
dear = costguard.main(["--paths", "passthrough"])
print("=== exit codes", json.dumps([as_is, dear]))
"""


@pytest.fixture(scope="module")
def guard_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    measured = tmp_path_factory.mktemp("costguard") / "measured.json"
    env = {**os.environ, "ACP_PROXY_PURE_PYTHON": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(ROOT), str(measured)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, measured


def _row(out: str, path: str) -> list[str]:
    rows = [line for line in out.splitlines() if line.startswith(f"| {path} |")]
    assert len(rows) == 1, out
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def test_the_tree_as_it_is_passes(guard_run: tuple[str, Path]) -> None:
    out, measured = guard_run
    as_is = out.split("=== dearer")[0]
    for path in ("passthrough", "queued-no-merge"):
        cells = _row(as_is, path)
        assert cells[4] == "ok", as_is
        assert 0.9 <= float(cells[3]) <= 1.1, as_is  # the budget is this tree's own figure
    assert json.loads(out.split("=== exit codes")[1])[0] == 0
    assert set(json.loads(measured.read_text())["per_message"]) == {
        "passthrough",
        "queued-no-merge",
    }


def test_a_path_made_twice_as_dear_fails_and_is_named(guard_run: tuple[str, Path]) -> None:
    out, _ = guard_run
    dear = out.split("=== dearer")[1]
    cells = _row(dear, "passthrough")
    assert float(cells[3]) >= 1.5, dear
    assert cells[4].startswith("FAIL: more than 1.5 x the budget"), dear
    assert "costguard: a path failed (above)" in dear
    assert json.loads(dear.split("=== exit codes")[1])[1] == 1


def test_a_budget_scaled_down_by_half_fails_on_that_path_alone(
    guard_run: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, measured = guard_run
    budget = json.loads(costguard.BUDGET.read_text())
    budget["paths"]["queued-no-merge"]["budget"] /= 2
    halved = tmp_path / "budget.json"
    halved.write_text(json.dumps(budget))
    assert costguard.main(["--measured", str(measured), "--budget", str(halved)]) == 1
    out = capsys.readouterr().out
    assert _row(out, "queued-no-merge")[3:] == ["2.00", "FAIL: more than 1.5 x the budget"]
    assert _row(out, "passthrough")[4] == "ok"
    assert costguard.main(["--measured", str(measured)]) == 0


def test_every_budget_entry_says_why(tmp_path: Path) -> None:
    budget = json.loads(costguard.BUDGET.read_text())
    assert set(budget["paths"]) == set(costguard.PATHS)
    assert budget["limit"] == costguard.LIMIT == 1.5
    budget["paths"]["annotate"]["reason"] = " "
    bare = tmp_path / "budget.json"
    bare.write_text(json.dumps(budget))
    with pytest.raises(SystemExit, match="'annotate' has no reason"):
        costguard.read_budget(bare)
    with pytest.raises(SystemExit):  # --update without a reason is refused
        costguard.main(["--update", "--budget", str(bare)])
