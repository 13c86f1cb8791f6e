"""Validation of a loaded config document into a ``Config``, every error at once.

Contract: reads the YAML nodes (``config.nodes``) as the declarations say (``SETTINGS``, the rule
and middleware fields of ``config.schema``) and applies the checks across keys declared in
``config.checks``, each error with the file, the line, the path (``rules[1].set_meta``) and what
would be valid; independent errors are all reported. The checks across entries are here: unique
rule and middleware names, the built-in rules listed once and listed when defined, and the
buffer bound against the frame size. A ``use:`` entry must name a middleware class, checked
before anything is called (``config.imports``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.config.checks import MIDDLEWARE_CHECKS, RULE_CHECKS, Check, breaches
from acp_proxy.config.imports import import_middleware, search_first
from acp_proxy.config.model import (
    BUFFER_SLACK_BYTES,
    Config,
    ConfigError,
    MiddlewareSpec,
    _quote,
    _RulesFactory,
)
from acp_proxy.config.nodes import _IDENT, NodeReader, _join, _unknown
from acp_proxy.config.reading import _NULL, _BoundedLoader, _Refused, _yaml_error, read_config_file
from acp_proxy.config.rules import (
    KNOWN_UPDATE_KINDS,
    UPSERTS,
    W3C_TRACE_KEYS,
    Rule,
    RuleDirection,
    RuleTarget,
)
from acp_proxy.config.schema import (
    BUILTIN_RULES,
    MATCH_KEYS,
    MIDDLEWARE_FIELDS,
    MIDDLEWARE_KEYS,
    RULE_KEYS,
    SETTINGS,
    TOP_KEYS,
    Kind,
)


def _place(path: str, where: str) -> str:
    """The path of a check's place (``""``, ``"use"``, ``"match.update"``, ``"remove_meta[2]"``)
    inside the entry at ``path``."""
    if not where:
        return path
    return _join(path, where) if _IDENT.fullmatch(where) else f"{path}.{where}"


class _Parser(NodeReader):
    """Walks the composed YAML node tree, validating as it converts (one per file)."""

    def __init__(
        self,
        source: str,
        loader: yaml.SafeLoader,
        environ: Mapping[str, str],
        *,
        instantiate: bool = True,
    ) -> None:
        super().__init__(source, loader, environ)
        self.instantiate = instantiate  # False for check-config: import, never call
        self.guessed_names: set[str] = set()  # check-config: middleware names not yet known

    def check(
        self,
        checks: tuple[Check, ...],
        values: Mapping[str, Any],
        places: Mapping[str, Node],
        path: str,
        *,
        whole: bool,
    ) -> bool:
        """Record each breach of ``checks`` (``config.checks``) by the entry at ``path``, at the
        node of its place; whether there was none."""
        ok = True
        for where, reason in breaches(checks, values, whole=whole):
            self.errors.append(self.error(places[where], _place(path, where), reason))
            ok = False
        return ok

    # -- sections

    def rules(self, node: Node, path: str) -> tuple[Rule, ...]:
        out: list[Rule] = []
        names: dict[str, int] = {}
        for i, item in enumerate(self.sequence(node, path, "a list of rules")):
            rule: Rule | None = None
            with self.collecting():
                rule = self.rule(item, f"{path}[{i}]", i)
            if rule is None:
                continue
            if rule.name in names:
                self.errors.append(
                    self.error(
                        item,
                        f"{path}[{i}].name",
                        f'duplicate rule name "{rule.name}" (also rules[{names[rule.name]}])',
                    )
                )
                continue
            names[rule.name] = i
            out.append(rule)
        return tuple(out)

    def rule(self, node: Node, path: str, index: int) -> Rule | None:
        """The rule at ``path``, or None when it has errors (recorded; each key is checked)."""
        before = len(self.errors)
        entries = self.mapping(node, path, RULE_KEYS, allow_null=False)
        # The values read (valid keys only) and their nodes, for the checks across keys.
        values: dict[str, Any] = {}
        places: dict[str, Node] = {"": node}
        name = f"rules[{index}]"
        if "name" in entries:
            with self.collecting():
                name = self.string(entries["name"][1], _join(path, "name"))
                if not name:
                    raise self.error(entries["name"][1], _join(path, "name"), "must not be empty")
        direction = RuleDirection.BOTH
        method: str | None = None
        kinds: tuple[str, ...] | None = None
        upserts = False
        if "match" in entries:
            mpath = _join(path, "match")
            match: dict[str, tuple[ScalarNode, Node]] = {}
            with self.collecting():
                match = self.mapping(entries["match"][1], mpath, MATCH_KEYS)
            if "direction" in match:
                with self.collecting():
                    direction = self.choice(
                        match["direction"][1], _join(mpath, "direction"), RuleDirection
                    )
            if "method" in match:
                mnode = match["method"][1]
                with self.collecting():
                    method = self.string(
                        mnode, _join(mpath, "method"), expected="a method name or glob"
                    )
                    values["match.method"] = method
                    if not method:
                        raise self.error(mnode, _join(mpath, "method"), "must not be empty")
            if "update" in match:
                with self.collecting():
                    kinds, upserts = self.update_kinds(match["update"][1], _join(mpath, "update"))
                    values["match.update"] = (kinds, upserts)
                    places["match.update"] = match["update"][1]
        target = RuleTarget.ENTITY
        if "target" in entries:
            with self.collecting():
                target = self.choice(entries["target"][1], _join(path, "target"), RuleTarget)
        overwrite = False
        if "overwrite" in entries:
            with self.collecting():
                overwrite = self.boolean(entries["overwrite"][1], _join(path, "overwrite"))
        set_meta: dict[str, JsonValue] = {}
        if "set_meta" in entries:
            with self.collecting():
                set_meta = self.set_meta(entries["set_meta"][1], _join(path, "set_meta"))
        values["set_meta"] = set_meta
        remove: list[str] = []
        removed: list[tuple[int, str]] = values.setdefault("remove_meta", [])
        if "remove_meta" in entries:
            rpath = _join(path, "remove_meta")
            items: list[Node] = []
            with self.collecting():
                items = self.sequence(entries["remove_meta"][1], rpath, "a list of metadata keys")
            for i, item in enumerate(items):
                ipath = f"{rpath}[{i}]"
                with self.collecting():
                    key = self.string(item, ipath, expected="a metadata key")
                    self.meta_key(item, ipath, key)
                    removed.append((i, key))
                    places[f"remove_meta[{i}]"] = item
                    if key not in remove:
                        remove.append(key)
        self.check(RULE_CHECKS, values, places, path, whole=False)
        if len(self.errors) > before:
            return None
        if not self.check(RULE_CHECKS, values, places, path, whole=True):
            return None
        return Rule(
            name=name,
            set_meta=set_meta,
            remove_meta=tuple(remove),
            target=target,
            overwrite=overwrite,
            direction=direction,
            method=method,
            update_kinds=kinds,
            update_upserts=upserts,
            line=node.start_mark.line + 1,
        )

    def set_meta(self, node: Node, path: str) -> dict[str, JsonValue]:
        if not isinstance(node, MappingNode):
            raise self.wrong_type(node, path, "a mapping of metadata keys to values")
        out: dict[str, JsonValue] = {}
        for key_node, value_node in self.pairs(node, path):
            kpath = _join(path, key_node.value)
            with self.collecting():
                self.meta_key(key_node, kpath)
                value = self.json(value_node, kpath)
                if value is None:
                    raise self.error(
                        value_node,
                        kpath,
                        "null would remove the key: list it under remove_meta instead",
                    )
                out[key_node.value] = value
        return out

    def update_kinds(self, node: Node, path: str) -> tuple[tuple[str, ...] | None, bool]:
        valid = sorted(KNOWN_UPDATE_KINDS)
        items: list[tuple[Node, str]]
        if isinstance(node, SequenceNode):
            if not node.value:
                raise self.error(node, path, "must not be empty (omit it to match any message)")
            items = [(n, f"{path}[{i}]") for i, n in enumerate(node.value)]
        else:
            items = [(node, path)]
        kinds: dict[str, None] = {}  # ordered set: as written
        upserts = False
        for item, ipath in items:
            kind = self.string(
                item, ipath, expected=f'"{UPSERTS}" or a list of sessionUpdate kinds'
            )
            if kind == UPSERTS:
                upserts = True
            elif kind in KNOWN_UPDATE_KINDS or kind.startswith("_"):
                kinds[kind] = None
            else:
                raise self.error(
                    item,
                    ipath,
                    _unknown(
                        "sessionUpdate kind",
                        kind,
                        [*valid, UPSERTS],
                        f'Valid: "{UPSERTS}", an extension kind starting with "_", '
                        f"or one of {', '.join(valid)}",
                    ),
                )
        return (tuple(kinds) if kinds else None), upserts

    def meta_key(self, node: ScalarNode | Node, path: str, key: str | None = None) -> None:
        if key is None:
            assert isinstance(node, ScalarNode)
            key = str(node.value)
        if key in W3C_TRACE_KEYS:
            return
        namespace, slash, rest = key.partition("/")
        if not slash or not namespace or not rest:
            bare = key.strip("/") or "name"
            raise self.error(
                node,
                path,
                f"key {_quote(key)} is not namespaced: metadata keys need a namespace, such as "
                f'"example.dev/{bare}" (only the W3C trace keys traceparent, tracestate, '
                "baggage may be bare)",
            )

    def middleware(self, node: Node, path: str) -> list[tuple[MiddlewareSpec | None, bool, Node]]:
        """Entries as (spec, fail_closed, node); spec None marks the built-in rules' place."""
        out: list[tuple[MiddlewareSpec | None, bool, Node]] = []
        names: dict[str, int] = {}
        seen_rules: int | None = None
        for i, item in enumerate(self.sequence(node, path, "a list of middleware entries")):
            with self.collecting():
                seen_rules = self.middleware_entry(
                    item, path, i, names=names, seen_rules=seen_rules, out=out
                )
        return out

    def middleware_entry(
        self,
        item: Node,
        path: str,
        i: int,
        *,
        names: dict[str, int],
        seen_rules: int | None,
        out: list[tuple[MiddlewareSpec | None, bool, Node]],
    ) -> int | None:
        """Check ``middleware[i]`` and append it to ``out``; returns where the rules are listed.
        The first error stops the entry (the rest would be misread)."""
        ipath = f"{path}[{i}]"
        before = len(self.errors)
        entries = self.mapping(item, ipath, MIDDLEWARE_KEYS, allow_null=False)
        if len(self.errors) > before:  # unknown keys: the entry would be misread
            return seen_rules
        for field in MIDDLEWARE_FIELDS:
            if field.required is not None and field.key not in entries:
                raise self.error(item, ipath, field.required)
        unode = entries["use"][1]
        upath = _join(ipath, "use")
        use = self.string(unode, upath, expected='"rules" or "package.module:Class"')
        fail_closed = False
        if "fail_closed" in entries:
            fail_closed = self.boolean(entries["fail_closed"][1], _join(ipath, "fail_closed"))
        values = {"use": use, "keys": tuple(entries)}
        for place, reason in breaches(MIDDLEWARE_CHECKS, values, whole=False):
            raise self.error(entries[place][0], _place(ipath, place), reason)
        if use == BUILTIN_RULES:
            if seen_rules is not None:
                raise self.error(
                    unode, upath, f"the rules are already listed at {path}[{seen_rules}]"
                )
            seen_rules = i
            name = BUILTIN_RULES
            spec = None
        else:
            spec = import_middleware(
                self,
                entries,
                ipath,
                use,
                fail_closed,
                instantiate=self.instantiate,
                guessed_names=self.guessed_names,
            )
            name = spec.name
        if name in names and name not in self.guessed_names:
            where = entries["name"][1] if "name" in entries else unode
            raise self.error(
                where,
                _join(ipath, "name"),
                f'duplicate middleware name "{name}" (also {path}[{names[name]}]); '
                'give one a distinct "name:"',
            )
        names[name] = i
        out.append((spec, fail_closed, item))
        return seen_rules

    def document(self, root: Node | None) -> Config:
        if root is None:  # an empty file (or only comments): the defaults, no rules
            return Config(source=self.source)
        top = self.mapping(root, "", TOP_KEYS)
        d = Config()
        rules: tuple[Rule, ...] = ()
        chain: list[tuple[MiddlewareSpec | None, bool, Node]] | None = None
        middleware_node: Node | None = None
        middleware_ok = True
        changes: dict[str, Any] = {}  # Config fields the file sets
        for setting in SETTINGS:
            if setting.key not in top:
                continue
            key, node = setting.key, top[setting.key][1]
            before = len(self.errors)
            with self.collecting():
                if setting.kind is Kind.RULES:
                    rules = self.rules(node, key)
                elif setting.kind is Kind.MIDDLEWARE:
                    if not (isinstance(node, ScalarNode) and node.tag == _NULL):
                        middleware_node = node
                        chain = self.middleware(node, key)
                elif setting.kind is Kind.POLICY:
                    changes["policy"] = self.policy(node, key)
                elif setting.kind is Kind.BUDGETS:
                    changes["budgets"] = self.budgets(node, key)
                elif setting.kind is Kind.SECTION:
                    given = self.section(node, key, setting)
                    if setting.attr is None:  # v1: its settings are Config's own fields
                        changes.update(given)
                    else:
                        changes[setting.attr] = dataclasses.replace(
                            getattr(d, setting.attr), **given
                        )
                else:
                    assert setting.attr is not None
                    changes[setting.attr] = self.setting(node, key, setting)
            if setting.kind is Kind.MIDDLEWARE and len(self.errors) > before:
                middleware_ok = False
            if setting.kind is Kind.DIRECTORIES and "middleware_paths" in changes:
                search_first(changes["middleware_paths"])
        self._buffer_bound(top, changes, d)
        rules_factory = _RulesFactory(
            rules,
            changes.get("v1_mode", d.v1_mode),
            changes.get("v1_max_entities", d.v1_max_entities),
        )
        specs: list[MiddlewareSpec] = []
        if chain is None:
            if rules:
                specs.append(MiddlewareSpec(BUILTIN_RULES, rules_factory, use=BUILTIN_RULES))
        else:
            listed = False
            for spec, fail_closed, item in chain:
                if spec is None:
                    listed = True
                    specs.append(
                        MiddlewareSpec(
                            BUILTIN_RULES,
                            rules_factory,
                            fail_closed,
                            use=BUILTIN_RULES,
                            line=item.start_mark.line + 1,
                        )
                    )
                else:
                    specs.append(spec)
            # Only when every entry was read: a broken "- use: rules" entry is not a missing one.
            if rules and not listed and middleware_ok:
                assert middleware_node is not None
                self.errors.append(
                    self.error(
                        middleware_node,
                        "middleware",
                        f'the rules are defined but not listed here: add "- use: {BUILTIN_RULES}" '
                        "where they should run in the chain",
                    )
                )
        return Config(
            source=self.source,
            middleware=tuple(specs),
            rule_names=tuple(r.name for r in rules),
            rules=rules,
            lines={k: key_node.start_mark.line + 1 for k, (key_node, _) in top.items()},
            **changes,
        )

    def policy(self, node: Node, path: str) -> Any:
        """The ``policy:`` section (``acp_proxy.policy.parse``; imported only when present)."""
        import os

        from acp_proxy.policy.parse import PolicyReader

        home = self.environ.get("HOME")
        # ``~`` in a glob is the proxy user's home, links resolved as request paths are.
        return PolicyReader(self, os.path.realpath(home) if home else None).policy(node, path)

    def budgets(self, node: Node, path: str) -> Any:
        """The ``budgets:`` section (``acp_proxy.budget.parse``; imported only when present);
        a relative state file is taken from the config file's directory."""
        import os

        from acp_proxy.budget.parse import BudgetsReader

        base = os.path.dirname(os.path.abspath(self.source)) if self.source else os.getcwd()
        return BudgetsReader(self, base).budgets(node, path)

    def _buffer_bound(self, top: Any, changes: dict[str, Any], d: Config) -> None:
        """``max_buffer_bytes`` leaves room for one whole frame and a few reads (bounded
        memory): the runtime keeps ``max_frame_bytes`` + one read in reserve, so a legal frame
        always completes. Not given: raised to that minimum; given below it: an error."""
        frame = changes.get("max_frame_bytes", d.max_frame_bytes)
        if "max_buffer_bytes" not in changes:
            changes["max_buffer_bytes"] = max(d.max_buffer_bytes, frame + BUFFER_SLACK_BYTES)
        elif changes["max_buffer_bytes"] < frame + BUFFER_SLACK_BYTES:
            self.errors.append(
                self.error(
                    top["max_buffer_bytes"][1],
                    "max_buffer_bytes",
                    f"must be at least max_frame_bytes + 1 MiB "
                    f"({frame + BUFFER_SLACK_BYTES} bytes), got {changes['max_buffer_bytes']}",
                )
            )


