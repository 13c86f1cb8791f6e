"""The policy as a link of the chain: one connection's requests decided, answered and audited.

Contract: ``PolicyMiddleware`` applies a ``Policy`` to one connection. From the agent:
``session/request_permission`` is answered with an offered option (allow, deny) or forwarded
as it came (ask); ``fs/read_text_file``, ``fs/write_text_file`` and ``terminal/create`` are
refused with a JSON-RPC error (deny) or forwarded (allow, ask: the editor does the work).
From the client: ``session/set_mode`` / ``session/set_config_option`` to a value in
``forbid_modes`` is refused with a JSON-RPC error. In ``monitor`` mode every decision is made
and audited, and everything is forwarded. A request that cannot be read, or whose evaluation
fails, is forwarded (``ask``), never dropped. Each decision goes to ``sink`` as an
``AuditEntry`` (the shell writes it) and to ``marks`` (the chain hands them to the observers:
metrics, the live view); a request that cannot be read is not a decision. A ``tool_call`` /
``tool_call_update`` showing a call that ran unasked and that a deny rule matches is audited
(the proxy can only tell), and with ``on_unasked: cancel`` (enforce mode) answered with a
``session/cancel`` for its session. Pure: no I/O of its own.

Off every other frame: with no ``policy:`` section the link is not in the chain at all; with
one it declares its ``concerns`` (the requests above, by method, and the ``session/new``
responses that name a session), so the pipeline hands it those requests without looking for
them in any frame, and its needles are the tool call updates only, when a rule can decide a
permission request (the state of a tool call is what a v1 request is decided on).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import Field
from typing import Any, ClassVar

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.base.values import value
from acp_proxy.policy.decide import names_match, pick
from acp_proxy.policy.fastdecide import decider_for
from acp_proxy.policy.globs import Undecidable
from acp_proxy.policy.model import Decision, OnUnasked, Policy, PolicyMode, Request
from acp_proxy.policy.requests import PERMISSION, READ, TERMINAL, WRITE, Resolve, Summaries
from acp_proxy.wire.chain import FORWARD, Concerns, Direction, ForwardWith, MessageContext, Reply
from acp_proxy.wire.chain import Verdict as Action
from acp_proxy.wire.errors import POLICY_DENIED, error_object

NAME = "policy"
# The ``method`` of an audit line for a tool call that ran without a permission request.
UNASKED = "session/update"
_A2C = Direction.AGENT_TO_CLIENT
_C2A = Direction.CLIENT_TO_AGENT
_DECIDED = frozenset({PERMISSION, READ, WRITE, TERMINAL})
_MODES = frozenset({"session/set_mode", "session/set_config_option"})
_SESSIONS = frozenset({"session/new", "session/load", "session/resume"})
_TOOL_CALLS = ("tool_call", "tool_call_update")
# The tool call updates, as their bytes read (``sessionUpdate``'s exact values).
TOOL_CALL_NEEDLES = (b'"tool_call"', b'"tool_call_update"')
_VALUES = {d: d.value for d in Decision}


@value
class AuditEntry:
    """One decision, as the audit file records it (the shell adds the time and the chain)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass to mypy, too

    session: str | None
    agent: str | None
    method: str
    summary: JsonObject  # kind, argv, paths, title (redacted by the writer)
    rule: str | None
    decision: str  # allow | deny | ask
    option: str | None  # the option answered; None: the cancelled outcome or none
    mode: str  # enforce | monitor
    forwarded: bool  # the request went on to its receiver (ask, monitor, an allowed fs call)
    # A tool call that ran unasked: ``session/cancel`` was sent for its session.
    cancelled: bool = False


Sink = Callable[[AuditEntry], None]


def audit_fields(entry: AuditEntry) -> JsonObject:
    """The fields of ``entry``'s audit line, in order (``cancelled`` only when true)."""
    fields: JsonObject = dataclasses.asdict(entry)
    if not entry.cancelled:
        del fields["cancelled"]
    return fields


