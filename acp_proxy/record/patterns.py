"""Catastrophic backtracking in a regular expression, recognised before it ever runs.

Contract: pure. ``backtracking_risk`` reads a pattern's parse tree (Python's own ``re`` parser)
and says why matching it can take exponential or high polynomial time on some text, or ``None``.
It recognises the shapes that cause it in Python's backtracking engine: a quantifier inside an
unbounded quantifier with nothing between its turns that tells them apart (``(a+)+``,
``(\\w+\\s?)+``, ``(a|aa)+``), alternatives that can match the same text under one (``(a|a)*``)
and two unbounded quantifiers in a row over the same characters (``\\d+\\d+``, ``.*.*``).
Possessive quantifiers and atomic groups never backtrack and are never refused. It is a
conservative screen, not a proof: what it accepts is the usual, linear shape of a secret's
pattern (a literal prefix, then a character class).
"""

from __future__ import annotations

from re import _constants as c  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]
from typing import Any, Final

NESTED: Final = "a quantifier inside a quantifier (as in (a+)+)"
BRANCH: Final = "alternatives that can match the same text, under a quantifier (as in (a|a)*)"
ADJACENT: Final = "two unbounded quantifiers in a row over the same characters (as in \\d+\\d+)"

_ASCII = frozenset(range(128))
_DIGITS = frozenset(range(48, 58))
_SPACE = frozenset(b" \t\n\r\f\v")
_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_CATEGORIES: Final = {
    c.CATEGORY_DIGIT: (_DIGITS, True),
    c.CATEGORY_NOT_DIGIT: (_ASCII - _DIGITS, True),
    c.CATEGORY_SPACE: (_SPACE, True),
    c.CATEGORY_NOT_SPACE: (_ASCII - _SPACE, True),
    c.CATEGORY_WORD: (_WORD, True),
    c.CATEGORY_NOT_WORD: (_ASCII - _WORD, True),
}
_REPEATS = (c.MAX_REPEAT, c.MIN_REPEAT)
_CHAR_OPS = (c.LITERAL, c.NOT_LITERAL, c.IN, c.ANY)

# A set of characters: the ASCII ones, and whether any beyond ASCII is in it.
Chars = tuple[frozenset[int], bool]
_NONE: Final[Chars] = (frozenset(), False)


def _union(a: Chars, b: Chars) -> Chars:
    return a[0] | b[0], a[1] or b[1]


def _overlap(a: Chars, b: Chars) -> bool:
    return bool(a[0] & b[0]) or (a[1] and b[1])


def _literal(code: int) -> Chars:
    return (frozenset((code,)), False) if code < 128 else (frozenset(), True)


def _item_chars(op: Any, av: Any) -> Chars:
    """The characters one single-character item matches."""
    if op is c.LITERAL:
        return _literal(av)
    if op in (c.NOT_LITERAL, c.ANY):
        return _ASCII, True
    assert op is c.IN
    out = _NONE
    negate = False
    for kind, arg in av:
        if kind is c.NEGATE:
            negate = True
        elif kind is c.LITERAL:
            out = _union(out, _literal(arg))
        elif kind is c.RANGE:
            lo, hi = arg
            out = _union(out, (frozenset(range(lo, min(hi, 127) + 1)), hi >= 128))
        elif kind is c.CATEGORY:
            out = _union(out, _CATEGORIES.get(arg, (_ASCII, True)))
        else:
            out = (_ASCII, True)
    return (_ASCII - out[0], True) if negate else out


def _all_chars(seq: Any) -> Chars:
    """Every character anything in ``seq`` can match."""
    out = _NONE
    for op, av in seq:
        if op in _CHAR_OPS:
            out = _union(out, _item_chars(op, av))
        elif op in (*_REPEATS, c.POSSESSIVE_REPEAT):
            out = _union(out, _all_chars(av[2]))
        elif op is c.SUBPATTERN:
            out = _union(out, _all_chars(av[3]))
        elif op is c.ATOMIC_GROUP:
            out = _union(out, _all_chars(av))
        elif op is c.BRANCH:
            for alternative in av[1]:
                out = _union(out, _all_chars(alternative))
        elif op in (c.GROUPREF, c.GROUPREF_EXISTS):
            out = (_ASCII, True)
    return out


