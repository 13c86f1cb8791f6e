"""Launching the proxy from the command line: what runs before and around its event loop.

Contract: owns the decisions the command line takes just before the proxy runs: whether the
agent starts before the event loop (``starts_early``, ``UNCONFIGURED_AGENT``), the garbage
collector's pause over start-up (``collecting``), and wrapping the chosen entry point in the
metrics endpoints and tracing when they are enabled (``with_telemetry``). It never parses an
option and never reads a config file; optional layers are imported only when enabled.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from acp_proxy.config import Config

# Start-up time: what the proxy allocates before its event loop runs (modules, classes,
# the config, the loop itself) lives as long as the process, so the cyclic garbage collector's
# passes over it (docs/performance.md, "Figures behind the code") find nothing to free. It is off
# from the command line's parsing until the proxy's first coroutine runs; then those objects
# are frozen (gc.freeze: no later collection walks them again) and collection resumes.
COLLECT = {"after_start": False}


async def collecting(main: Callable[..., Awaitable[int]], *args: Any) -> int:
    if COLLECT["after_start"]:
        gc.freeze()
        gc.enable()
    return await main(*args)


# ``Config().agent`` as far as starting the agent reads it: no environment overrides, stderr
# passed through (``spawn.AgentSettings``). The runtime takes the agent started with it only if
# its config's agent section says the same (``spawn.take_early``; a test holds them equal).
class UnconfiguredAgent:
    __slots__ = ()
    env: Mapping[str, str] = MappingProxyType({})
    stderr = "passthrough"


UNCONFIGURED_AGENT = UnconfiguredAgent()


def starts_early(config: Config) -> bool:
    """Whether the agent is started before the event loop: a stdio session whose start nothing
    else can still refuse. With ``--record``, only when the record file can be opened now (one
    that cannot refuses the session before the agent runs; the runtime opens it again, and
    should that fail after all, the agent it never took is killed with the proxy's other
    leftovers). With ``--metrics`` or ``--ui`` only when their address was bound already
    (``bind_endpoints_early``: the address needs no lookup); not with tracing (its exporter is
    set up first), nor on sockets (``--listen`` starts an agent per client, ``--connect``
    none)."""
    if not _stdio_early(config):
        return False
    if config.metrics is None and config.ui.address is None:
        return True  # (the socket layer is not loaded for nothing)
    from acp_proxy.shell.sockets.early import LIVE_VIEW, METRICS, bound_early

    return (config.metrics is None or bound_early(METRICS, config.metrics)) and (
        config.ui.address is None or bound_early(LIVE_VIEW, config.ui.address)
    )


def _stdio_early(config: Config) -> bool:
    """A stdio session nothing but its HTTP endpoints can still refuse (``starts_early``)."""
    return (
        config.listen is None
        and config.connect is None
        and (config.record.path is None or can_record(config.record.path))
        and not config.tracing.enabled
    )


def bind_endpoints_early(config: Config) -> int | None:
    """Before the agent's early start: bind ``--metrics`` and ``--ui`` now when their address
    needs no lookup (an IP literal, a Unix path), so that the agent can start before the event
    loop as it does without them, and a refusal still comes before anything is spawned. The
    exit code of a refusal (said as the event loop would have said it), else None."""
    if not _stdio_early(config) or (config.metrics is None and config.ui.address is None):
        return None
    from acp_proxy.shell.log.logsetup import get_logger
    from acp_proxy.shell.sockets.early import LIVE_VIEW, METRICS, bind_early

    log = get_logger()
    # The order of the event loop's binding: the metrics endpoint wraps the live view.
    if config.metrics is not None:
        code = bind_early(
            config.metrics, METRICS, allow_remote=config.metrics_allow_remote, log=log
        )
        if code is not None:
            return code
    if config.ui.address is not None:
        return bind_early(
            config.ui.address, LIVE_VIEW, allow_remote=config.ui.allow_remote, log=log
        )
    return None


def can_record(path: str) -> bool:
    """Whether the recorder could open ``path`` now: a directory it may create a file in, or a
    file the recorder's own rules accept (``acp_proxy.shell.record.recordfile``). A FIFO is left to
    the recorder alone: opened and closed here, it would give its reader EOF before the
    record."""
    if os.path.isdir(path) or path.endswith(os.sep):
        return os.access(path, os.W_OK | os.X_OK)
    from acp_proxy.shell.record.recordfile import can_record as recorder_can_open

    return recorder_can_open(path)


def missing_record_directory(path: str) -> str | None:
    """The directory a record at ``path`` goes into (``path`` itself when it names a directory,
    else the directory of the file, ``{conn}`` left in the name) when it does not exist, else
    None. The recorder never creates directories: a session whose record has no directory to
    go to runs unrecorded, so ``check-config`` and ``--listen`` refuse it at start-up."""
    target = path if path.endswith(os.sep) or os.path.isdir(path) else os.path.dirname(path)
    return target if target and not os.path.isdir(target) else None


def with_telemetry(
    config: Config, main: Callable[..., Awaitable[int]], *rest: Any
) -> tuple[Any, ...]:
    """``(main, config, *rest)``, wrapped in the metrics endpoints and tracing when they are
    enabled; unchanged, nothing imported, when not."""
    if config.budgets is not None:
        # The budgets link goes first in every connection's chain, inside the policy's wrapper
        # (whose audit file its events share).
        import functools

        from acp_proxy.shell.control.budget_runtime import run_with_budgets

        main = functools.partial(run_with_budgets, main)
    if config.policy is not None:
        # The policy link goes first in every connection's chain; its audit file opens first.
        import functools

        from acp_proxy.shell.control.policy_runtime import run_with_policy

        main = functools.partial(run_with_policy, main)
    run: tuple[Any, ...] = (main, config, *rest)
    if config.tracing.enabled and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true":
        from acp_proxy.shell.telemetry.tracing import run_with_tracing, with_trace_context

        # The trace-context middleware goes last in the chain, so it sees what every other
        # middleware sent.
        config = with_trace_context(config)
        run = (run_with_tracing, config.tracing, main, config, *rest)
    if config.ui.address is not None:
        # The live view (imported only when on): its tap joins the metrics' and tracing's.
        from acp_proxy.shell.ui.live_server import run_with_ui

        run = (run_with_ui, config.ui, config.record, *run)
    if config.metrics is not None:
        from acp_proxy.shell.telemetry.metrics_server import run_with_metrics

        run = (
            run_with_metrics,
            config.metrics,
            config.metrics_allow_remote,
            config.listen is None,  # stdio, --connect: ready once the agent answered initialize
            config.max_pending_requests,
            *run,
        )
    return run
