"""The protocol core (pure): frames in, frames and notes out.

Contract: everything between bytes read and bytes to write, with no I/O (sans-IO, like h11 and
mitmproxy's core): ``framing`` (newline framing with a bounded line), ``rawjson`` (exact parsing
and encoding), ``rawscan`` (where values sit in the bytes), ``rawsplice`` (lossless rewriting),
``chain`` (the middleware interface and its fold), ``errors`` (the JSON-RPC error codes and
the one builder of an error response), ``pipeline`` (the protocol object of one
connection: routing, request tracking, version negotiation), the engines it calls (``rewrite``,
``batches``, ``blocks``, ``divert``, ``oversize``, ``unparsed``; what of the connection they see
is ``host``), its notes (``notes``), request tables (``tracking``) and block scan (``scan``, with
an optional C accelerator ``_scan.c``), and ``coalesce`` (the outbound queue that merges updates
under backpressure). It returns what the shell must do as values; it never awaits, reads a clock
or logs. The map of the rooms is docs/architecture.md.
"""
