"""Budgets: per-session, per-process and per-label limits on what agents spend, which pause a
session (its next prompt is refused, or its running turn cancelled), never kill it.

Contract: a pure package (no I/O, no clock, no logging). ``budget_model`` holds the values (the
validated ``budgets:`` section, a limit, its actions), ``budget_parse`` reads the section of the
config file, ``budget_schema`` describes it for editors, ``budget_explain`` says it in plain words,
``ledger`` keeps the spend of every limit and its merge with the state file's, ``meters`` turns one
connection's ACP messages into spend, ``budget_link`` is the chain link that refuses prompts,
cancels turns and tells the editor. The shell opens the state file, hands the link the clock and
its sinks, and writes what the ledger holds.
"""