def _summary_json(request: Request | None) -> JsonObject:
    if request is None:
        return {}
    out: JsonObject = {}
    if request.kind is not None:
        out["kind"] = request.kind
    if request.argv is not None:
        out["argv"] = list(request.argv)
    if request.paths:
        out["paths"] = list(request.paths)
    if request.title is not None:
        out["title"] = request.title
    return out


def concerns(policy: Policy) -> Concerns:
    """What the policy link is handed (``wire.chain.Concerns``): the agent's decided requests,
    the client's session requests (their cwd) and, with ``forbid_modes``, its mode switches;
    the responses to ``session/new`` (they name the session)."""
    requests = {(_A2C, m) for m in _DECIDED} | {(_C2A, m) for m in _SESSIONS}
    if policy.forbid_modes:
        requests |= {(_C2A, m) for m in _MODES}
    return Concerns(frozenset(requests), frozenset({"session/new"}))


def reads_tool_calls(policy: Policy) -> bool:
    """Whether a rule can decide a permission request: the tool call updates are then read
    (the state a v1 request is decided on, and the calls that ran unasked)."""
    return any(
        rule.match.methods is None or names_match(rule.match.methods, PERMISSION)
        for rule in policy.rules
    )


class PolicyMiddleware:
    """The policy of one connection (a fresh instance per connection)."""

    def __init__(self, policy: Policy, sink: Sink | None, resolve: Resolve) -> None:
        self.policy = policy
        self._decider = decider_for(policy)
        self._sink = sink
        self._enforce = policy.mode is PolicyMode.ENFORCE
        self._mode_name = policy.mode.value
        self._cancel = self._enforce and policy.on_unasked is OnUnasked.CANCEL
        self.state = Summaries(resolve)
        self.last_changed_by: tuple[str, ...] = ()
        self.concerns = concerns(policy)
        self.needles: tuple[bytes, ...] = TOOL_CALL_NEEDLES if reads_tool_calls(policy) else ()
        # The decisions made while handling the current message (the chain takes them).
        self.marks: list[AuditEntry] = []
        self._entries = sink is not None

    @property
    def name(self) -> str:
        return NAME

    def on_initialize(self, response: JsonObject) -> None:
        """The ``initialize`` response (before the chain runs): the agent's name."""
        self.state.initialized(response)

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Action:
        # Whether a decision's entry is read: by the audit file, or by observers (its mark).
        self._entries = self._sink is not None or ctx.observed
        method = message.get("method")
        if ctx.direction is _A2C:
            if method == "session/update":
                params = message.get("params")
                if isinstance(params, dict):
                    update = params.get("update")
                    if isinstance(update, dict) and update.get("sessionUpdate") in _TOOL_CALLS:
                        return self._unasked(params)
                return FORWARD
            if method in _DECIDED and "id" in message:
                return self._decide(message, method)
            return FORWARD
        if method is None:
            return FORWARD
        if method in _SESSIONS:
            self.state.session_request(message)
        elif method in _MODES and "id" in message:
            return self._mode(message, method)
        return FORWARD

    def on_answer(self, method: str, response: JsonObject) -> None:
        """The agent's response to a ``session/new`` (``concerns``): it names the session."""
        if self.state.waits_for(response.get("id")):
            self.state.session_response(response)

    # -- decisions

    def _decide(self, message: JsonObject, method: str) -> Action:
        params = message.get("params")
        sid = params.get("sessionId") if type(params) is dict else None
        request: Request | None = None
        try:
            request = self.state.summary(message)
            if request is None:
                return FORWARD  # cannot be read: the editor decides
            rule = self._decider.deciding_rule(request)
        except (Undecidable, RecursionError, ValueError, TypeError):
            self._audit(sid, method, request, None, Decision.ASK, None, True)
            return FORWARD
        if rule is None:
            name, decision = None, self.policy.default
        else:
            name, decision = rule.name, rule.decision
        option = None
        if method == PERMISSION and decision is not Decision.ASK:
            decision, option = pick(
                decision,
                params.get("options"),  # type: ignore[union-attr]
                remember=rule is not None and rule.remember,
            )
        # Ask goes on to the editor; so does an allowed fs or terminal call (the editor does
        # the work), and everything in monitor mode.
        forwarded = (
            decision is Decision.ASK
            or not self._enforce
            or (method != PERMISSION and decision is Decision.ALLOW)
        )
        self._audit(sid, method, request, name, decision, option, forwarded)
        if forwarded:
            return FORWARD
        self.last_changed_by = (name or "default",)
        if method == PERMISSION:
            if option is None:
                outcome: JsonObject = {"outcome": "cancelled"}
            else:
                outcome = {"outcome": "selected", "optionId": option}
            return Reply({"jsonrpc": "2.0", "id": message["id"], "result": {"outcome": outcome}})
        return Reply(_refusal(message["id"], method, name))

    def _unasked(self, params: JsonObject) -> Action:
        """A tool call that ran without a permission request: audited when a deny rule
        matches it (agents in permissive modes do not ask; the proxy can only tell), and with
        ``on_unasked: cancel`` its session cancelled (``session/cancel``, the same
        notification in v1 and v2)."""
        try:
            request = self.state.tool_update(params, self._may_deny)
            if request is None:
                return FORWARD
            rule = self._decider.deciding_rule(request)
        except (Undecidable, RecursionError, ValueError, TypeError):
            return FORWARD
        if rule is None or rule.decision is not Decision.DENY:
            return FORWARD
        sid = params.get("sessionId")
        self._audit(sid, UNASKED, request, rule.name, Decision.DENY, None, True, self._cancel)
        if not self._cancel:
            return FORWARD
        self.last_changed_by = (rule.name,)
        cancel: JsonObject = {
            "jsonrpc": "2.0",
            "method": "session/cancel",
            "params": {"sessionId": sid},
        }
        return ForwardWith((cancel,))

    def _may_deny(self, kind: str | None) -> bool:
        return self._decider.may_deny(PERMISSION, kind)

    def _mode(self, message: JsonObject, method: str) -> Action:
        params = message.get("params")
        if not isinstance(params, dict):
            return FORWARD
        wanted = params.get("modeId") if method == "session/set_mode" else params.get("value")
        if not isinstance(wanted, str) or wanted not in self.policy.forbid_modes:
            return FORWARD
        sid = params.get("sessionId")
        if not self._entries:
            return self._mode_verdict(message, wanted)
        summary: JsonObject = {"mode": wanted}
        if method == "session/set_config_option" and isinstance(params.get("configId"), str):
            summary["configId"] = params["configId"]
        self._emit(
            AuditEntry(
                sid if isinstance(sid, str) else None,
                self.state.agent,
                method,
                summary,
                "forbid_modes",
                Decision.DENY.value,
                None,
                self._mode_name,
                not self._enforce,
            )
        )
        return self._mode_verdict(message, wanted)

    def _mode_verdict(self, message: JsonObject, wanted: str) -> Action:
        if not self._enforce:
            return FORWARD
        self.last_changed_by = ("forbid_modes",)
        text = f'acp-proxy policy: mode "{wanted}" is forbidden (forbid_modes)'
        return Reply(error_object(message["id"], POLICY_DENIED, text))

    def _audit(  # noqa: PLR0917 (one line's fields)
        self,
        sid: JsonValue,
        method: str,
        request: Request | None,
        rule: str | None,
        decision: Decision,
        option: str | None,
        forwarded: bool,
        cancelled: bool = False,
    ) -> None:
        if not self._entries:
            return  # nobody reads it: no audit file, no observer
        self._emit(
            AuditEntry(
                sid if type(sid) is str else None,
                self.state.agent,
                method,
                _summary_json(request),
                rule,
                _VALUES[decision],
                option,
                self._mode_name,
                forwarded,
                cancelled,
            )
        )

    def _emit(self, entry: AuditEntry) -> None:
        self.marks.append(entry)
        if self._sink is not None:
            self._sink(entry)


def _refusal(rid: JsonValue, method: str, rule: str | None) -> JsonObject:
    by = f'rule "{rule}"' if rule is not None else "the default"
    return error_object(rid, POLICY_DENIED, f"acp-proxy policy: {method} denied by {by}")
