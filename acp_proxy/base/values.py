"""Dataclasses that cost nothing to define: ``@value``, the start-up-friendly frozen dataclass.

Contract: owns one class decorator for the proxy's value types (configuration sections,
middleware verdicts, pipeline notes, queue frames, registry entries, counters). A decorated
class is what ``@dataclass(frozen=True, slots=True)`` (``@value(frozen=False)``:
``@dataclass(slots=True)``) makes of it, for everything the proxy and its users rely on: the
``__init__`` signature (fields in order, defaults, ``field(default_factory=...)``), ``__slots__``,
``==`` and ``hash`` on the field tuple (``field(compare=False)`` left out), the ``repr``
(``field(repr=False)`` left out), ``__match_args__``, ``FrozenInstanceError`` on assignment,
copying and pickling, and the ``dataclasses`` functions (``fields``, ``replace``, ``asdict``,
``is_dataclass``). Not supported (refused): ``init=False`` fields, ``InitVar``, ``__post_init__``,
inheritance between value classes.

Why (start-up time): ``dataclasses`` compiles six generated methods per class with
``exec``, about a millisecond per class, paid at every start for dozens of classes most sessions
never instantiate. Here the shared methods are plain functions and only ``__init__`` is
generated, once the class has been instantiated a few times (the first instances bind their
arguments generically), so a class costs about as much as a plain one.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import MISSING, Field, FrozenInstanceError
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

_T = TypeVar("_T", bound=type)

# Marks a parameter left out whose field has a default factory (as dataclasses does).
_FACTORY = object()


@overload
def value(cls: _T, /) -> _T: ...


@overload
def value(*, frozen: bool = True) -> Callable[[_T], _T]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(Field,))
def value(cls: Any = None, /, *, frozen: bool = True) -> Any:
    """``@value`` (frozen) or ``@value(frozen=False)`` on a class with annotated fields."""
    if cls is None:
        return lambda c: _build(c, frozen)
    return _build(cls, frozen)


def _field(name: str, annotation: object, spec: Any) -> Field[Any]:
    """The ``dataclasses.Field`` describing one field (what ``dataclasses.fields`` returns)."""
    if isinstance(spec, Field):
        made = spec
        if not made.init or made.kw_only is True:
            raise TypeError(f"{name}: @value supports neither init=False nor kw_only fields")
    else:
        made = dataclasses.field(default=spec)  # MISSING: no default
    made.name = name
    made.type = annotation
    made._field_type = dataclasses._FIELD  # type: ignore[attr-defined]  # a regular field
    return made


def _build(cls: type, frozen: bool) -> type:
    if any(hasattr(base, "_value_fields") for base in cls.__mro__[1:]):
        raise TypeError(f"{cls.__qualname__}: a value class cannot extend another one")
    if "__post_init__" in cls.__dict__:
        raise TypeError(f"{cls.__qualname__}: @value has no __post_init__")
    fields: dict[str, Field[Any]] = {}
    body = dict(cls.__dict__)
    seen_default = False
    for name, annotation in inspect.get_annotations(cls).items():
        text = str(annotation)
        if text.startswith(("ClassVar", "typing.ClassVar")):
            continue
        if text.startswith(("InitVar", "dataclasses.InitVar")):
            raise TypeError(f"{cls.__qualname__}.{name}: @value has no InitVar")
        made = _field(name, annotation, body.pop(name, MISSING))
        has_default = made.default is not MISSING or made.default_factory is not MISSING
        if seen_default and not has_default:
            raise TypeError(f"non-default argument {name!r} follows default argument")
        seen_default = seen_default or has_default
        fields[name] = made
    names = tuple(fields)
    compared = tuple(name for name, f in fields.items() if f.compare)
    body.pop("__dict__", None)
    body.pop("__weakref__", None)
    body["__slots__"] = names
    body["__match_args__"] = names
    body["__dataclass_fields__"] = fields
    body["_value_fields"] = names
    body["_value_repr"] = tuple(name for name, f in fields.items() if f.repr)
    body["_value_frozen"] = frozen
    if len(compared) >= 2:
        body["_value_key"] = attrgetter(*compared)
    elif compared:
        get = attrgetter(compared[0])
        body["_value_key"] = lambda self: (get(self),)
    else:
        body["_value_key"] = lambda self: ()
    body["__init__"] = _first_init
    body["__signature__"] = _SIGNATURE
    body["__repr__"] = _repr
    body["__eq__"] = _eq
    body["__getstate__"] = _getstate
    body["__setstate__"] = _setstate
    if frozen:
        body["__hash__"] = _hash
        body["__setattr__"] = _frozen_setattr
        body["__delattr__"] = _frozen_delattr
    else:
        body["__hash__"] = None  # eq without frozen: unhashable, as a dataclass is
    new = type(cls)(cls.__name__, cls.__bases__, body)
    new.__qualname__ = cls.__qualname__
    try:  # what @dataclass on a subclass reads; its signature is private (Python 3.11's)
        params = dataclasses._DataclassParams(True, True, True, False, False, frozen)  # type: ignore[attr-defined]
    except TypeError:
        pass
    else:
        new.__dataclass_params__ = params  # type: ignore[attr-defined]
    return new


class _Signature:
    """``inspect.signature`` of a value class: its dataclass ``__init__``'s, built when asked
    (the ``__init__`` itself is generic until compiled)."""

    def __get__(self, obj: object, cls: type) -> inspect.Signature:
        if obj is not None:
            raise AttributeError("__signature__")
        fields: dict[str, Field[Any]] = cls.__dataclass_fields__  # type: ignore[attr-defined]
        return inspect.Signature(
            [
                inspect.Parameter(
                    name,
                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                    default=(
                        dataclasses._HAS_DEFAULT_FACTORY  # type: ignore[attr-defined]
                        if f.default_factory is not MISSING
                        else inspect.Parameter.empty
                        if f.default is MISSING
                        else f.default
                    ),
                    annotation=f.type,
                )
                for name, f in fields.items()
            ],
            return_annotation=None,
        )


_SIGNATURE = _Signature()


def field_names(obj: object) -> tuple[str, ...]:
    """The field names of a value class or instance, in order."""
    names: tuple[str, ...] = obj._value_fields  # type: ignore[attr-defined]
    return names


def _init_source(cls: type) -> Callable[..., None]:
    """The class's own ``__init__``, compiled once (the one ``exec`` a value class costs)."""
    fields: dict[str, Field[Any]] = cls.__dataclass_fields__  # type: ignore[attr-defined]
    frozen: bool = cls._value_frozen  # type: ignore[attr-defined]
    scope: dict[str, Any] = {"_set": object.__setattr__, "_FACTORY": _FACTORY}
    params, lines = [], []
    for name, f in fields.items():
        if f.default_factory is not MISSING:
            params.append(f"{name}=_FACTORY")
            scope[f"_factory_{name}"] = f.default_factory
            lines.append(f" if {name} is _FACTORY: {name} = _factory_{name}()")
        elif f.default is not MISSING:
            params.append(f"{name}=_default_{name}")
            scope[f"_default_{name}"] = f.default
        else:
            params.append(name)
        lines.append(f" _set(self, {name!r}, {name})" if frozen else f" self.{name} = {name}")
    source = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(lines) or " pass")
    exec(source, scope)  # our own field names only, as dataclasses does
    init: Callable[..., None] = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


