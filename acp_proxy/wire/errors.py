"""JSON-RPC 2.0 error responses: the codes by name, and the one builder of an error response.

Contract: every error response the proxy writes on its own (a refused or oversize request, an
agent gone, a middleware's bad reply, a policy's or a budget's refusal, a replay that diverged)
is built here, in one shape, member for member (JSON-RPC 2.0 section 5.1):

    {"jsonrpc":"2.0","id":ID,"error":{"code":CODE,"message":MESSAGE[,"data":DATA]}}

``error_object`` gives it as a value (for a middleware's ``Reply`` and the chain, encoded later),
``error_bytes`` as the line itself (no newline), with the id's bytes exactly as the request
spelled them (``1E2`` stays ``1E2``, an integer above 2**64 stays exact) and ``null`` for a
request whose id could not be read. The two agree byte for byte once the value is encoded with
orjson. Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

import orjson

from acp_proxy.base.jsontypes import OMITTED, JsonObject, JsonValue, Omitted

# JSON-RPC 2.0's own codes.
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
# The implementation-defined server errors are -32000..-32099 (ACP names -32000
# "authentication required" and -32002 "resource not found"); -32000 is also what the socket
# server answers a connection it refuses before any request (the id is then null).
SERVER_ERROR: Final = -32000
# A request the permission policy refused (none of ACP's named codes, so an agent does not
# mistake it for a protocol fault).
POLICY_DENIED: Final = -32001
RESOURCE_NOT_FOUND: Final = -32002
# A prompt a budget refused: the Quotas and Limits RFD's ``quotaExceeded`` (a draft; its code is
# a placeholder there too).
QUOTA_EXCEEDED: Final = -32003
# ACP's own: the answer to a cancelled request.
REQUEST_CANCELLED: Final = -32800


def error_object(
    request_id: JsonValue, code: int, message: str, *, data: JsonValue | Omitted = OMITTED
) -> JsonObject:
    """The error response to the request whose id is ``request_id``, as a value; ``data``:
    ``error.data``, if any."""
    error: JsonObject = {"code": code, "message": message}
    if data is not OMITTED:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def error_bytes(
    id_bytes: bytes | None, code: int, message: str, data: bytes | None = None
) -> bytes:
    """The error response line (no newline) to the request whose id is written ``id_bytes``
    (``None`` or empty: ``null``); ``data``: the encoded JSON of ``error.data``, if any."""
    return b"".join(
        (
            b'{"jsonrpc":"2.0","id":',
            id_bytes or b"null",
            b',"error":{"code":',
            b"%d" % code,
            b',"message":',
            orjson.dumps(message),
            b"" if data is None else b',"data":' + data,
            b"}}",
        )
    )


__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "POLICY_DENIED",
    "QUOTA_EXCEEDED",
    "REQUEST_CANCELLED",
    "RESOURCE_NOT_FOUND",
    "SERVER_ERROR",
    "error_bytes",
    "error_object",
]
