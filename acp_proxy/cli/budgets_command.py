"""``acp-proxy budgets show | set | reset``: a budget state file read and changed by a human, also
while proxies use it.

Contract: owns the three commands. Each works on the state file under its lock (the proxies'
``acp_proxy.shell.control.budget_runtime.locked``), so a change made while a proxy runs is seen at
its next write (before its next prompt is forwarded). ``set NAME VALUE`` puts an override of the
limit's ``max`` in the file (``default`` removes it); ``reset NAME [KEY]`` forgets the spend of one
key of a limit or all of them; ``show`` lists each limit's spend, window and state. Exit codes: 0
done, 1 a state file that cannot be read or written, 2 a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from acp_proxy.budget.budget_model import Meter
from acp_proxy.budget.ledger import STATE_VERSION, is_crossed
from acp_proxy.cli import flags
from acp_proxy.config import ConfigError, load_config
from acp_proxy.shell.control.budget_runtime import locked, read_state, write_state


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acp-proxy budgets",
        description="Show and change the budgets' state file (also while proxies use it).",
    )
    where = argparse.ArgumentParser(add_help=False)
    group = where.add_mutually_exclusive_group(required=True)
    flags.add(group, "--config", "the config file (its budgets.state)")
    group.add_argument("--state", metavar="FILE", help="the state file itself")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", parents=[where], help="each limit's spend, window and state")
    show.add_argument("--json", action="store_true", help="print the state file's JSON")
    setting = sub.add_parser(
        "set", parents=[where], help="override a limit's max (raising it resumes the sessions)"
    )
    setting.add_argument("name")
    setting.add_argument("value", help='a number >= 0, or "default" for the config\'s max')
    reset = sub.add_parser("reset", parents=[where], help="forget what a limit's keys spent")
    reset.add_argument("name")
    reset.add_argument("key", nargs="?", help="one key (a sessionId, process, label:NAME)")
    return parser


def _when(seconds: object) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="seconds")


def _rows(state: Any, now: float) -> list[list[str]]:
    rows = [["limit", "key", "meter", "spent", "max", "remaining", "window", "resets at", "state"]]
    limits = state.get("limits", {}) if isinstance(state, dict) else {}
    overrides = state.get("overrides", {}) if isinstance(state, dict) else {}
    for name, limit in sorted(limits.items()):
        if not isinstance(limit, dict):
            continue
        meter = str(limit.get("meter"))
        given = overrides.get(name, limit.get("max"))
        maximum = float(given) if isinstance(given, (int, float)) else math.inf
        shown_max = f"{maximum:g}" + (" (set)" if name in overrides else "")
        window = limit.get("window")
        seconds = _window_seconds(window)
        spend = limit.get("spend") or {"-": {"spent": 0.0}}
        for key, entry in sorted(spend.items()):
            spent = float(entry.get("spent", 0.0))
            since = entry.get("since")
            if seconds is not None and isinstance(since, (int, float)) and now >= since + seconds:
                spent, since = 0.0, None  # the window is over
            resets = since + seconds if seconds is not None and since is not None else None
            crossed = meter in set(Meter) and is_crossed(Meter(meter), spent, maximum)
            rows.append(
                [
                    name,
                    key,
                    meter,
                    f"{spent:g}",
                    shown_max,
                    f"{max(maximum - spent, 0.0):g}",
                    str(window or "-"),
                    _when(resets),
                    "CROSSED (prompts refused)" if crossed else "ok",
                ]
            )
    return rows


def _window_seconds(window: object) -> float | None:
    from acp_proxy.budget.budget_parse import duration_seconds

    return duration_seconds(window) if isinstance(window, str) else None


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    path = args.state
    names: set[str] = set()
    if args.config is not None:
        try:
            config = load_config(args.config, os.environ, instantiate=False)
        except (ConfigError, OSError) as exc:
            print(f"acp-proxy budgets: {exc}", file=sys.stderr)
            return 2
        if config.budgets is None:
            print(f"acp-proxy budgets: {args.config} has no budgets section", file=sys.stderr)
            return 2
        path = config.budgets.state
        names = {limit.name for limit in config.budgets.limits}
    try:
        if args.command == "show":
            state = locked(path, lambda: read_state(path))
            if state is None:
                print(f"{path}: no state yet (nothing spent)")
                return 0
            if args.json:
                import orjson

                sys.stdout.write(orjson.dumps(state, option=orjson.OPT_INDENT_2).decode() + "\n")
            else:
                _print_table(_rows(state, time.time()))
            return 0
        return int(locked(path, lambda: _change(args, path, names)))
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"acp-proxy budgets: {path}: {reason}", file=sys.stderr)
        return 1


def _change(args: argparse.Namespace, path: str, names: set[str]) -> int:
    state = read_state(path) or {"version": STATE_VERSION}
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"not a budget state (version {STATE_VERSION} expected)")
    limits = state.setdefault("limits", {})
    known = names | set(limits)
    if args.name not in known:
        listed = ", ".join(sorted(known)) or "none yet"
        print(
            f"acp-proxy budgets: no limit named {args.name!r} (limits: {listed})", file=sys.stderr
        )
        return 2
    if args.command == "set":
        overrides = state.setdefault("overrides", {})
        if args.value == "default":
            overrides.pop(args.name, None)
            said = f"{args.name}: max back to the config's"
        else:
            try:
                value = float(args.value)
            except ValueError:
                value = math.nan
            if not math.isfinite(value) or value < 0:
                print(f"acp-proxy budgets: {args.value!r} is not a number >= 0", file=sys.stderr)
                return 2
            overrides[args.name] = value
            said = f"{args.name}: max {value:g}"
    else:
        spend = limits.get(args.name, {}).get("spend", {})
        if args.key is None:
            spend.clear()
            said = f"{args.name}: spend forgotten"
        elif spend.pop(args.key, None) is None:
            print(f"acp-proxy budgets: {args.name} has no key {args.key!r}", file=sys.stderr)
            return 2
        else:
            said = f"{args.name} {args.key}: spend forgotten"
    write_state(path, state)
    print(f"{path}: {said} (running proxies see it before their next prompt)")
    return 0
