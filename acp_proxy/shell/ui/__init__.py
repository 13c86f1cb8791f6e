"""The live view's I/O: ``--ui`` and ``acp-proxy ui``.

Contract: ``hub`` (the event history and the observers' cursors), ``live_server`` (the HTTP server
on the proxy's own event loop), ``routes`` (the answers to the requests that are not a
subscription) and ``tap`` (what the live view keeps of each frame of a session: raw items,
described only when someone watches). What an event says is the pure ``acp_proxy.ui``'s.
"""
