"""Tests for acp_proxy.wire.raw.prefilter: the one pass-through predicate and the parse tests it
is made of."""

# ruff: noqa: E501 - wire bytes and their tables read best on one line each

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from acp_proxy.wire.raw.prefilter import FRAME_STARTS, passes_unparsed

UPDATE = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}'
RESPONSE = b'{"jsonrpc":"2.0","id":1,"result":{}}'
REQUEST = b'{"jsonrpc":"2.0","id":"r","method":"session/prompt","params":{}}'
NOTIFY = b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}'


@pytest.mark.parametrize(
    ("a2c", "raw", "passes"),
    [
        (True, UPDATE, True),
        (True, RESPONSE, False),  # the tables take its request out
        (True, REQUEST, False),  # the tables admit it
        # A nested id costs a parse, never a wrong answer.
        (True, b'{"method":"x","params":{"id":1}}', False),
        (True, b" " + UPDATE, False),  # something before the opener: the line path decides (divert)
        (True, b"hello", False),  # not a frame: diverted or refused by the line path
        (True, b"", False),
        (True, b"{}", True),
        (True, b"[{}]", True),  # a batch of notifications
        (True, b'[{"id":1,"result":{}}]', False),
        (True, b'{ "method":"x"}', True),
        (True, b'{\t"method":"x"}', True),
        (True, b"{x", False),
        (False, NOTIFY, True),
        (False, REQUEST, False),
        (False, RESPONSE, False),
        # An escape may hide an id.
        (False, b'{"method":"session/cancel","params":{"sessionId":"\\u0073"}}', False),
        (False, b'{"method":"x","params":{"path":"a\\/b"}}', False),
        (False, b'{"method":"x","params":{"t":"a\\nb"}}', True),  # \n hides nothing
        (False, b" " + NOTIFY, True),  # client lines are not diverted
    ],
)
def test_passes_unparsed(a2c: bool, raw: bytes, passes: bool) -> None:
    assert passes_unparsed(a2c, raw) is passes


def test_frame_starts_are_what_a_json_reader_takes_as_an_opener() -> None:
    # Every two-byte start in the set is the beginning of some frame orjson parses.
    for start in FRAME_STARTS:
        closer = b"}" if start[:1] == b"{" else b"]"
        body = {b'{"': b'{"a":1}', b"{}": b"{}", b"[{": b"[{}]", b"[[": b"[[]]", b"[]": b"[]"}.get(
            start, start + closer
        )
        assert body.startswith(start)
        orjson.loads(body)


_KEYS = st.text(max_size=6).filter(lambda k: k != "id")
_VALUES = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8), st.booleans())


@given(
    st.dictionaries(_KEYS, _VALUES, max_size=4),
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=6), st.none()),
    st.booleans(),
)
def test_a_message_with_an_id_is_never_passed_unparsed(
    rest: dict[str, object], rid: object, a2c: bool
) -> None:
    # The request tables see every request and response, whatever else the message holds and
    # wherever its id sits among the keys.
    for message in ({"id": rid, **rest}, {**rest, "id": rid}):
        assert passes_unparsed(a2c, orjson.dumps(message)) is False


@given(st.dictionaries(_KEYS, _VALUES, max_size=4))
def test_a_plain_notification_passes_from_either_side(params: dict[str, object]) -> None:
    raw = orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params})
    # orjson writes no escape that could hide an id (it writes "\u" only for control bytes).
    hides = b"\\u" in raw
    assert passes_unparsed(True, raw) is True
    assert passes_unparsed(False, raw) is not hides
