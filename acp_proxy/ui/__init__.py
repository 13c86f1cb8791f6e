"""The live view's pure room: the observer event stream, the entity view, export shapes and the
HTTP request checks of ``--ui`` and ``acp-proxy ui``.

Contract: pure functions and objects (no I/O, no clock, no event loop); the server that moves
their bytes lives in ``acp_proxy.shell.ui_server``. Nothing here is imported unless the live
view is on.
"""