# A value class's first instantiations bind their arguments generically (start-up makes one or
# two instances of most classes); after this many, its own ``__init__`` is compiled (the hot path
# makes many instances of a few classes, at the speed of a dataclass's ``__init__``).
_COMPILE_AFTER = 8
_calls: dict[type, int] = {}


def _first_init(self: Any, *args: Any, **kwargs: Any) -> None:
    klass = next(k for k in type(self).__mro__ if k.__dict__.get("__init__") is _first_init)
    calls = _calls.get(klass, 0) + 1
    if calls <= _COMPILE_AFTER and _bind(self, klass, args, kwargs):
        _calls[klass] = calls
        return
    # Compiled now: also when the arguments do not fit, so that the TypeError is the one a
    # dataclass raises.
    _calls.pop(klass, None)
    init = _init_source(klass)
    klass.__init__ = init  # type: ignore[misc]
    init(self, *args, **kwargs)  # the value class's own (a subclass's __init__ is running)


def _bind(self: Any, klass: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Set the fields from ``args`` and ``kwargs`` as ``__init__`` would; False (nothing
    changed) when they do not fit the signature."""
    names: tuple[str, ...] = klass._value_fields
    fields: dict[str, Field[Any]] = klass.__dataclass_fields__
    if len(args) > len(names):
        return False
    values = dict(zip(names, args, strict=False))
    for key in kwargs:
        if key in values or key not in fields:
            return False
    values.update(kwargs)
    for name in names[len(args) :]:
        if name not in values:
            f = fields[name]
            if f.default_factory is not MISSING:
                values[name] = f.default_factory()
            elif f.default is not MISSING:
                values[name] = f.default
            else:
                return False
    assign = object.__setattr__ if klass._value_frozen else setattr
    for name in names:
        assign(self, name, values[name])
    return True


def _repr(self: Any) -> str:
    fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._value_repr)
    return f"{type(self).__qualname__}({fields})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        key = self.__class__._value_key
        return key(self) == key(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(self.__class__._value_key(self))


def _frozen_setattr(self: Any, name: str, value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _getstate(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, name) for name in self._value_fields)


def _setstate(self: Any, state: tuple[Any, ...]) -> None:
    for name, item in zip(self._value_fields, state, strict=True):
        object.__setattr__(self, name, item)
