"""acp_proxy.base.values: ``@value`` behaves as ``@dataclass(frozen=True, slots=True)``."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from dataclasses import dataclass, field

import pytest

from acp_proxy.base.values import value


@value
class V:
    """A value."""

    a: int
    b: str = "x"
    c: tuple[int, ...] = field(default_factory=tuple)
    lines: dict[str, int] = field(default_factory=dict, compare=False)
    secret: str = field(default="s", repr=False)


@dataclass(frozen=True, slots=True)
class D:
    """A value."""

    a: int
    b: str = "x"
    c: tuple[int, ...] = field(default_factory=tuple)
    lines: dict[str, int] = field(default_factory=dict, compare=False)
    secret: str = field(default="s", repr=False)


@value(frozen=False)
class Counter:
    n: int = 0
    seen: set[int] = field(default_factory=set)


CALLS: list[tuple[tuple[object, ...], dict[str, object]]] = [
    ((1,), {}),
    ((1, "y"), {}),
    ((1,), {"b": "y", "lines": {"k": 1}}),
    ((), {"a": 2, "c": (3,)}),
    ((1, "y", (2,), {}, "t"), {}),
]
BAD_CALLS: list[tuple[tuple[object, ...], dict[str, object]]] = [
    ((), {}),  # a is missing
    ((1, "y", (), {}, "t", 6), {}),  # too many
    ((1,), {"a": 2}),  # a twice
    ((1,), {"z": 2}),  # no such field
]


def _as_dataclass(obj: V) -> str:
    return repr(obj).replace("V(", "D(", 1)


@pytest.mark.parametrize("rounds", [1, 20])  # generic binding, then the compiled __init__
def test_a_value_class_behaves_as_the_frozen_slotted_dataclass(rounds: int) -> None:
    for _ in range(rounds):
        for args, kwargs in CALLS:
            v, d = V(*args, **kwargs), D(*args, **kwargs)  # type: ignore[arg-type]
            assert _as_dataclass(v) == repr(d)
            assert hash(v) == hash(d)
            assert v == V(*args, **kwargs)  # type: ignore[arg-type]
        for args, kwargs in BAD_CALLS:
            with pytest.raises(TypeError) as vs:
                V(*args, **kwargs)  # type: ignore[arg-type]
            with pytest.raises(TypeError) as ds:
                D(*args, **kwargs)  # type: ignore[arg-type]
            assert str(vs.value).replace("V.", "D.") == str(ds.value)
    assert V(1, lines={"a": 1}) == V(1)  # compare=False
    assert V(1) != V(2)
    assert V(1) != D(1)  # type: ignore[comparison-overlap]
    assert V.__match_args__ == D.__match_args__ == ("a", "b", "c", "lines", "secret")
    assert vars(V)["__slots__"] == ("a", "b", "c", "lines", "secret")
    assert V.__doc__ == "A value."
    assert str(inspect.signature(V)) == str(inspect.signature(D))


def test_a_value_is_frozen_copyable_and_picklable() -> None:
    v = V(1, "y", (2,))
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'a'"):
        v.a = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'a'"):
        del v.a
    assert copy.copy(v) == v
    assert copy.deepcopy(v) == v
    assert pickle.loads(pickle.dumps(v)) == v
    match v:
        case V(a, b):
            assert (a, b) == (1, "y")
        case _:  # pragma: no cover
            raise AssertionError


def test_the_dataclasses_functions_apply() -> None:
    v = V(1)
    assert dataclasses.is_dataclass(v)
    assert [f.name for f in dataclasses.fields(V)] == [f.name for f in dataclasses.fields(D)]
    assert dataclasses.replace(v, b="z") == V(1, "z")
    assert dataclasses.asdict(v) == dataclasses.asdict(D(1))


def test_a_mutable_value_class_is_a_slotted_dataclass() -> None:
    for _ in range(20):
        a, b = Counter(), Counter()
        a.n += 1
        a.seen.add(1)
        assert (a, b) == (Counter(1, {1}), Counter())
        assert a.seen is not b.seen  # a fresh default per instance
    with pytest.raises(TypeError, match="unhashable"):
        hash(Counter())


def test_unsupported_dataclass_features_are_refused() -> None:
    with pytest.raises(TypeError, match="non-default argument 'b'"):

        @value
        class Bad:
            a: int = 0
            b: int  # type: ignore[misc]

    with pytest.raises(TypeError, match="init=False"):

        @value
        class NoInit:
            a: int = field(default=0, init=False)

    with pytest.raises(TypeError, match="cannot extend"):

        @value
        class Sub(V):
            d: int = 0


def test_a_subclass_init_that_calls_the_value_init_runs_once_per_instance() -> None:
    runs: list[int] = []

    class Sub(V):
        def __init__(self, a: int) -> None:
            runs.append(a)
            super().__init__(a)

    for n in range(20):  # across the compilation of V's __init__
        assert Sub(n).a == n
    assert runs == list(range(20))
