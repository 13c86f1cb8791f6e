"""The I/O shell: the only room that does I/O (processes, pipes, sockets, signals, clocks, logs).

Contract: moves bytes between the streams and the pure core (``acp_proxy.wire``) and runs what the
core returns: ``runtime`` (one session's readers, writers, queues and end-of-session ordering),
``process`` (the agent child, its process group, no orphans), ``transports`` (file descriptors as
anyio streams), ``sockets`` (``--listen`` and ``--connect``) and ``logsetup`` (structlog on
stderr). It never decides what a message becomes; the core does.
"""
