"""The built-in annotation-rules middleware: the YAML ``rules:`` list, compiled and applied.

Contract: owns how compiled rules match a message (direction, method glob, ``sessionUpdate`` kind)
and how the matching rules are applied in file order: entity ``_meta`` through ``annotate_message``
(the patch core decides what an upsert is and how to annotate it, version-aware), message-level
``params._meta`` as a plain object. Never mutates its input and never does I/O or logging: what it
changed is said by its verdict (``Replace.by``: the rules that changed the message; ``skipped``:
those the v1 policy held back). Its only state is per connection (the v1 stateful store).
Validation of rules lives in ``config``; this module trusts its input.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import orjson

from acp_proxy.base.jsontypes import OMITTED, JsonObject, JsonValue, Omitted
from acp_proxy.meta import registry
from acp_proxy.meta.annotate import (
    NEEDS_SPLIT,
    AnnotateStatus,
    Annotation,
    V1MetaStore,
    V1Mode,
    annotate_message,
    v2_meta_after,
)
from acp_proxy.wire.chain import (
    FORWARD,
    BaseMiddleware,
    Direction,
    FastAnnotator,
    Forward,
    MessageContext,
    Replace,
    Verdict,
)

# Every ``sessionUpdate`` kind the registry knows, v1 and v2 together (the same list as the
# official schemas ``acp-schema/v{1,2}/schema.unstable.json``, TypeScript SDK 2.4.0): a rule's
# ``match.update`` must name one of these, ``upserts``, or an extension kind starting with ``_``
# (ACP's prefix for custom values).
KNOWN_UPDATE_KINDS: Final[frozenset[str]] = (
    frozenset(
        kind
        for table in (registry.UPSERT_KINDS, registry.CHUNK_KINDS, registry.SNAPSHOT_KINDS)
        for kinds in table.values()
        for kind in kinds
    )
    | frozenset(registry.REMOVAL_KINDS)
    | registry.EVENT_KINDS
)

# ``match.update: upserts`` matches what ``registry.find_upsert`` finds: the messages whose
# top-level ``_meta`` is an entity's metadata (v2 patches, v1 per the registry's v1 model),
# including a ``session/request_permission`` carrying a tool call.
UPSERT_KINDS_ANY_VERSION: Final[frozenset[str]] = frozenset(
    kind for kinds in registry.UPSERT_KINDS.values() for kind in kinds
)

UPSERTS: Final = "upserts"

# Keys a rule may use without a namespace: ACP extensibility, "_meta": root keys "SHOULD be
# reserved for W3C trace context" (traceparent, tracestate, baggage); everything else custom is
# namespaced (acp-digest §4.1).
W3C_TRACE_KEYS: Final[frozenset[str]] = frozenset({"traceparent", "tracestate", "baggage"})


class RuleDirection(enum.StrEnum):
    """Which traffic a rule looks at."""

    AGENT_TO_CLIENT = "agent_to_client"
    CLIENT_TO_AGENT = "client_to_agent"
    BOTH = "both"


class RuleTarget(enum.StrEnum):
    """Whose ``_meta`` a rule edits."""

    # The entity's metadata of an upsert, sent as a metadata patch (v2) or per the v1 policy.
    ENTITY = "entity"
    # The message-level ``params._meta``: a plain object about this one message (not a patch).
    MESSAGE = "message"


def entity_keys_by_rule(rules: Iterable[Rule]) -> dict[str, list[str]]:
    """The entity `_meta` keys each rule writes (sets or removes), sorted, for the rules that
    edit an entity's metadata: what lets a viewer credit a key to the rule that wrote it rather
    than to every rule that changed the frame."""
    return {
        rule.name: sorted({*rule.set_meta, *rule.remove_meta})
        for rule in rules
        if rule.target is RuleTarget.ENTITY and (rule.set_meta or rule.remove_meta)
    }


def is_glob(pattern: str) -> bool:
    """True if ``pattern`` uses fnmatch wildcards (``*``, ``?``, ``[...]``)."""
    return any(c in pattern for c in "*?[")


@dataclass(frozen=True, slots=True)
class Rule:
    """One validated rule of the ``rules:`` list (see ``config`` for the YAML form)."""

    name: str
    set_meta: Mapping[str, JsonValue] = field(default_factory=dict)
    remove_meta: tuple[str, ...] = ()
    target: RuleTarget = RuleTarget.ENTITY
    overwrite: bool = False
    direction: RuleDirection = RuleDirection.BOTH
    # Exact method name or an fnmatch glob (case-sensitive; ``*`` also matches ``/``). None: any.
    method: str | None = None
    # ``sessionUpdate`` kinds to match, as written; None: no kind filter.
    update_kinds: tuple[str, ...] | None = None
    # ``update: upserts`` (alone or inside the list): also match any upsert, per version.
    update_upserts: bool = False
    # Where the rule was defined (for explain/logs); None when built in code.
    line: int | None = None

    @property
    def has_update_filter(self) -> bool:
        return self.update_kinds is not None or self.update_upserts


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: Rule
    directions: frozenset[Direction]
    exact_method: str | None
    method_regex: re.Pattern[str] | None
    kinds: frozenset[str]
    upserts: bool
    filter_kinds: bool
    annotation: Annotation


def _compile(rule: Rule) -> _Compiled:
    if rule.direction is RuleDirection.BOTH:
        directions = frozenset(Direction)
    else:
        directions = frozenset({Direction(rule.direction.value)})
    exact: str | None = None
    regex: re.Pattern[str] | None = None
    if rule.method is not None:
        if is_glob(rule.method):
            regex = re.compile(fnmatch.translate(rule.method))
        else:
            exact = rule.method
    return _Compiled(
        rule=rule,
        directions=directions,
        exact_method=exact,
        method_regex=regex,
        kinds=frozenset(rule.update_kinds or ()),
        upserts=rule.update_upserts,
        filter_kinds=rule.has_update_filter,
        annotation=Annotation(
            set=dict(rule.set_meta), remove=rule.remove_meta, overwrite=rule.overwrite
        ),
    )


def _json_str(text: str) -> bytes:
    return orjson.dumps(text)


def _rule_needles(rule: Rule) -> tuple[bytes, ...] | None:
    """Byte strings of which one occurs in every raw frame ``rule`` can match; None: any frame.

    The ``update`` kinds come first: every frame the rule matches holds one of them, and they
    are far more selective than the method (most agent traffic is ``session/update``).
    """
    if rule.has_update_filter:
        needles = [_json_str(k) for k in rule.update_kinds or ()]
        if rule.update_upserts:
            needles += [_json_str(k) for k in sorted(UPSERT_KINDS_ANY_VERSION)]
            needles.append(_json_str(registry.REQUEST_PERMISSION))
        return tuple(dict.fromkeys(needles))
    if rule.method is not None:
        if not is_glob(rule.method):
            return (_json_str(rule.method),)
        prefix = re.split(r"[*?\[]", rule.method, maxsplit=1)[0]
        if prefix:
            # The method's JSON string starts with the glob's literal prefix.
            return (_json_str(prefix)[:-1],)
    return None


def rules_needles(rules: Iterable[Rule]) -> tuple[bytes, ...] | None:
    """The prefilter of a rules middleware: the union of each rule's needles (None if any is None).

    No rules gives ``()``: no frame can interest the middleware.
    """
    out: dict[bytes, None] = {}
    for rule in rules:
        needles = _rule_needles(rule)
        if needles is None:
            return None
        out.update(dict.fromkeys(needles))
    return tuple(out)


def _same_json(a: JsonValue, b: JsonValue) -> bool:
    """JSON equality: unlike ``==``, ``true`` is not ``1`` and ``1`` is not ``1.0``."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(_same_json(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def edit_params_meta(message: JsonObject, annotation: Annotation) -> JsonObject | None:
    """Set/remove keys of the message-level ``params._meta``; None when nothing changes.

    ``params._meta`` is an ordinary object about this one message, not a patch (acp-digest §3.1),
    so keys are edited in place in a copy. A message without a ``params`` object is left alone, and
    so is a ``_meta`` that is neither an object nor ``null`` (never destroy what we do not
    understand). A key already present is kept unless ``annotation.overwrite``.
    """
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    new = params_meta_after(params.get("_meta"), (annotation,))
    if new is OMITTED:
        return None
    return {**message, "params": {**params, "_meta": new}}


