"""The benchmark's scenarios, in report order: what ``bench/run.py`` runs and prints.

Contract: owns the list of scenarios (``SCENARIOS``): for each, the ``--scenarios`` numbers
that select it, the progress line, the function that runs it and the one that writes its
Markdown section. ``bench/run.py`` runs the selected ones in this order and prints every
section in this order (a scenario that was not selected prints its table empty). Start-up
(scenario 6, ``bench/startup.py``) is not a row scenario: ``run.py`` keeps its numbers under
the results' ``startup`` key.

Adding a scenario: write ``bench/scenarios/<name>.py`` with

* ``run(h: Harness, log: Callable[[str], None]) -> list[Row]``: measure with the harness
  (``h.stream``, ``h.skip_reason``, ``h.tmp``, ...; ``harness.py``) and return one ``Row`` per
  variant (``rows.Row``; ``rows.skipped`` for a variant that cannot run, with the reason). Give
  the rows a new scenario number (their ``scenario`` field, the ``sN/`` of their id);
* ``markdown(rows: list[dict[str, Any]], out: list[str]) -> None``: append the section's
  heading and table to ``out`` from the rows' JSON form (``rows.table``, ``rows.fmt``,
  ``rows.status``), picking its own rows by ``r["scenario"]``;

then add one ``Scenario`` line below, where its section belongs in the report, and its number
to ``--scenarios``' default in ``run.py``. ``tests/test_bench_smoke.py`` lists every row id a
quick run must produce: add the new ones there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness import Harness
from rows import Row

from scenarios import component, latency, memory, policy, slow_client, sockets, throughput


@dataclass(frozen=True, slots=True)
class Scenario:
    numbers: frozenset[int]  # the --scenarios numbers that select it
    progress: str  # the line on stderr when it starts
    run: Callable[[Harness, Callable[[str], None]], list[Row]]
    markdown: Callable[[list[dict[str, Any]], list[str]], None]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        frozenset({1, 2}), "scenarios 1+2: throughput and CPU", throughput.run, throughput.markdown
    ),
    Scenario(frozenset({3}), "scenario 3: latency", latency.run, latency.markdown),
    Scenario(frozenset({4}), "scenario 4: memory", memory.run, memory.markdown),
    Scenario(frozenset({5}), "scenario 5: sockets", sockets.run, sockets.markdown),
    Scenario(
        frozenset({7}),
        "scenario 7: acp-proxy component in the conductor",
        component.run,
        component.markdown,
    ),
    Scenario(
        frozenset({9}),
        "scenario 9: the policy's decision cost",
        policy.run,
        policy.markdown,
    ),
    Scenario(
        frozenset({8}),
        "scenario 8: a client that falls behind (coalescing on and off)",
        slow_client.run,
        slow_client.markdown,
    ),
)
