"""The protocol object of one connection and the engines it calls.

Contract: ``pipeline`` (``Connection``: makes the state and the engines, the round trip's
step), what the engines see of the connection (``connstate``: its negotiated state and
counters; ``tables``: its request tables as every path updates them, and the version an
``initialize`` response fixes), the engines (``lines``, ``blocks``, ``rewrite``, ``batches``,
``divert``, ``oversize``, ``unparsed``), ``observe`` (the notes that describe a frame and its
fate) and ``tracking`` (the bounded tables of requests awaiting an answer). Pure: values in,
values out.
"""