def params_meta_after(
    meta: JsonValue, annotations: Sequence[Annotation]
) -> dict[str, JsonValue] | Omitted:
    """A message's ``params._meta`` after ``annotations`` applied in order (``edit_params_meta``
    rule by rule, each on the previous one's output), built alone: a fresh dict, or ``OMITTED``
    when nothing changes (also for a ``_meta`` that is neither an object nor ``null``/absent,
    which is never touched). ``meta`` itself is not modified."""
    if meta is None:
        current: dict[str, JsonValue] = {}
    elif isinstance(meta, dict):
        current = meta
    else:
        return OMITTED
    new: dict[str, JsonValue] | None = None
    for annotation in annotations:
        for key, value in annotation.set.items():
            base = current if new is None else new
            if key in base and (not annotation.overwrite or _same_json(base[key], value)):
                continue
            if new is None:
                new = dict(current)
            new[key] = value
        for key in annotation.remove:
            if key in (current if new is None else new):
                if new is None:
                    new = dict(current)
                del new[key]
    return OMITTED if new is None else new


_V2_UPSERTS: Final = registry.UPSERT_KINDS[2]


def _writes_back(value: JsonValue) -> bool:
    """Whether orjson writes ``value`` and reads it back as the same JSON (no NaN, no big int)."""
    try:
        return _same_json(orjson.loads(orjson.dumps(value)), value)
    except (TypeError, orjson.JSONDecodeError):
        return False


