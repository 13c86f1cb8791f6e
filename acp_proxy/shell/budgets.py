"""Budgets at run time: the state file, the link in every connection's chain, and what a
budget event becomes (a log event, a metric, an audit line).

Contract: owns the state file (``StateFile``): read and written under an exclusive ``flock`` of
``STATE.lock``, so proxies sharing it add their spend up (``Ledger.absorb``); written whole to a
temporary file (``0600``, fsynced) renamed over it, so a reader never sees half a state; an
existing file that is a link, someone else's, or readable by others is refused like a record
file (``acp_proxy.record.settings.refusal``). Any failure is returned as the reason, and the
link refuses prompts with it (fail closed) until a write succeeds again. ``run_with_budgets``
puts the link first in the chain of every connection (before the policy's), writes the state
once before any agent starts (a failure is logged; the proxy runs and refuses prompts), watches
the config file for a changed ``max`` (re-read at the next write when the file's modification
time changed: SIGHUP already ends the proxy), and reports each event. The audit line goes to
the policy's audit file when one is open (one hash chain per file).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import functools
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from acp_proxy.budget.ledger import Ledger, StateError, key_of
from acp_proxy.budget.middleware import NAME, BudgetEvent, BudgetMiddleware
from acp_proxy.budget.model import Budgets, Per
from acp_proxy.config import Config, ConfigError, MiddlewareSpec, load_config
from acp_proxy.record.settings import refusal
from acp_proxy.shell.logsetup import get_logger

# The state file is small (at most MAX_KEYS keys per limit); a bigger one is not ours.
MAX_STATE_BYTES = 64 * 1024 * 1024
_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW


def read_state(path: str) -> Any:
    """The parsed state file (``None``: there is none yet). Raises ``OSError`` (a refused
    file as ``EPERM`` with the reason) or ``StateError``."""
    try:
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.EPERM, "it is a symbolic link", path) from None
        raise
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        why = refusal(st.st_mode, st.st_uid, os.geteuid(), "budget state")
        if why is not None:
            raise OSError(errno.EPERM, why, path)
        data = handle.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise StateError(f"bigger than {MAX_STATE_BYTES} bytes")
    if not data.strip():
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise StateError(f"not JSON ({exc})") from None


def write_state(path: str, state: object, *, durable: bool = True) -> None:
    """Replace ``path`` with ``state`` at once: a private temporary file (fsynced when
    ``durable``: it survives a crash of the machine, not only of the proxy), renamed."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _FLAGS, 0o600)
    try:
        data = orjson.dumps(state, option=orjson.OPT_INDENT_2) + b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def locked(path: str, work: Callable[[], Any]) -> Any:
    """``work()`` under an exclusive lock of ``path`` (its ``.lock`` file, created ``0600``)."""
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | _FLAGS, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return work()
    finally:
        os.close(fd)  # closing releases the lock


