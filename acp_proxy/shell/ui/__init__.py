"""The live view's I/O: ``--ui`` and ``acp-proxy ui``.

Contract: ``hub`` (the session tap, the event history, the observers' cursors), ``live_server``
(the HTTP server on the proxy's own event loop) and ``routes`` (the answers to the requests that
are not a subscription). What an event says is the pure ``acp_proxy.ui``'s.
"""
