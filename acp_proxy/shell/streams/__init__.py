"""Byte streams and the two directions of a session.

Contract: ``transports`` (raw file descriptors, stdio and pipes, as anyio streams; the one
stream-errors tuple), ``reader`` (one direction's reads run through the core and handed on) and
``outbox`` (the bounded queues toward one side and their writer task; its write policy is the
core's ``wire.coalesce.gate``).
"""
