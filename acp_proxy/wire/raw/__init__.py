"""Frames as bytes: exact JSON, where values sit, lossless splicing, the block scan.

Contract: pure functions over a frame's bytes, never a re-encode of what did not change:
``rawjson`` (exact parsing and encoding, JSON equality), ``rawscan`` (where values sit in the
bytes, what the bytes say without a parse), ``rawsplice`` (a changed value written into the bytes
by splicing), ``prefilter`` (the byte tests that let most frames pass unparsed) and
``block_scan`` (one scan of a block of lines; the optional C accelerator ``_scan.c``).
"""