def _first(seq: Any) -> tuple[Chars, bool]:
    """The characters ``seq`` can start with, and whether it can match the empty string."""
    out = _NONE
    for op, av in seq:
        if op in _CHAR_OPS:
            return _union(out, _item_chars(op, av)), False
        if op in (*_REPEATS, c.POSSESSIVE_REPEAT):
            chars, empty = _first(av[2])
            out = _union(out, chars)
            if av[0] > 0 and not empty:
                return out, False
        elif op is c.SUBPATTERN:
            chars, empty = _first(av[3])
            out = _union(out, chars)
            if not empty:
                return out, False
        elif op is c.BRANCH:
            empty_any = False
            for alternative in av[1]:
                chars, empty = _first(alternative)
                out = _union(out, chars)
                empty_any = empty_any or empty
            if not empty_any:
                return out, False
        elif op in (c.GROUPREF, c.GROUPREF_EXISTS, c.ATOMIC_GROUP):
            return (_ASCII, True), False
    return out, True


def _varying(seq: Any) -> Chars:
    """The characters of the parts of ``seq`` whose length can vary (and so backtrack)."""
    out = _NONE
    for op, av in seq:
        if op in _REPEATS:
            inner = _all_chars(av[2]) if av[0] != av[1] else _varying(av[2])
            out = _union(out, inner)
        elif op is c.SUBPATTERN:
            out = _union(out, _varying(av[3]))
        elif op is c.BRANCH:
            alternatives = av[1]
            lengths = {_fixed_length(a) for a in alternatives}
            if len(lengths) > 1 or None in lengths:
                for alternative in alternatives:
                    out = _union(out, _all_chars(alternative))
    return out


def _fixed_length(seq: Any) -> int | None:
    total = 0
    for op, av in seq:
        if op in _CHAR_OPS:
            total += 1
        elif op in _REPEATS and av[0] == av[1]:
            inner = _fixed_length(av[2])
            if inner is None:
                return None
            total += av[0] * inner
        elif op is c.SUBPATTERN:
            inner = _fixed_length(av[3])
            if inner is None:
                return None
            total += inner
        elif op in (c.AT, c.ASSERT, c.ASSERT_NOT):
            continue
        else:
            return None
    return total


def _mandatory(seq: Any) -> list[Chars]:
    """The single characters ``seq`` always matches, each as the set it comes from."""
    out: list[Chars] = []
    for op, av in seq:
        if op in _CHAR_OPS:
            out.append(_item_chars(op, av))
        elif op in _REPEATS and av[0] >= 1 and av[0] == av[1]:
            out.extend(_mandatory(av[2]))
        elif op is c.SUBPATTERN:
            out.extend(_mandatory(av[3]))
    return out


def _ambiguous_branch(seq: Any) -> bool:
    """A branch in ``seq`` (outside atomic parts) whose alternatives can start alike."""
    for op, av in seq:
        if op is c.BRANCH:
            firsts = [_first(a) for a in av[1]]
            for i, (chars, empty) in enumerate(firsts):
                for other, other_empty in firsts[i + 1 :]:
                    if (empty and other_empty) or _overlap(chars, other):
                        return True
            if any(_ambiguous_branch(a) for a in av[1]):
                return True
        elif op in (*_REPEATS, c.SUBPATTERN):
            body = av[2] if op in _REPEATS else av[3]
            if _ambiguous_branch(body):
                return True
    return False


def _check(seq: Any) -> str | None:
    previous: Chars | None = None  # the last unbounded single-character repeat, if adjacent
    for op, av in seq:
        if op in _REPEATS:
            low, high, body = av
            if high == c.MAXREPEAT:
                if _ambiguous_branch(body):
                    return BRANCH
                varying = _varying(body)
                if (varying[0] or varying[1]) and not any(
                    not _overlap(m, varying) for m in _mandatory(body)
                ):
                    return NESTED
                single = _fixed_length(body) == 1
                if single:
                    chars = _all_chars(body)
                    if previous is not None and _overlap(previous, chars):
                        return ADJACENT
                    previous = chars
                    continue
            found = _check(body)
            if found:
                return found
            if low > 0:
                previous = None
        elif op is c.SUBPATTERN:
            found = _check(av[3])
            if found:
                return found
            previous = None
        elif op is c.BRANCH:
            for alternative in av[1]:
                found = _check(alternative)
                if found:
                    return found
            previous = None
        elif op in (c.AT, c.ASSERT, c.ASSERT_NOT):
            continue
        else:
            previous = None  # a character, or a part that never backtracks
    return None


def backtracking_risk(pattern: str) -> str | None:
    """Why ``pattern`` can make a search take exponential or high polynomial time (``None``:
    it has none of the shapes that do). The pattern compiles (``re.error`` otherwise)."""
    return _check(_parser.parse(pattern).data)
