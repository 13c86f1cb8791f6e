"""The ledger: what every limit's keys have spent, when their windows started, and the merge
with the state file that several proxies may share.

Contract: pure (no I/O, no clock: ``now`` is given, in seconds since the epoch). Owns the rules
of spend: a key's spend only grows (``add``; the loop guard's meter keeps the longest run,
``record_run``) until its window ends (``window`` seconds after its first spend, then it starts
from zero) or a human clears it; a limit is crossed when its spend is past ``max`` (``turns``: when
``max`` prompts went, so the next is the one refused); the maximum in force is the state file's
override (``acp-proxy budgets set``) or else the config's. What changed since the last write is
kept as pending (``absorb`` lays it over what the file holds now, so proxies sharing one file add
up their spend instead of overwriting it; limits the file has and this config does not are kept
as they are). Bounded: at most ``MAX_KEYS`` keys per limit and ``MAX_KEYS`` sessions' last
cost, the least recently touched forgotten first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.base.values import value
from acp_proxy.budget.model import Limit, Meter, Per

STATE_VERSION: Final = 1
MAX_KEYS: Final = 10_000
PROCESS_KEY: Final = "process"
MAX_PENDING: Final = 1000  # amounts kept one by one per key between two writes


class StateError(ValueError):
    """The state file holds something that is not a budget state (it is never overwritten)."""


def key_of(limit: Limit, session_id: str) -> str:
    """The key of ``limit`` that a session's spend goes to."""
    if limit.per is Per.SESSION:
        return session_id
    if limit.per is Per.PROCESS:
        return PROCESS_KEY
    return f"label:{limit.label}"


def is_crossed(meter: Meter, spent: float, maximum: float) -> bool:
    """Whether ``spent`` is past ``maximum`` (``turns``: reached it, the next prompt would pass)."""
    return spent >= maximum if meter is Meter.TURNS else spent > maximum


@dataclass(slots=True)
class Entry:
    """One key's spend in its current window."""

    spent: float = 0.0
    since: float | None = None  # the window's start: the first spend in it
    touched: float = 0.0  # the last change (the least recently touched key goes first)


@value
class Status:
    """One key of one limit, now."""

    limit: Limit
    key: str
    spent: float
    max: float
    remaining: float
    crossed: bool
    resets_at: float | None  # when the window ends (None: no window, or nothing spent yet)


@value
class Crossing:
    """A threshold that one change of spend went past: a ``warn_at`` fraction, or (``fraction``
    ``None``) the limit itself."""

    limit: Limit
    key: str
    fraction: float | None
    spent: float
    max: float
    resets_at: float | None


def _live(limit: Limit, entry: Entry | None, now: float) -> Entry | None:
    """``entry`` unless its window is over (then nothing was spent in the current one)."""
    if entry is None:
        return None
    if limit.window is not None and entry.since is not None and now >= entry.since + limit.window:
        return None
    return entry


def _number(data: JsonValue) -> float | None:
    if isinstance(data, bool) or not isinstance(data, (int, float)):
        return None
    return float(data) if math.isfinite(data) else None


