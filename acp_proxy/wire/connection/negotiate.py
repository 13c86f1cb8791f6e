"""Version negotiation: the protocol version an ``initialize`` response fixes.

Contract: a pure reading of the response (ACP digest §2.3: the negotiated version is
``result.protocolVersion`` of the ``initialize`` response, a JSON integer; an error response
negotiates nothing). The connection owns the negotiated state (``Connection._negotiate``).
"""

from __future__ import annotations

from acp_proxy.base.jsontypes import JsonObject, JsonValue
from acp_proxy.wire.connection.rewrite import encode
from acp_proxy.wire.notes import Note, UnusualVersion


def negotiated_version(
    response: JsonObject, notes: list[Note], current: int | None = None
) -> int | None:
    """The version ``response`` negotiates, ``None`` for none; an ``UnusualVersion`` note in
    ``notes`` when its value is not a plain positive integer, or when the session negotiated
    ``current`` already."""
    result = response.get("result")
    if not isinstance(result, dict) or "protocolVersion" not in result:
        return None
    version = result["protocolVersion"]
    if type(version) is float and version.is_integer() and version >= 1:
        # Version robustness: ``2.0`` means 2 to every JSON reader that has one number type
        # (JavaScript's included); treat it as 2 rather than disable every rule.
        notes.append(UnusualVersion(_json_text(version), f"treated as {int(version)}"))
        version = int(version)
    if type(version) is not int or version < 1:
        # A string, a fraction, zero, a boolean: no version the proxy knows. The rules stay
        # off for the session (frames pass untouched), and the log says so.
        notes.append(
            UnusualVersion(
                _json_text(version),
                "not a positive integer: no rule runs on this session, frames pass untouched",
            )
        )
        return None
    if current is not None:
        # A second initialize (a client bug, or a client that starts over) is forwarded and
        # answered as the agent decides, but the session's version stays the one the first
        # negotiated: the rules and patches of one protocol never switch to another mid-session.
        notes.append(
            UnusualVersion(
                str(version),
                f"a second initialize answered: the session keeps version {current}, "
                "negotiated first",
            )
        )
        return None
    return version


def _json_text(value: JsonValue) -> str:
    return (encode(value) or b"?").decode("utf-8", "replace")
