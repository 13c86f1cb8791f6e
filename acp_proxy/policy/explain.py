"""``check-config``'s explanation of a ``policy:`` section, in plain words.

Contract: a pure function from ``Policy`` to lines of text.
"""

from __future__ import annotations

import shlex

from acp_proxy.policy.model import Match, OnUnasked, Policy, PolicyMode


def _conditions(match: Match) -> str:
    parts: list[str] = []
    if match.methods is not None:
        parts.append("method " + " or ".join(match.methods))
    if match.kinds is not None:
        parts.append("kind " + " or ".join(match.kinds))
    if match.agents is not None:
        parts.append("agent " + " or ".join(match.agents))
    if match.commands is not None:
        parts.append("command starting " + " or ".join(repr(shlex.join(p)) for p in match.commands))
    if match.paths is not None:
        parts.append("a path in " + ", ".join(g.source for g in match.paths))
    if match.paths_outside is not None:
        parts.append("a path outside " + ", ".join(g.source for g in match.paths_outside))
    if match.title_source is not None:
        parts.append(f"title matching /{match.title_source}/")
    return ", ".join(parts) if parts else "every decided request"


def explain_policy(policy: Policy) -> list[str]:
    """The lines ``check-config`` prints for ``policy``."""
    mode = (
        "enforce (decisions are applied)"
        if policy.mode is PolicyMode.ENFORCE
        else "monitor (decisions are audited; everything is forwarded)"
    )
    forbid = ", ".join(sorted(policy.forbid_modes)) or "none"
    if policy.on_unasked is OnUnasked.AUDIT:
        unasked = "audited"
    elif policy.mode is PolicyMode.ENFORCE:
        unasked = "audited, and its session cancelled (session/cancel)"
    else:
        unasked = "audited (on_unasked: cancel applies in enforce mode only)"
    lines = [
        f"policy: {mode}; default {policy.default.value}; forbidden modes: {forbid}",
        f"  audit: {policy.audit or 'off'}; policy hash {policy.digest[:16]}",
        f"  a tool call a deny rule matches that ran without asking: {unasked}",
    ]
    if not policy.rules:
        lines.append("  rules: none (the default decides)")
        return lines
    lines.append(
        f"  rules ({len(policy.rules)}; among the matching rules of the highest priority, "
        "deny beats ask beats allow):"
    )
    for i, rule in enumerate(policy.rules, 1):
        where = f" (line {rule.line})" if rule.line is not None else ""
        extra = "" if not rule.priority else f", priority {rule.priority}"
        remember = ", remembered (allow_always)" if rule.remember else ""
        lines.append(f"    {i}. {rule.name}{where}: {rule.decision.value}{extra}{remember}")
        lines.append(f"       when {_conditions(rule.match)}")
    return lines