class _FusedKind(NamedTuple):
    """What the rules of one direction do to a v2 `session/update` of one ``sessionUpdate``
    kind (``RulesMiddleware._fused``): the entity annotations and the message-target ones that
    apply when the update is an upsert (``registry.find_upsert``: the kind's key field is a
    string), and the message-target ones that apply when it is not. ``spec`` is the kind's
    upsert spec, None when the kind is not a v2 upsert kind."""

    spec: registry.UpsertKind | None
    entity: tuple[Annotation, ...]
    message_if_upsert: tuple[Annotation, ...]
    message_otherwise: tuple[Annotation, ...]


def _method_matches(c: _Compiled, method: str) -> bool:
    """Whether rule ``c``'s ``method`` (exact or a glob; none: any) matches ``method``."""
    if c.exact_method is not None:
        return method == c.exact_method
    return c.method_regex is None or c.method_regex.match(method) is not None


def _applies(c: _Compiled, kind: str, upsert: bool) -> bool:
    """Whether rule ``c`` (one that matches `session/update` in this direction) matches an
    update of ``kind`` (an upsert or not), the way ``RulesMiddleware._matches`` decides, and
    whether it then changes anything: an entity rule only ever changes an upsert."""
    if c.rule.target is RuleTarget.ENTITY and not upsert:
        return False
    return not c.filter_kinds or kind in c.kinds or (c.upserts and upsert)


def _fused_table(
    compiled: Sequence[_Compiled],
) -> dict[Direction, tuple[dict[str, _FusedKind], tuple[Annotation, ...]]] | None:
    """``RulesMiddleware._fused``: per direction, per ``sessionUpdate`` kind (each v2 upsert kind
    and each kind a rule names), what the rules do (``_FusedKind``), and the message-target
    annotations for any other kind (never an upsert, named by no rule). None when a rule sets a
    value orjson would not write back exactly. Built once, so a frame costs one lookup."""
    for c in compiled:
        if not _writes_back(dict(c.rule.set_meta)):
            return None
    kinds = set(_V2_UPSERTS)
    for c in compiled:
        kinds.update(c.kinds)
    table = {}
    for direction in Direction:
        rules = [
            c
            for c in compiled
            if direction in c.directions and _method_matches(c, registry.SESSION_UPDATE)
        ]

        def pick(
            kind: str, upsert: bool, target: RuleTarget, rules: list[_Compiled] = rules
        ) -> tuple[Annotation, ...]:
            return tuple(
                c.annotation for c in rules if c.rule.target is target and _applies(c, kind, upsert)
            )

        by_kind = {
            kind: _FusedKind(
                _V2_UPSERTS.get(kind),
                pick(kind, True, RuleTarget.ENTITY),
                pick(kind, True, RuleTarget.MESSAGE),
                pick(kind, False, RuleTarget.MESSAGE),
            )
            for kind in kinds
        }
        # Any other kind: only the rules without a kind filter can match it.
        other = tuple(
            c.annotation
            for c in rules
            if c.rule.target is RuleTarget.MESSAGE and not c.filter_kinds
        )
        table[direction] = (by_kind, other)
    return table