def parse_config(
    text: str, source: str, environ: Mapping[str, str], *, instantiate: bool = True
) -> Config:
    """Validate the YAML ``text`` of a config file named ``source``. Raises ``ConfigError``.

    ``instantiate=False`` (``check-config``): user middleware classes are imported and checked
    but never called.
    """
    loader = _BoundedLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except _Refused as exc:
            line = exc.mark.line + 1 if exc.mark is not None else None
            raise ConfigError(source, line, None, exc.reason) from None
        except yaml.MarkedYAMLError as exc:
            raise _yaml_error(source, exc) from exc
        except yaml.YAMLError as exc:
            raise ConfigError(source, None, None, f"invalid YAML: {exc}") from exc
        parser = _Parser(source, loader, environ, instantiate=instantiate)
        try:
            config = parser.document(root)
        except ConfigError as exc:  # a mistake that stops the walk: reported with the others
            parser.errors.extend(exc.errors)
        if parser.errors:
            raise ConfigError.all_of(parser.errors)
        return config
    finally:
        loader.dispose()


def load_config(
    path: str | None, environ: Mapping[str, str], *, instantiate: bool = True
) -> Config:
    """Read and validate ``path`` (``None``: pure pass-through). Raises ``ConfigError``."""
    if path is None:
        return Config()
    data = read_config_file(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(path, line, None, "the file is not valid UTF-8") from exc
    return parse_config(text, path, environ, instantiate=instantiate)
