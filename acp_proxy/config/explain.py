"""``acp-proxy check-config``'s explanation of a valid config, in plain words.

Contract: a pure function from ``Config`` to text.
"""

from __future__ import annotations

from acp_proxy.config.model import Config, _json_text, _size_text
from acp_proxy.config.rules import (
    UPSERTS,
    Rule,
    RuleTarget,
    is_glob,
)
from acp_proxy.config.schema import BUILTIN_RULES

# --- explain -------------------------------------------------------------------------------------


def _explain_match(rule: Rule) -> str:
    parts = [f"direction {rule.direction.value}"]
    if rule.method is not None:
        parts.append(f"method {rule.method}" + (" (glob)" if is_glob(rule.method) else ""))
    else:
        parts.append("any method")
    if rule.has_update_filter:
        kinds = list(rule.update_kinds or ())
        if rule.update_upserts:
            kinds.insert(0, UPSERTS)
        parts.append("update " + ", ".join(kinds))
    return ", ".join(parts)


def explain_config(config: Config) -> str:
    """A human-readable summary of ``config`` for ``acp-proxy check-config`` (no final newline)."""
    lines = [f"config: {config.source or '(none: pure pass-through)'}"]
    if config.rules:
        lines.append(
            f"rules ({len(config.rules)}, applied in this order"
            + ("; every match applies):" if len(config.rules) > 1 else "):")
        )
        for i, rule in enumerate(config.rules, 1):
            where = f" (line {rule.line})" if rule.line is not None else ""
            lines.append(f"  {i}. {rule.name}{where}")
            lines.append(f"     match: {_explain_match(rule)}")
            target = (
                "entity _meta (metadata patch; v1 per the v1 mode)"
                if rule.target is RuleTarget.ENTITY
                else "message params._meta (plain object)"
            )
            lines.append(f"     target: {target}; overwrite: {'yes' if rule.overwrite else 'no'}")
            for key, value in rule.set_meta.items():
                lines.append(f"     set    {key} = {_json_text(value)}")
            for key in rule.remove_meta:
                lines.append(f"     remove {key}")
    else:
        lines.append("rules: none")
    if config.middleware_paths:
        lines.append(f"middleware paths: {', '.join(config.middleware_paths)}")
    if config.middleware:
        lines.append("middleware chain (in order):")
        for i, spec in enumerate(config.middleware, 1):
            policy = "fail-closed" if spec.fail_closed else "fail-open"
            if spec.use == BUILTIN_RULES:
                desc = f"rules (built-in, {_count(len(config.rules), 'rule')})"
            else:
                desc = f"{spec.name} = {spec.use}"
                if spec.options:
                    desc += f" with {_json_text(dict(spec.options))}"
            lines.append(f"  {i}. {desc}; {policy}")
    else:
        lines.append("middleware chain: empty (pure pass-through)")
    agent = config.agent
    env = ", ".join(sorted(agent.env)) if agent.env else "none"
    co = config.coalesce
    lines += [
        "settings:",
        f"  v1: mode {config.v1_mode.value}, max_entities {config.v1_max_entities}",
        f"  max_frame_bytes: {config.max_frame_bytes} ({_size_text(config.max_frame_bytes)})",
        f"  max_buffer_bytes: {config.max_buffer_bytes} ({_size_text(config.max_buffer_bytes)}), "
        "process-wide",
        f"  non_json: {config.non_json.value}",
        f"  agent: stderr {agent.stderr.value}, grace_period {agent.grace_period_s:g} s, "
        f"drain_timeout {agent.drain_timeout_s:g} s, "
        f"env overrides: {env}",
        f"  coalesce: {'enabled' if co.enabled else 'disabled'}, "
        f"max_queue_messages {co.max_queue_messages}, "
        f"max_queue_bytes {co.max_queue_bytes} ({_size_text(co.max_queue_bytes)}), "
        f"min_interval_ms {co.min_interval_ms}",
        f"  listen: {config.listen or '(stdio)'}",
        f"  connect: {config.connect or '(spawn the agent command)'}, "
        f"connect_timeout {config.connect_timeout_s:g} s",
        f"  max_connections: {config.max_connections}, "
        f"handshake_timeout {config.handshake_timeout_s:g} s, "
        f"allow_remote: {'yes' if config.allow_remote else 'no'}",
        "  detach: " + _explain_detach(config),
        "  metrics: "
        + (
            f"{config.metrics}, metrics_allow_remote: "
            f"{'yes' if config.metrics_allow_remote else 'no'}"
            if config.metrics
            else "off"
        ),
        "  tracing: "
        + (
            f"enabled (OTLP, configured by OTEL_* variables), inject traceparent: "
            f"{'yes' if config.tracing.inject else 'no'}"
            if config.tracing.enabled
            else "off"
        ),
        "  record: " + _explain_record(config),
    ]
    if config.policy is not None:
        from acp_proxy.policy.explain import explain_policy

        lines += explain_policy(config.policy)
    if config.budgets is not None:
        from acp_proxy.budget.explain import explain_budgets

        lines += explain_budgets(config.budgets)
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _explain_record(config: Config) -> str:
    record = config.record
    if record.path is None:
        return "off (--record PATH turns it on)"
    extra = ""
    if record.redact or record.redact_patterns:
        extra = (
            f", redacting also {_count(len(record.redact), 'key name')} and "
            f"{_count(len(record.redact_patterns), 'pattern')}"
        )
    return f"{record.path}, max_bytes {record.max_bytes} ({_size_text(record.max_bytes)}){extra}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def describe_rule(rule: Rule) -> str:
    """One sentence on what ``rule`` does, for people who have not read the config format."""
    if rule.has_update_filter:
        kinds = list(rule.update_kinds or ())
        if rule.update_upserts:
            kinds.insert(0, "upsert")
        what = f"each {_and(kinds)}"
    elif rule.method is not None:
        what = f"each {rule.method} message"
    else:
        what = "each message"
    sender = {
        "agent_to_client": "the agent sends",
        "client_to_agent": "the client sends",
    }.get(rule.direction.value, "either side sends")
    does = []
    if rule.set_meta:
        does.append("sets " + _and(list(rule.set_meta)))
    if rule.remove_meta:
        does.append("removes " + _and(list(rule.remove_meta)))
    action = ", and ".join(does) if does else "changes nothing"
    if rule.target is RuleTarget.ENTITY:
        where = (
            "in the entity's _meta, as a metadata patch that leaves the agent's other keys alone"
        )
    else:
        where = "in the message's params._meta"
    return f"Rule {rule.name}: on {what} {sender}, it {action} {where}."


def _explain_detach(config: Config) -> str:
    """What survives a dropped client connection (``detach_grace``)."""
    if config.detach_grace_s <= 0:
        return "off (an agent stops when its client's connection ends)"
    size = config.detach_buffer_bytes
    text = (
        f"detach_grace {config.detach_grace_s:g} s, takeover: "
        f"{'yes' if config.takeover else 'no'}, buffer {size} ({_size_text(size)}) or "
        f"{config.detach_buffer_frames} frames per agent"
    )
    if config.listen is None:
        return text + "\n    no effect without listen"
    if config.connect is not None:
        return text + "\n    no effect with connect: only a spawned agent is kept"
    return text