def _reason(path: str, exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"{path}: {exc.strerror or exc}"
    return f"{path}: {exc}"


class StateFile:
    """The ledger's state file: ``sync`` reads it (others' spend, the overrides), lays the
    ledger's changes over it and writes it back (every time: a file that can no longer be
    written is found at once), fsynced when ``durable`` (before a prompt is forwarded) and
    something changed; the reason it could not, or ``None``."""

    def __init__(self, path: str, ledger: Ledger, reload: Callable[[], None] | None = None):
        self.path = path
        self.ledger = ledger
        self._reload = reload

    def sync(self, durable: bool = True) -> str | None:
        if self._reload is not None:
            self._reload()

        def work() -> None:
            dirty = self.ledger.dirty
            self.ledger.absorb(read_state(self.path), time.time())
            write_state(self.path, self.ledger.to_json(), durable=durable and dirty)
            self.ledger.saved()

        try:
            locked(self.path, work)
        except (OSError, StateError) as exc:
            return _reason(self.path, exc)
        return None


class ConfigWatch:
    """Re-reads the config file when its modification time changed, and gives the ledger the
    new limits (a raised ``max`` lets the next prompt through); a file that no longer parses is
    logged and the limits in force stay."""

    def __init__(self, path: str, ledger: Ledger) -> None:
        self.path = path
        self.ledger = ledger
        self._mtime = self._stat()

    def _stat(self) -> int | None:
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return None

    def __call__(self) -> None:
        mtime = self._stat()
        if mtime is None or mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            config = load_config(self.path, os.environ, instantiate=False)
        except (ConfigError, OSError) as exc:
            get_logger().error("budgets not reloaded: the config file has errors", error=str(exc))
            return
        if config.budgets is None:
            get_logger().warning("budgets not reloaded: the config file has no budgets section")
            return
        self.ledger.reconfigure(config.budgets.limits)
        get_logger().info(
            "budgets reloaded", limits={lim.name: lim.max for lim in config.budgets.limits}
        )


class BudgetReport:
    """What a ``BudgetEvent`` becomes: a log event, counters and gauges for ``/metrics``, and a
    line in the policy's audit file when one is open."""

    def __init__(self, ledger: Ledger, audit: Callable[[dict[str, Any]], None] | None) -> None:
        self.ledger = ledger
        self.audit = audit
        self.events: dict[tuple[str, ...], int] = {}  # (limit, kind) -> count
        self.latest: dict[str, str] = {}  # limit -> the key that spent last

    def __call__(self, event: BudgetEvent) -> None:
        fields = {k: v for k, v in dataclasses.asdict(event).items() if v is not None}
        kind = fields.pop("kind")
        log = get_logger()
        if kind == "unrecorded":
            log.error("budget state not recorded: prompts are refused", **fields)
        elif kind == "warning":
            log.warning("budget warning", **fields)
        else:
            log.warning(f"budget {kind}", **fields)
        label = event.limit or ""
        self.events[(label, kind)] = self.events.get((label, kind), 0) + 1
        if event.limit is not None and event.key is not None:
            self.latest[event.limit] = event.key
        if self.audit is not None:
            self.audit({"event": f"budget.{kind}", **fields})

    def collect(self) -> Any:
        """The Prometheus families (``/metrics``): events by limit and kind; for each limit,
        spend and remaining of its key (per session: the session that spent last)."""
        from acp_proxy.telemetry.families import counter_family, gauge_family

        yield counter_family(
            "budget_events",
            "Budget events: warning, reached, refused (a prompt answered with an error), "
            "cancelled (session/cancel sent), unrecorded (the state file could not be written).",
            ["limit", "kind"],
            dict(self.events),
        )
        now = time.time()
        spent: dict[tuple[str], float] = {}
        remaining: dict[tuple[str], float] = {}
        for limit in self.ledger.limits:
            key = self.latest.get(limit.name)
            if key is None and limit.per is not Per.SESSION:
                key = key_of(limit, "")
            if key is None:
                continue
            status = self.ledger.status(limit, key, now)
            spent[(limit.name,)] = status.spent
            remaining[(limit.name,)] = status.remaining
        yield gauge_family(
            "budget_spent", "Spend of each limit's key (per session: the last).", ["limit"], spent
        )
        yield gauge_family(
            "budget_remaining",
            "What each limit's key may still spend (per session: the last).",
            ["limit"],
            remaining,
        )


def with_budgets(config: Config, link: Callable[[], BudgetMiddleware]) -> Config:
    """``config`` with the budgets link first in its chain (a refused prompt reaches no other
    link)."""
    spec = MiddlewareSpec(NAME, link, use=NAME)
    return dataclasses.replace(config, middleware=(spec, *config.middleware))


def _policy_audit() -> Callable[[dict[str, Any]], None] | None:
    from acp_proxy.shell import policyaudit

    writer = policyaudit.OPEN_WRITERS[-1] if policyaudit.OPEN_WRITERS else None
    return writer.write_fields if writer is not None else None


def _metrics_registries() -> list[Any]:
    from acp_proxy.shell import hooks

    return [r for p in hooks.process_observers() if (r := getattr(p, "registry", None))]


async def run_with_budgets(main: Callable[..., Awaitable[int]], config: Config, *rest: Any) -> int:
    """Run ``main(config, *rest)`` with the budgets link in the chain; the state file is written
    once first (a failure is logged: the proxy runs, and refuses prompts with the reason)."""
    budgets: Budgets | None = config.budgets
    assert budgets is not None
    ledger = Ledger(budgets.limits)
    watch = ConfigWatch(config.source, ledger) if config.source is not None else None
    store = StateFile(budgets.state, ledger, watch)
    report = BudgetReport(ledger, _policy_audit())
    log = get_logger()
    reason = store.sync()
    log.info(
        "budgets",
        state=budgets.state,
        limits=[lim.name for lim in budgets.limits],
        policy_audit=report.audit is not None,
    )
    if reason is not None:
        log.error("budget state cannot be recorded: prompts will be refused", reason=reason)
    registries = _metrics_registries()
    for registry in registries:
        registry.register(report)
    link = functools.partial(BudgetMiddleware, ledger, time.time, store.sync, report)
    try:
        return await main(with_budgets(config, link), *rest)
    finally:
        for registry in registries:
            registry.unregister(report)
        if ledger.dirty:  # the spend since the last write
            reason = store.sync()
            if reason is not None:
                log.error("budget state not recorded at exit", reason=reason)
