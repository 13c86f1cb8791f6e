"""Budgets: per-session, per-process and per-label limits on what agents spend, which pause a
session (its next prompt is refused, or its running turn cancelled), never kill it.

Contract: a pure package (no I/O, no clock, no logging). ``model`` holds the values (the
validated ``budgets:`` section, a limit, its actions), ``parse`` reads the section of the config
file, ``schema`` describes it for editors, ``explain`` says it in plain words, ``ledger`` keeps
the spend of every limit and its merge with the state file's, ``meters`` turns one
connection's ACP messages into spend, ``middleware`` is the chain link that refuses prompts,
cancels turns and tells the editor. The shell opens the state file, hands the link the clock
and its sinks, and writes what the ledger holds.
"""