class Ledger:
    """The spend of ``limits`` (see the module). ``overrides``: maxima set in the state file."""

    def __init__(self, limits: tuple[Limit, ...]) -> None:
        self.limits = limits
        self._by_name = {limit.name: limit for limit in limits}
        self.overrides: dict[str, float] = {}
        self.entries: dict[str, dict[str, Entry]] = {limit.name: {} for limit in limits}
        # Changes not yet in the file: (limit, key) -> the amounts added in order (laid over the
        # file in the same order, they give the same sum to the last bit), or the longest run.
        self.pending: dict[tuple[str, str], list[float]] = {}
        self.cost_seen: dict[str, float] = {}  # sessionId -> its last cumulative cost
        self._cost_dirty: set[str] = set()
        self._foreign: JsonObject = {}  # limits of the file that this config does not have

    def reconfigure(self, limits: tuple[Limit, ...]) -> None:
        """New limits (a reloaded config): the spend of the names kept is kept."""
        self.limits = limits
        self._by_name = {limit.name: limit for limit in limits}
        self.entries = {limit.name: self.entries.get(limit.name, {}) for limit in limits}
        self.pending = {k: v for k, v in self.pending.items() if k[0] in self._by_name}

    @property
    def dirty(self) -> bool:
        """Whether something changed since the last write."""
        return bool(self.pending or self._cost_dirty)

    def limit(self, name: str) -> Limit | None:
        return self._by_name.get(name)

    def max_of(self, limit: Limit) -> float:
        return self.overrides.get(limit.name, limit.max)

    def status(self, limit: Limit, key: str, now: float) -> Status:
        entry = _live(limit, self.entries[limit.name].get(key), now)
        spent = entry.spent if entry is not None else 0.0
        maximum = self.max_of(limit)
        resets = None
        if limit.window is not None and entry is not None and entry.since is not None:
            resets = entry.since + limit.window
        return Status(
            limit,
            key,
            spent,
            maximum,
            max(maximum - spent, 0.0),
            is_crossed(limit.meter, spent, maximum),
            resets,
        )

    # -- spending

    def add(self, limit: Limit, key: str, amount: float, now: float) -> list[Crossing]:
        """Spend ``amount`` (> 0; other amounts change nothing) on ``key``: what it crossed."""
        if not amount > 0 or not math.isfinite(amount):
            return []
        return self._change(limit, key, now, amount, run=False)

    def record_run(self, limit: Limit, key: str, run: int, now: float) -> list[Crossing]:
        """A run of ``run`` identical tool calls: the key's spend is its longest run."""
        if run <= 0:
            return []
        return self._change(limit, key, now, float(run), run=True)

    def _change(
        self, limit: Limit, key: str, now: float, amount: float, *, run: bool
    ) -> list[Crossing]:
        table = self.entries[limit.name]
        entry = _live(limit, table.get(key), now)
        if entry is None:
            entry = Entry(since=now)
            table.pop(key, None)
            if len(table) >= MAX_KEYS:
                del table[min(table, key=lambda k: table[k].touched)]
            table[key] = entry
        before = entry.spent
        after = max(before, amount) if run else before + amount
        if after == before:
            return []
        entry.spent = after
        entry.touched = now
        slot = (limit.name, key)
        had = self.pending.setdefault(slot, [])
        if run:
            had[:] = [max(had[0], amount)] if had else [amount]
        else:
            had.append(amount)
            if len(had) > MAX_PENDING:  # writes keep failing: bounded, at the cost of a bit
                had[:] = [math.fsum(had)]
        return self._crossed(limit, key, before, after, entry)

    def _crossed(
        self, limit: Limit, key: str, before: float, after: float, entry: Entry
    ) -> list[Crossing]:
        maximum = self.max_of(limit)
        resets = entry.since + limit.window if limit.window and entry.since is not None else None
        out = [
            Crossing(limit, key, w, after, maximum, resets)
            for w in limit.warn_at
            if before < w * maximum <= after
        ]
        if is_crossed(limit.meter, after, maximum) and not is_crossed(limit.meter, before, maximum):
            out.append(Crossing(limit, key, None, after, maximum, resets))
        return out

    def cost_delta(self, session_id: str, amount: float) -> float:
        """The increase of a session's cumulative cost since its last report (0 for the first
        report of a session never seen, and when the amount went down: a new baseline)."""
        seen = self.cost_seen.get(session_id)
        if seen == amount:
            return 0.0
        if seen is None and len(self.cost_seen) >= MAX_KEYS:
            del self.cost_seen[next(iter(self.cost_seen))]
        self.cost_seen.pop(session_id, None)
        self.cost_seen[session_id] = amount  # the newest last (the oldest is forgotten first)
        self._cost_dirty.add(session_id)
        return amount - seen if seen is not None and amount > seen else 0.0

    def forget_cost(self, session_id: str) -> None:
        """A session's cost was cleared (``cost: null``): its next report is a new baseline."""
        if self.cost_seen.pop(session_id, None) is not None:
            self._cost_dirty.add(session_id)

    # -- the state file

    def to_json(self) -> JsonObject:
        """The whole state, as the file holds it."""
        limits: JsonObject = dict(self._foreign)
        for limit in self.limits:
            spend: JsonObject = {
                key: {"spent": e.spent, "since": e.since, "touched": e.touched}
                for key, e in self.entries[limit.name].items()
            }
            limits[limit.name] = {
                "meter": limit.meter.value,
                "per": limit.per.value,
                "max": limit.max,
                "window": limit.window_text,
                "spend": spend,
            }
        overrides: JsonObject = dict(self.overrides)
        cost: JsonObject = dict(self.cost_seen)
        return {"version": STATE_VERSION, "limits": limits, "overrides": overrides, "cost": cost}

    def absorb(self, data: JsonValue, now: float) -> None:
        """Take the file's state (``data``; ``None``: no file yet) and lay the pending changes
        over it. Raises ``StateError`` for a file that is not a budget state."""
        if data is None:
            data = {"version": STATE_VERSION}
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise StateError(f"not a budget state (version {STATE_VERSION} expected)")
        limits = data.get("limits", {})
        overrides = data.get("overrides", {})
        cost = data.get("cost", {})
        if not (isinstance(limits, dict) and isinstance(overrides, dict)):
            raise StateError('"limits" and "overrides" must be objects')
        if not isinstance(cost, dict):
            raise StateError('"cost" must be an object')
        entries: dict[str, dict[str, Entry]] = {}
        for limit in self.limits:
            entries[limit.name] = self._entries(limits.get(limit.name), limit.name)
        new_overrides: dict[str, float] = {}
        for name, raw in overrides.items():
            number = _number(raw)
            if number is None or number < 0:
                raise StateError(f'overrides "{name}" must be a number >= 0')
            new_overrides[name] = number
        seen: dict[str, float] = {}
        for sid, raw in cost.items():
            number = _number(raw)
            if number is not None:
                seen[sid] = number
        for sid in self._cost_dirty:
            if sid in self.cost_seen:
                seen[sid] = self.cost_seen[sid]
            else:
                seen.pop(sid, None)
        self._foreign = {k: v for k, v in limits.items() if k not in self._by_name}
        self.entries = entries
        self.overrides = new_overrides
        self.cost_seen = seen
        # Laid over the file's spend; ``_change`` keeps them pending (unsaved until ``saved``).
        pending, self.pending = self.pending, {}
        for (name, key), amounts in pending.items():
            limit = self._by_name[name]
            for amount in amounts:
                self._change(limit, key, now, amount, run=limit.meter is Meter.REPEATED_TOOL_CALL)

    def _entries(self, raw: JsonValue, name: str) -> dict[str, Entry]:
        if raw is None:
            return {}
        if not isinstance(raw, dict) or not isinstance(raw.get("spend", {}), dict):
            raise StateError(f'limits "{name}" must be an object with a "spend" object')
        out: dict[str, Entry] = {}
        spend = raw.get("spend", {})
        assert isinstance(spend, dict)
        for key, item in spend.items():
            if not isinstance(item, dict):
                raise StateError(f'limits "{name}" spend "{key}" must be an object')
            spent = _number(item.get("spent"))
            since = item.get("since")
            touched = _number(item.get("touched", 0.0))
            if spent is None or spent < 0 or touched is None:
                raise StateError(f'limits "{name}" spend "{key}": bad "spent" or "touched"')
            if since is not None and _number(since) is None:
                raise StateError(f'limits "{name}" spend "{key}": bad "since"')
            out[key] = Entry(spent, _number(since), touched)
        return out

    def saved(self) -> None:
        """The state as ``to_json`` gave it is in the file."""
        self.pending = {}
        self._cost_dirty = set()
