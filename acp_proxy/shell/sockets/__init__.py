"""Socket transports: ``--listen`` (clients over TCP or Unix sockets) and ``--connect`` (the agent).

Contract: the package holds everything the proxy does with sockets, one room per concern, and
imports none of them itself (importing one room, such as ``address`` while the command line is
parsed, loads nothing else). The rooms, from pure to I/O:

* ``address``: socket URLs and the loopback rule (pure);
* ``opening``: what the first bytes of an accepted connection are (HTTP guard) and the lines a
  connection is told before any session (pure);
* ``streams``: a connected socket as an ``FdStream``, the opening line put back in front of it,
  closing with a last message without a reset;
* ``listening``: bound listening sockets (Unix socket files: mode, stale/live detection, removal);
* ``early``: the HTTP endpoints (``--metrics``, ``--ui``) and their binding, before the event
  loop when the address needs no lookup, so that the agent starts early with them too;
* ``serving``: the one accept loop (``--listen``, ``/metrics``, the live view) and reading an HTTP
  request head, bounded in size and time;
* ``connect``: connecting to an agent, and ``--connect`` with the client on stdio;
* ``detach``: ``detach_grace``: an agent session that client connections attach to, one at a
  time, and what it keeps while none is attached;
* ``reattach``: ``detach_grace`` on the server's side: a new connection's opening (reattach or a
  new held agent), and a held agent's life in the server;
* ``server``: ``--listen``: accepting, the connection limit, the handshake timeout, one session
  per connection, the server's signals and graceful shutdown.

Framing over a socket is the same newline-delimited JSON-RPC as stdio: ACP defines only the stdio
transport, so NDJSON over TCP/Unix is this proxy's convention, not part of the protocol. Sockets
are driven through ``transports.FdStream`` (non-blocking fd, chunked reads, the outbox's
``try_send`` fast path), the same stream type as stdio, so a socket costs what a pipe costs.
"""
