"""One proxied session and the runtimes around it.

Contract: ``pump`` (one session: two readers, two outboxes, the order in which it ends),
``runtime`` (the sessions with a spawned or a remote agent, and the stdio entry point),
``component_runtime`` (``acp-proxy component``: the proxy inside a conductor's chain),
``startfail`` (a session that cannot run still answers each request with an error), ``hooks``
(the observer interfaces and the process-wide observers), ``watchdog`` (a wait nothing will lift
is logged and lifted) and ``buffer_budget`` (the bound on what all sessions' buffers hold).
"""
