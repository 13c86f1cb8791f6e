"""The live view's pure room: the observer event stream, the entity view, export shapes and the
HTTP request checks of ``--ui`` and ``acp-proxy ui``.

Contract: pure functions and objects (no I/O, no clock, no event loop); the server that moves their
bytes lives in ``acp_proxy.shell.ui.live_server``. Nothing here is imported unless the live view is
on. The rooms: ``events`` (the observer event stream), ``display`` (what a frame is shown as),
``entities`` (the entity view), ``history`` (the bounded event history), ``pending`` (the frames
told and not described yet: a bounded ring), ``export`` (export shapes), ``deepjson`` (bounded
rendering of deep JSON) and ``security`` (the Host, Origin and token checks).
"""
