"""The protocol core (pure): frames in, frames and notes out.

Contract: everything between bytes read and bytes to write, with no I/O (sans-IO, like h11 and
mitmproxy's core): ``framing`` (newline framing with a bounded line), ``rawjson`` (exact parsing
and lossless rewriting), ``chain`` (the middleware interface and its fold), ``pipeline`` (one
connection's protocol state: the prefilter, the chain, batches, request tracking, versions,
diversion, oversize frames; its notes are ``notes``, its request tables ``tracking``, its block
scan ``scan``, with an optional C accelerator ``_scan.c``) and
``coalesce`` (the outbound queue that merges updates under
backpressure). It returns what the shell must do as values; it never awaits, reads a clock or logs.
"""
