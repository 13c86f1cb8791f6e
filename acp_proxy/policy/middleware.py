"""The policy as a link of the chain: one connection's requests decided, answered and audited.

Contract: ``PolicyMiddleware`` applies a ``Policy`` to one connection. From the agent:
``session/request_permission`` is answered with an offered option (allow, deny) or forwarded
as it came (ask); ``fs/read_text_file``, ``fs/write_text_file`` and ``terminal/create`` are
refused with a JSON-RPC error (deny) or forwarded (allow, ask: the editor does the work).
From the client: ``session/set_mode`` / ``session/set_config_option`` to a value in
``forbid_modes`` is refused with a JSON-RPC error. In ``monitor`` mode every decision is made
and audited, and everything is forwarded. A request that cannot be read, or whose evaluation
fails, is forwarded (``ask``), never dropped. Each decision goes to ``sink`` as an
``AuditEntry`` (the shell writes it); a request that cannot be read is not a decision. Pure:
no I/O of its own.

The needles keep it off every other frame: with no ``policy:`` section the link is not in the
chain at all, and frames that name none of these methods are never parsed for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import Field
from typing import Any, ClassVar

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.base.values import value
from acp_proxy.policy.decide import Decider, answer
from acp_proxy.policy.globs import Undecidable
from acp_proxy.policy.model import Decision, Policy, PolicyMode, Request, Verdict
from acp_proxy.policy.requests import PERMISSION, Resolve, Summaries
from acp_proxy.wire.chain import FORWARD, Direction, MessageContext, Reply
from acp_proxy.wire.chain import Verdict as Action
from acp_proxy.wire.errors import POLICY_DENIED, error_object

NAME = "policy"
# The ``method`` of an audit line for a tool call that ran without a permission request.
UNASKED = "session/update"
_A2C = Direction.AGENT_TO_CLIENT
_DECIDED = frozenset({PERMISSION, "fs/read_text_file", "fs/write_text_file", "terminal/create"})
_MODES = frozenset({"session/set_mode", "session/set_config_option"})
_SESSIONS = frozenset({"session/new", "session/load", "session/resume"})


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


Sink = Callable[[AuditEntry], None]


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


class PolicyMiddleware:
    """The policy of one connection (a fresh instance per connection)."""

    # Few and short: each is looked for in every frame while a policy is on. A needle that
    # is the start of several names stands for all of them.
    needles: tuple[bytes, ...] = (
        b'"session/request_permission"',
        b'"fs/',  # read_text_file, write_text_file
        b'"terminal/create"',
        b'"session/set_',  # set_mode, set_config_option
        b'"session/new"',
        b'"session/load"',
        b'"session/resume"',
        b'"tool_call',  # tool_call, tool_call_update
        b'"result"',  # the response that names a new session
    )

    def __init__(self, policy: Policy, sink: Sink | None, resolve: Resolve) -> None:
        self.policy = policy
        self._decider = Decider(policy)
        self._sink = sink
        self._enforce = policy.mode is PolicyMode.ENFORCE
        self.state = Summaries(resolve)
        self.last_changed_by: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return NAME

    def on_initialize(self, response: JsonObject) -> None:
        """The ``initialize`` response (before the chain runs): the agent's name."""
        self.state.initialized(response)

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Action:
        method = message.get("method")
        if ctx.direction is _A2C:
            if method is None:
                if "id" in message:
                    self.response(message)
                return FORWARD
            if method == "session/update":
                params = message.get("params")
                if isinstance(params, dict):
                    update = params.get("update")
                    if isinstance(update, dict) and update.get("sessionUpdate") in (
                        "tool_call",
                        "tool_call_update",
                    ):
                        self._unasked(params)
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

    def response(self, message: JsonObject) -> None:
        """A response from the agent (``session/new``'s names its session)."""
        if self.state.waits_for(message.get("id")):
            self.state.session_response(message)

    # -- decisions

    def _decide(self, message: JsonObject, method: str) -> Action:
        params = message.get("params")
        sid = params.get("sessionId") if isinstance(params, dict) else None
        request: Request | None = None
        try:
            request = self.state.summary(message)
            if request is None:
                return FORWARD  # cannot be read: the editor decides
            rule = self._decider.deciding_rule(request)
        except (Undecidable, RecursionError, ValueError, TypeError):
            self._audit(sid, method, request, Verdict(Decision.ASK, None), forwarded=True)
            return FORWARD
        verdict = (
            Verdict(self.policy.default) if rule is None else Verdict(rule.decision, rule.name)
        )
        if verdict.decision is Decision.ASK:
            self._audit(sid, method, request, verdict, forwarded=True)
            return FORWARD
        if method == PERMISSION:
            assert isinstance(params, dict)
            verdict = answer(
                verdict, params.get("options"), remember=rule is not None and rule.remember
            )
            if verdict.decision is Decision.ASK:
                self._audit(sid, method, request, verdict, forwarded=True)
                return FORWARD
        # An allowed fs or terminal call goes on: the editor does the work.
        forwarded = not self._enforce or (
            method != PERMISSION and verdict.decision is Decision.ALLOW
        )
        self._audit(sid, method, request, verdict, forwarded=forwarded)
        if forwarded:
            return FORWARD
        self.last_changed_by = (verdict.rule or "default",)
        if method == PERMISSION:
            if verdict.option_id is None:
                outcome: JsonObject = {"outcome": "cancelled"}
            else:
                outcome = {"outcome": "selected", "optionId": verdict.option_id}
            return Reply({"jsonrpc": "2.0", "id": message["id"], "result": {"outcome": outcome}})
        return Reply(_refusal(message["id"], method, verdict.rule))

    def _unasked(self, params: JsonObject) -> None:
        """A tool call that ran without a permission request: audited when a deny rule
        matches it (agents in permissive modes do not ask; the proxy can only tell)."""
        try:
            request = self.state.tool_update(params)
            if request is None:
                return
            rule = self._decider.deciding_rule(request)
        except (Undecidable, RecursionError, ValueError, TypeError):
            return
        if rule is None or rule.decision is not Decision.DENY:
            return
        sid = params.get("sessionId")
        self._audit(sid, UNASKED, request, Verdict(Decision.DENY, rule.name), forwarded=True)

    def _mode(self, message: JsonObject, method: str) -> Action:
        params = message.get("params")
        if not isinstance(params, dict):
            return FORWARD
        wanted = params.get("modeId") if method == "session/set_mode" else params.get("value")
        if not isinstance(wanted, str) or wanted not in self.policy.forbid_modes:
            return FORWARD
        sid = params.get("sessionId")
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
                self.policy.mode.value,
                not self._enforce,
            )
        )
        if not self._enforce:
            return FORWARD
        self.last_changed_by = ("forbid_modes",)
        text = f'acp-proxy policy: mode "{wanted}" is forbidden (forbid_modes)'
        return Reply(error_object(message["id"], POLICY_DENIED, text))

    def _audit(
        self,
        sid: JsonValue,
        method: str,
        request: Request | None,
        verdict: Verdict,
        *,
        forwarded: bool,
    ) -> None:
        self._emit(
            AuditEntry(
                sid if isinstance(sid, str) else None,
                self.state.agent,
                method,
                _summary_json(request),
                verdict.rule,
                verdict.decision.value,
                verdict.option_id,
                self.policy.mode.value,
                forwarded,
            )
        )

    def _emit(self, entry: AuditEntry) -> None:
        if self._sink is not None:
            self._sink(entry)


def _refusal(rid: JsonValue, method: str, rule: str | None) -> JsonObject:
    by = f'rule "{rule}"' if rule is not None else "the default"
    return error_object(rid, POLICY_DENIED, f"acp-proxy policy: {method} denied by {by}")
