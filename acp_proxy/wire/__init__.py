"""The protocol core (pure): frames in, frames and notes out.

Contract: everything between bytes read and bytes to write, with no I/O (sans-IO, like h11 and
mitmproxy's core). It returns what the shell must do as values; it never awaits, reads a clock or
logs. The map of the rooms is docs/architecture.md. The shared vocabulary sits here: ``framing``
(newline framing with a bounded line, the frame types), ``chain`` (the middleware interface and its
fold), ``interest`` (which links of a chain may act on a frame), ``core_settings`` (the bounds'
defaults, the non-JSON policy and the coalescing settings the core reads), ``notes`` (what the core
reports: notes, the result of a frame, counters), ``errors`` (the JSON-RPC error codes and the one
builder of an error response) and ``written`` (the buffers of one write), ``attach`` (what a
session held across a dropped client owes its next one: the pure rules of detach and reattach). The
folders: ``raw`` (frames as bytes: exact JSON, scans, splicing, the block scan), ``connection``
(the protocol object of one connection and its engines), ``coalesce`` (the outbound queue that
merges updates under backpressure) and ``conductor`` (this proxy inside a conductor's chain).
"""
