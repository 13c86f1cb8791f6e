"""WebSocket transport: agents reached over an authenticated ``ws://`` or ``wss://``.

Contract: ``websocket`` (a WebSocket connection as the proxy's NDJSON byte stream: one JSON-RPC
message per text frame, bytes unchanged), ``wsserver`` (``--listen ws://``: each accepted
connection's checks and upgrade: path, Host, Origin, the bearer token, before any ACP message),
``wsclient`` (``--connect ws://``: the upgrade toward a remote agent), ``wsconfig`` (what a
WebSocket address needs from the config, judged without ``websockets`` loaded) and ``wsjwt``
(bearer JWTs checked against a key set). The accept loop, the connection limit and the sessions
are ``shell.sockets``'; the ``websockets`` library (the ``remote`` extra) is loaded only for a
WebSocket address.
"""
