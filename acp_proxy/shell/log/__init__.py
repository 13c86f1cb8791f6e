"""The proxy's own log: structured, bounded, never on stdout, never blocking a session.

Contract: ``logsetup`` (structlog configured once, to stderr or a log file), ``logwriter`` (log
lines written without blocking), ``notelog`` (the core's notes as log events), ``framelog`` (the
debug log's per-frame lines) and ``repeats`` (a repeated warning logged once, then counted).
"""
