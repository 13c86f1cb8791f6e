"""JSON encoding of values of any depth, for what the live view serves.

Contract: pure functions from a JSON value to its bytes, byte for byte what ``orjson.dumps``
(compact) or ``json.dumps(indent=N, ensure_ascii=False)`` (pretty) writes, at any nesting. A
legal ACP frame may nest deeper than orjson encodes (254 levels: ``Recursion limit reached``)
or than Python's stack allows ``json.dumps`` (about 1,000: ``RecursionError``); such a value is
encoded here by a loop with its own stack, so a deep frame costs its bytes, never the stack.
The fast encoders run first; the loop only takes what they refuse.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, Final

import orjson

_END: Final = object()


def _compact_leaf(value: object) -> bytes:
    return orjson.dumps(value)


def _pretty_leaf(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def compact(value: object) -> bytes:
    """``orjson.dumps(value)``, at any depth."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return encode(value, None, _compact_leaf)


def pretty(value: object, indent: int = 2) -> bytes:
    """``json.dumps(value, indent=indent, ensure_ascii=False)`` as UTF-8, at any depth."""
    try:
        return json.dumps(value, indent=indent, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        return encode(value, indent, _pretty_leaf)


def encode(value: object, indent: int | None, leaf: Callable[[object], bytes]) -> bytes:
    """``value`` encoded without recursion: containers by a loop over an explicit stack,
    everything else by ``leaf``; ``indent=None``: compact (``,`` and ``:``), else ``json``'s
    pretty layout."""
    out: list[bytes] = []
    key_sep = b":" if indent is None else b": "
    pad = b"" if indent is None else b" " * indent
    # Each open container: an iterator over its items, whether it is an object, its closer.
    stack: list[tuple[Iterator[Any], bool, bytes]] = []
    item: object = value
    while True:
        if isinstance(item, dict) and item:
            out.append(b"{")
            stack.append((iter(item.items()), True, b"}"))
            first = True
        elif isinstance(item, list | tuple) and item:
            out.append(b"[")
            stack.append((iter(item), False, b"]"))
            first = True
        else:
            out.append(b"{}" if isinstance(item, dict) else b"[]" if item == [] else leaf(item))
            first = False
        while stack:
            items, is_object, closer = stack[-1]
            nxt: Any = next(items, _END)
            if nxt is _END:
                stack.pop()
                out.append(b"" if indent is None else b"\n" + pad * len(stack))
                out.append(closer)
                first = False
                continue
            if not first:
                out.append(b",")
            if indent is not None:
                out.append(b"\n" + pad * len(stack))
            if is_object:
                key, nxt = nxt
                out.append(leaf(key) + key_sep)
            item = nxt
            break
        else:
            return b"".join(out)