class FusedEdit(NamedTuple):
    """What ``RulesMiddleware.fused_v2`` changes in a v2 `session/update`: the new value of
    ``params._meta`` and of ``params.update._meta`` (``OMITTED``: that member is unchanged)."""

    params: JsonObject
    params_meta: JsonValue | Omitted
    update: JsonObject
    update_meta: JsonValue | Omitted


# In stateful v1 mode the middleware must see every v1 upsert sent to the client, matched by a
# rule or not, to keep its copy of the client's metadata current (``V1MetaStore.observe``).
_V1_UPSERT_NEEDLES: Final = (
    *(_json_str(k) for k in sorted(registry.UPSERT_KINDS[1])),
    _json_str(registry.REQUEST_PERMISSION),
)


class RulesMiddleware(BaseMiddleware, FastAnnotator):
    """The ``rules:`` list as a middleware (create one per connection).

    Every rule that matches the message (as it arrived at this middleware) applies, in file
    order, each to the output of the previous ones. When an entity annotation has to split a
    message (v2 ``_meta: null`` followed by the annotation, RFD Metadata Patches: the clear must
    survive), later entity rules apply to the follow-up only, never to the clear again, so N rules
    never produce more than one follow-up per split. Message-target rules edit every output.

    Its verdict names the rules that changed the message (``Replace.by``) and the matching entity
    rules that the v1 policy did not apply (``skipped``: ``SKIPPED_V1_UNSAFE``, the update carries
    no `_meta` object, so adding one would erase the agent's metadata), for the debug log.

    ``V1Mode.STATEFUL``: a per-connection ``V1MetaStore`` (at most ``v1_max_entities``) follows
    every v1 upsert this middleware forwards toward the client, so ``needles`` then also lists
    the v1 upsert kinds.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        v1_mode: V1Mode = V1Mode.SAFE,
        v1_max_entities: int = 10_000,
    ) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        self._compiled = tuple(_compile(r) for r in self.rules)
        needles = rules_needles(self.rules)
        if needles and v1_mode is V1Mode.STATEFUL:
            needles = tuple(dict.fromkeys((*needles, *_V1_UPSERT_NEEDLES)))
        self._needles = needles
        self._v1_mode = v1_mode
        self._v1_store: V1MetaStore | None = (
            V1MetaStore(v1_max_entities) if v1_mode is V1Mode.STATEFUL else None
        )
        # The fused v2 path (``fused_v2``): per direction, the rules that can match a
        # `session/update`; None when a rule rules it out (a value orjson would not write back
        # as it is).
        self._fused: dict[Direction, tuple[dict[str, _FusedKind], tuple[Annotation, ...]]] | None
        self._fused = _fused_table(self._compiled)

    @property
    def name(self) -> str:
        return "rules"

    # The chain's prefilter, computed from the rule set (``rules_needles``). BaseMiddleware
    # declares ``needles`` as a class attribute; here it depends on the instance's rules.
    @property
    def needles(self) -> tuple[bytes, ...] | None:  # type: ignore[override]
        return self._needles

    @property
    def v1_store(self) -> V1MetaStore | None:
        """The connection's v1 metadata store (``V1Mode.STATEFUL`` only)."""
        return self._v1_store

    @property
    def fusable(self) -> bool:
        """Whether ``fused_v2`` can answer for this rule set (the pipeline asks once)."""
        return self._fused is not None

    def fused_v2(self, message: JsonObject, direction: Direction) -> FusedEdit | Omitted | None:
        """The common case of a v2 connection without building a message.

        For a v2 `session/update` notification: ``OMITTED`` when the rules leave it as it is,
        else a ``FusedEdit``: the message's ``params`` and ``params.update`` objects and the new
        values the matching rules give their ``_meta`` members (``OMITTED``: that member is
        unchanged): entity rules on an upsert (``v2_meta_after``), message-target rules
        (``params_meta_after``). The two members are independent, so the file order of entity
        and message rules does not matter here. The caller sets the members itself and encodes
        only them. ``None`` for anything else (another method, a malformed update, a clear to
        split): ``__call__`` decides. The answer is the one ``__call__`` gives on a message of
        version 2, exactly, without naming the rules (only the debug log names them, and debug
        logging takes the general path).
        """
        table = self._fused
        if table is None or message.get("method") != registry.SESSION_UPDATE:
            return None
        params = message.get("params")
        if type(params) is not dict or type(params.get("sessionId")) is not str:
            return None
        update = params.get("update")
        if type(update) is not dict:
            return None
        kind = update.get("sessionUpdate")
        if type(kind) is not str:
            return None
        by_kind, other = table[direction]
        plan = by_kind.get(kind)
        entity: tuple[Annotation, ...] = ()
        if plan is None:
            on_message = other
        else:
            spec = plan.spec
            # An upsert to ``registry.find_upsert``: a v2 upsert kind whose key field is a string.
            if spec is not None and (
                spec.key_field is None or type(update.get(spec.key_field)) is str
            ):
                entity, on_message = plan.entity, plan.message_if_upsert
            else:
                on_message = plan.message_otherwise
        if not entity and not on_message:
            return OMITTED
        meta: JsonValue | Omitted = OMITTED
        if entity:
            got = v2_meta_after(update, entity)
            if got is NEEDS_SPLIT:
                return None
            meta = got
        params_meta: JsonValue | Omitted = OMITTED
        if on_message:
            params_meta = params_meta_after(params.get("_meta"), on_message)
        if meta is OMITTED and params_meta is OMITTED:
            return OMITTED
        # ``tuple.__new__``: the NamedTuple's generated ``__new__`` is a Python call per frame.
        return tuple.__new__(FusedEdit, (params, params_meta, update, meta))

    def _matches(
        self, c: _Compiled, message: JsonObject, ctx: MessageContext, version: int
    ) -> bool:
        if ctx.direction not in c.directions:
            return False
        if c.exact_method is not None or c.method_regex is not None:
            method = message.get("method")
            if not isinstance(method, str) or not _method_matches(c, method):
                return False
        if not c.filter_kinds:
            return True
        kind = registry.session_update_kind(message)
        if kind is not None and kind in c.kinds:
            return True
        return c.upserts and registry.find_upsert(message, version) is not None

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        version = ctx.protocol_version
        if version is None:  # before the version is known, forward untouched
            return FORWARD
        matching = [c for c in self._compiled if self._matches(c, message, ctx, version)]
        verdict = self._apply(matching, message, version) if matching else FORWARD
        store = self._v1_store
        if store is not None and version == 1 and ctx.direction is Direction.AGENT_TO_CLIENT:
            # Keep the model of the client's v1 metadata current (idempotent for what
            # annotate_message already recorded).
            for out in verdict.messages if isinstance(verdict, Replace) else (message,):
                store.observe(out)
        return verdict

    def _apply(self, matching: list[_Compiled], message: JsonObject, version: int) -> Verdict:
        # Each entry: a message and whether entity rules may still edit it (False for a clear
        # that an earlier rule already kept in front of its follow-up).
        current: list[tuple[JsonObject, bool]] = [(message, True)]
        changed_by: list[str] = []
        skipped: list[str] = []
        for c in matching:
            changed = False
            following: list[tuple[JsonObject, bool]] = []
            for msg, editable in current:
                if c.rule.target is RuleTarget.MESSAGE:
                    edited = edit_params_meta(msg, c.annotation)
                    if edited is None:
                        following.append((msg, editable))
                    else:
                        changed = True
                        following.append((edited, editable))
                    continue
                if not editable:
                    following.append((msg, editable))
                    continue
                result = annotate_message(
                    msg, version, c.annotation, v1_mode=self._v1_mode, v1_store=self._v1_store
                )
                if result.status is AnnotateStatus.SKIPPED_V1_UNSAFE:
                    skipped.append(c.rule.name)
                if result.status is not AnnotateStatus.APPLIED:
                    following.append((msg, editable))
                    continue
                changed = True
                out = result.messages
                if len(out) > 1 and out[0] is msg:
                    # The input itself kept in front of a follow-up (a clear): later entity
                    # rules annotate the follow-up only.
                    following.append((msg, False))
                    following.extend((m, True) for m in out[1:])
                else:
                    following.extend((m, True) for m in out)
            current = following
            if changed and c.rule.name not in changed_by:
                changed_by.append(c.rule.name)
        passed = tuple(dict.fromkeys(skipped))
        if not changed_by:
            return Forward(skipped=passed) if passed else FORWARD
        return Replace(tuple(m for m, _ in current), by=tuple(changed_by), skipped=passed)
