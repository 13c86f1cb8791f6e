"""The I/O shell: the only room that does I/O (processes, pipes, sockets, signals, clocks, logs).

Contract: moves bytes between the streams and the pure core (``acp_proxy.wire``) and runs what the
core returns. It never decides what a message becomes; the core does. Its rooms, from one
session outwards: ``reader`` (one direction's reads through the core), ``outbox`` (the queues
toward one side and its writer), ``budget`` (the process-wide bound on buffered bytes),
``session`` (one session: two readers, two outboxes, the end-of-session order), ``notelog`` (log
lines for the core's notes), ``drain`` (after the agent's exit), ``runtime`` (the agent's
lifecycle around a session, stdio), ``process`` and ``spawn`` (the agent child, its process
group, no orphans), ``transports`` (file descriptors as anyio streams), ``sockets`` (``--listen``
and ``--connect``), ``hooks`` (observer interfaces, process-wide observers) and ``logsetup``
(structlog on stderr).
"""
