"""The permission policy: one rule set answering, refusing and auditing what agents ask for.

Contract: a pure package (no I/O, no clock, no logging). ``policy_model`` holds the values (the
validated ``policy:`` section, the request summary a decision reads, the verdict), ``globs`` the
path patterns, ``decide`` the decision (``fastdecide``: the same decision from indexed glob keys)
and the answer it picks among the options offered, ``requests`` the summaries built from ACP
messages (with the bounded tool-call table v1 needs), ``policy_link`` the chain link that applies a
policy to one connection, ``audit`` the hash-chained audit lines and their check, ``policy_parse``
the ``policy:`` section of the config file, ``policy_schema`` its JSON schema and
``policy_explain`` its plain-words explanation. The shell opens the audit file and hands the
middleware its sink.
"""
