"""Tests for acp_proxy.wire.errors: the named codes and the one builder of an error response."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from acp_proxy.base.jsontypes import JsonValue
from acp_proxy.wire import errors
from acp_proxy.wire.errors import error_bytes, error_object


def test_the_codes_are_json_rpc_s_and_acp_s() -> None:
    assert {name: getattr(errors, name) for name in errors.__all__ if name.isupper()} == {
        "PARSE_ERROR": -32700,
        "INVALID_REQUEST": -32600,
        "METHOD_NOT_FOUND": -32601,
        "INVALID_PARAMS": -32602,
        "INTERNAL_ERROR": -32603,
        "SERVER_ERROR": -32000,
        "POLICY_DENIED": -32001,
        "RESOURCE_NOT_FOUND": -32002,
        "QUOTA_EXCEEDED": -32003,
        "REQUEST_CANCELLED": -32800,
    }


@pytest.mark.parametrize(
    ("id_bytes", "code", "message", "data", "line"),
    [
        (
            b"1",
            -32603,
            "m",
            None,
            b'{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"m"}}',
        ),
        # The id as the request spelled it, not as a parser would write it again.
        (
            b"1E2",
            -32600,
            'a "b"',
            None,
            b'{"jsonrpc":"2.0","id":1E2,"error":{"code":-32600,"message":"a \\"b\\""}}',
        ),
        (
            b"123456789012345678901234567890",
            -32603,
            "x",
            None,
            b'{"jsonrpc":"2.0","id":123456789012345678901234567890,'
            b'"error":{"code":-32603,"message":"x"}}',
        ),
        (
            b'"s"',
            -32000,
            "é\n",
            None,
            b'{"jsonrpc":"2.0","id":"s","error":{"code":-32000,"message":"\xc3\xa9\\n"}}',
        ),
        # No id could be read: null (None and the empty id alike).
        (
            None,
            -32600,
            "no",
            None,
            b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"no"}}',
        ),
        (
            b"",
            -32600,
            "no",
            None,
            b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"no"}}',
        ),
        (
            b"7",
            -32603,
            "gone",
            b'{"exit":1}',
            b'{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"gone","data":{"exit":1}}}',
        ),
    ],
)
def test_error_bytes(
    id_bytes: bytes | None, code: int, message: str, data: bytes | None, line: bytes
) -> None:
    assert error_bytes(id_bytes, code, message, data) == line
    assert orjson.loads(line)["error"]["code"] == code


def test_error_object() -> None:
    assert error_object("a", -32601, "no") == {
        "jsonrpc": "2.0",
        "id": "a",
        "error": {"code": -32601, "message": "no"},
    }
    assert list(error_object(None, -32603, "m")) == ["jsonrpc", "id", "error"]
    assert error_object(1, -32003, "m", data={"a": None}) == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32003, "message": "m", "data": {"a": None}},
    }
    assert error_object(1, -32003, "m", data=None)["error"] == {
        "code": -32003,
        "message": "m",
        "data": None,  # null data is data; only an omitted one is left out
    }


_IDS = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text())
_MESSAGES = st.text(alphabet=st.characters(codec="utf-8"))


@given(_IDS, st.integers(-33000, -32000), _MESSAGES)
def test_the_value_and_the_line_agree_byte_for_byte(
    request_id: JsonValue, code: int, message: str
) -> None:
    encoded = orjson.dumps(error_object(request_id, code, message))
    assert encoded == error_bytes(orjson.dumps(request_id), code, message)
