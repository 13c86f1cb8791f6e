"""Lines as peers write them (ordinary, hostile, cut) and a needle-filtered middleware: shared
by the block, watch and live-view tests."""

from __future__ import annotations

from acp_proxy.base.jsontypes import JsonObject
from acp_proxy.wire.chain import (
    FORWARD,
    BaseMiddleware,
    MessageContext,
    Replace,
    Verdict,
)


class TagToolCalls(BaseMiddleware):
    """Rewrites tool_call_update notifications (needle-filtered, like the rules middleware)."""

    needles: tuple[bytes, ...] = (b'"tool_call_update"',)

    def __call__(self, message: JsonObject, ctx: MessageContext) -> Verdict:
        params = message.get("params")
        if not isinstance(params, dict):
            return FORWARD
        update = params.get("update")
        if not isinstance(update, dict) or update.get("sessionUpdate") != "tool_call_update":
            return FORWARD
        meta: JsonObject = {"x.dev/k": 1}
        new_update: JsonObject = {**update, "_meta": meta}
        return Replace(({**message, "params": {**params, "update": new_update}},))


def notif(kind: str, extra: str = "") -> bytes:
    return (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
        b'{"sessionUpdate":"' + kind.encode() + b'","toolCallId":"t"' + extra.encode() + b"}}}"
    )


LINES = [
    b'{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":2,"info":{"name":"a","version":"1"},"capabilities":{}}}',
    notif("agent_message_chunk"),
    notif("tool_call_update"),
    notif("tool_call_update", ',"t2":"\\u00e9"'),
    notif("agent_message_chunk", ',"x":"caf\\u00e9 \\/ ok"'),
    notif("plan_update", ',"n":123456789012345678901234567890'),
    b'{"jsonrpc":"2.0","id":7,"method":"session/request_permission","params":{"sessionId":"s"}}',
    b'{"jsonrpc":"2.0","id":3,"result":{}}',
    b'{"jsonrpc":"2.0","id":"late","result":null}',
    b"[" + notif("tool_call_update") + b"," + notif("agent_message_chunk") + b"]",
    b"plain text banner",
    b"\x1b[0m" + notif("agent_message_chunk"),
    b"  " + notif("agent_message_chunk"),
    b"",
    b"   ",
    b"{not json",
    notif("agent_message_chunk") + b"\r",
]


CLIENT_LINES = [
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":2}}',
    b'{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"s"}}',
    b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}',
    b'{"jsonrpc":"2.0","id":7,"result":{"outcome":{"outcome":"cancelled"}}}',
    # Escaped client frames are parsed on the per-line path (``_client_needs_parse``), so one
    # with a broken escape is reported NotParsed; the block path used to forward it silently.
    b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"caf\\u00e9"}}',
    b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"\\u00zz"}}',
    b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"a\\/b"}}',
    b"garbage",
    b"",
]


AGENT_LINES = [
    *LINES,
    b'{"jsonrpc":"2.0","method":"session/update","params":{"update":',  # starts like JSON
    b'{"jsonrpc":"2.0","method":"x","params":[' + b"1," * 700 + b"1]}",  # over the budget
    b'[{"jsonrpc":"2.0","id":9,"method":"fs/read_text_file","params":{}}]',
    b"[]",
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
    b'{"sessionUpdate":"tool_call_update","toolCallId":"c","_meta":{"zed.dev/debugMode":1}}}}',
]


USER_LINES = [*CLIENT_LINES, b'{"a":', b"5", b' {"jsonrpc":"2.0","method":"m"}']
