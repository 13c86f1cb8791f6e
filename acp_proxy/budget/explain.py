"""``check-config``'s explanation of a ``budgets:`` section, in plain words.

Contract: a pure function from ``Budgets`` to lines of text.
"""

from __future__ import annotations

from acp_proxy.budget.model import Action, Budgets, Limit, Meter, Per

_METERS = {
    Meter.COST: "cost (usage_update.cost, in its currency)",
    Meter.TOKENS: "tokens (the turn's usage.totalTokens)",
    Meter.TURNS: "prompts forwarded",
    Meter.TOOL_CALLS: "tool calls",
    Meter.TURN_SECONDS: "seconds of turns",
    Meter.REPEATED_TOOL_CALL: "identical tool calls back to back",
}


def _scope(limit: Limit) -> str:
    if limit.per is Per.SESSION:
        return "per session"
    if limit.per is Per.PROCESS:
        return "for all sessions of this proxy"
    return f'for label "{limit.label}" (every proxy sharing the state file)'


def explain_budgets(budgets: Budgets) -> list[str]:
    """The lines ``check-config`` prints for ``budgets``."""
    lines = [
        f"budgets: state {budgets.state} (0600; when it cannot be written, prompts are refused)"
    ]
    if not budgets.limits:
        lines.append("  limits: none")
        return lines
    lines.append(f"  limits ({len(budgets.limits)}; a crossed limit pauses, never kills):")
    for i, limit in enumerate(budgets.limits, 1):
        where = f" (line {limit.line})" if limit.line is not None else ""
        most = f"{int(limit.max)}" if limit.max.is_integer() else f"{limit.max:g}"
        lines.append(
            f"    {i}. {limit.name}{where}: at most {most} {_METERS[limit.meter]} {_scope(limit)}"
        )
        window = f"every {limit.window_text}" if limit.window_text else "no window (never resets)"
        warn = (
            "warnings at " + ", ".join(f"{w:.0%}" for w in limit.warn_at)
            if limit.warn_at
            else "no warnings"
        )
        if limit.action is Action.CANCEL_TURN:
            then = "cancel the running turn (session/cancel), then refuse the next prompt"
        else:
            then = "let the running turn finish, refuse the next prompt"
        lines.append(f"       {window}; {warn}; when crossed: {then}")
    return lines
