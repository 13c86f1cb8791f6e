"""The permission policy: one rule set answering, refusing and auditing what agents ask for.

Contract: a pure package (no I/O, no clock, no logging). ``model`` holds the values (the
validated ``policy:`` section, the request summary a decision reads, the verdict), ``globs``
the path patterns, ``decide`` the decision and the answer it picks among the options offered,
``requests`` the summaries built from ACP messages (with the bounded tool-call table v1 needs),
``middleware`` the chain link that applies a policy to one connection, ``audit`` the
hash-chained audit lines and their check, ``parse`` the ``policy:`` section of the config file.
The shell opens the audit file and hands the middleware its sink.
"""
