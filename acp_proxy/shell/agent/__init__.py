"""The agent's OS process: started, watched, stopped, never orphaned.

Contract: everything the proxy does with the agent child: ``spawn`` (the fork and exec before the
event loop, the parent-death signal, the early start), ``process`` (the started agent on the
event loop: the shutdown ladder, the exit code), ``stderr`` (the agent's stderr read to its end,
logged or copied, its last lines kept) and ``drain`` (after the agent exited: its last output and
the errors it owes reach the client).
"""
