"""The I/O shell: the only room that does I/O (processes, pipes, sockets, signals, clocks, logs).

Contract: moves bytes between the streams and the pure core (``acp_proxy.wire``) and runs what the
core returns. It never decides what a message becomes; the core does. Its folders, from one session
outwards: ``streams`` (byte streams, the reader and the outbox of each direction), ``session`` (one
session, the runtimes around it, observers, the watchdog, the buffer budget), ``agent`` (the agent
child: spawn, stop, stderr, drain), ``sockets`` (``--listen`` and ``--connect``), ``ws`` (the
WebSocket transport and its authentication), ``log`` (the proxy's own log), ``record`` (records on
disk), ``telemetry`` (metrics, tracing, the health probe), ``ui`` (the live view's server) and
``control`` (the policy and the budgets at run time).
"""
