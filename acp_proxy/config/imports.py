"""Middleware named by ``use: package.module:Class``: imported, checked, and (when running) built.

Contract: a ``use:`` entry must name a middleware class, and that is checked before anything it
defines is called (a config file must not be able to run arbitrary callables, ``os:system``
with ``with: {command: ...}``); its ``with:`` options are checked against the constructor's
signature; with ``instantiate`` (a run, not ``check-config``) one instance is built at start-up so
that a constructor that rejects its options fails then, not on the first connection. Errors are
``ConfigError`` values with the entry's position, like every config error. It also owns the
module search path those imports see: ``middleware_paths`` and ``--middleware-path`` put their
directories first (``search_first``), and a module not found names an ignored ``PYTHONPATH``.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import os
import re
import sys
from collections.abc import Sequence

from yaml.nodes import MappingNode, Node, ScalarNode

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.config.model import MiddlewareSpec, _ImportedFactory, _quote
from acp_proxy.config.nodes import NodeReader, _join, _suggest
from acp_proxy.config.reading import _NULL
from acp_proxy.config.schema import BUILTIN_RULES
from acp_proxy.wire.chain import BaseMiddleware, Middleware

_USE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def search_first(directories: Sequence[str]) -> None:
    """Put ``directories`` at the front of the module search path, in their order (one already
    there moves to the front): ``middleware_paths`` and ``--middleware-path``, which reach a
    Python that ignores ``PYTHONPATH``."""
    for directory in reversed(directories):
        if directory in sys.path:
            sys.path.remove(directory)
        sys.path.insert(0, directory)
    importlib.invalidate_caches()


def _ignored_pythonpath(exc: ImportError) -> str:
    """Why a module on ``PYTHONPATH`` is not found, when this Python ignores the variable."""
    missing = isinstance(exc, ModuleNotFoundError)
    if not (missing and sys.flags.ignore_environment and os.environ.get("PYTHONPATH")):
        return ""
    return (
        " (PYTHONPATH is set but this Python ignores it: it runs with -E, as pipx starts its "
        "tools; name the directory under middleware_paths: in the config or pass "
        "--middleware-path DIR, or install the package into the tool's environment: pipx "
        "inject acp-proxy PACKAGE)"
    )


def import_middleware(
    reader: NodeReader,
    entries: dict[str, tuple[ScalarNode, Node]],
    path: str,
    use: str,
    fail_closed: bool,
    *,
    instantiate: bool,
    guessed_names: set[str],
) -> MiddlewareSpec:
    """The middleware ``use`` names (``path``: its entry), or a ``ConfigError``. Without
    ``instantiate`` a name only ``__init__`` sets is guessed (added to ``guessed_names``)."""
    unode = entries["use"][1]
    upath = _join(path, "use")
    if not _USE.fullmatch(use):
        raise reader.error(
            unode,
            upath,
            f'expected "{BUILTIN_RULES}" or an import path "package.module:Class", '
            f"got {_quote(use)}{_suggest(use, [BUILTIN_RULES])}",
        )
    module_name, _, attr_path = use.partition(":")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise reader.error(
            unode, upath, f'cannot import module "{module_name}": {exc}{_ignored_pythonpath(exc)}'
        ) from exc
    except Exception as exc:
        raise reader.error(
            unode,
            upath,
            f'importing module "{module_name}" raised {type(exc).__name__}: {exc}',
        ) from exc
    owner = module_name
    for part in attr_path.split("."):
        if not hasattr(target, part):
            public = [n for n in dir(target) if not n.startswith("_")]
            raise reader.error(
                unode, upath, f'"{owner}" has no attribute "{part}"{_suggest(part, public)}'
            )
        target = getattr(target, part)
        owner = f"{owner}.{part}" if owner != module_name else f"{module_name}:{part}"
    # Refuse anything that is not a middleware class BEFORE calling it: a config file must
    # not be able to run arbitrary callables (``os:system`` with ``with: {command: ...}``).
    problem = _not_a_middleware_class(target)
    if problem is not None:
        raise reader.error(
            unode,
            upath,
            f'"{use}" is {problem}: expected a middleware class '
            "(subclass acp_proxy.middleware.BaseMiddleware)",
        )
    assert isinstance(target, type)
    kwargs: dict[str, JsonValue] = {}
    wnode: Node = unode
    wpath = _join(path, "with")
    if "with" in entries:
        wnode = entries["with"][1]
        if not (isinstance(wnode, ScalarNode) and wnode.tag == _NULL):
            if not isinstance(wnode, MappingNode):
                raise reader.wrong_type(wnode, wpath, "a mapping of constructor arguments")
            value = reader.json(wnode, wpath)
            assert isinstance(value, dict)
            kwargs = value
    try:
        signature: inspect.Signature | None = inspect.signature(target)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            params = ", ".join(
                p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                for p in signature.parameters.values()
            )
            raise reader.error(
                wnode,
                wpath,
                f"{use} does not accept these options: {exc} (its parameters: {params})",
            ) from exc
    rename: str | None = None
    if "name" in entries:
        rename = reader.string(entries["name"][1], _join(path, "name"))
        if not rename:
            raise reader.error(entries["name"][1], _join(path, "name"), "must not be empty")
    if not instantiate:
        # check-config: the class is imported and its options checked against its
        # signature, but it is never called. A name only __init__ sets is unknown then:
        # the class name stands in for it, and it is not checked for duplicates (the run
        # checks it), so that check-config never refuses what the run accepts.
        name = rename or _static_name(target) or target.__name__
        if not rename and _static_name(target) is None:
            guessed_names.add(name)
        return MiddlewareSpec(
            name=name,
            factory=_ImportedFactory(target, kwargs, rename),
            fail_closed=fail_closed,
            use=use,
            options=kwargs,
            line=unode.start_mark.line + 1,
        )
    # Build one instance now so that a constructor that rejects its options fails at
    # start-up, not on the first connection.
    try:
        instance = target(**copy.deepcopy(kwargs))
    except Exception as exc:
        raise reader.error(wnode, wpath, f"{use}(...) raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(instance, Middleware):
        raise reader.error(
            unode,
            upath,
            f"{use} did not build a middleware: it needs a str `name` and "
            "`__call__(message, ctx)` (subclass acp_proxy.middleware.BaseMiddleware)",
        )
    own_name = getattr(instance, "name", None)
    if not isinstance(own_name, str):
        raise reader.error(unode, upath, f"{use}: `name` must be a str, got {own_name!r}")
    needles = getattr(instance, "needles", None)
    if needles is not None and (
        not isinstance(needles, tuple | list) or not all(isinstance(n, bytes) for n in needles)
    ):
        raise reader.error(
            unode, upath, f"{use}: `needles` must be None or a tuple of bytes, got {needles!r}"
        )
    name = rename or own_name
    return MiddlewareSpec(
        name=name,
        factory=_ImportedFactory(target, kwargs, rename if rename != own_name else None),
        fail_closed=fail_closed,
        use=use,
        options=kwargs,
        line=unode.start_mark.line + 1,
    )


def _static_name(cls: type) -> str | None:
    """The ``name`` every instance of ``cls`` has, when it can be told without building one:
    BaseMiddleware's (the class name) or a str class attribute; None when __init__ may set it."""
    attr = inspect.getattr_static(cls, "name", None)
    if attr is inspect.getattr_static(BaseMiddleware, "name"):
        return cls.__name__
    return attr if isinstance(attr, str) else None


def _not_a_middleware_class(target: object) -> str | None:
    """Why ``target`` cannot be a middleware class, or None when it can (checked without
    calling anything it defines: no instance is built, no metaclass hook runs)."""
    if not isinstance(target, type):
        if inspect.ismodule(target):
            return "a module"
        if inspect.isroutine(target):
            return "a function" if inspect.isfunction(target) else "a built-in function"
        if callable(target):
            return f"a callable object ({type(target).__name__}), not a class"
        return f"not a class (it is {type(target).__name__})"
    if issubclass(target, BaseMiddleware):
        return None
    mro = [k for k in target.__mro__ if k is not object]
    if not any("__call__" in vars(k) for k in mro):
        return "a class without a `__call__(message, ctx)` method"
    declared = any("name" in vars(k) or "name" in vars(k).get("__annotations__", {}) for k in mro)
    if not declared:
        return "a class without a `name` (declare `name: str` in the class body)"
    return None
