"""The protocol object of one connection and the engines it calls.

Contract: ``pipeline`` (``Connection``: routing, request tracking, version negotiation, the
chain), what of it the engines see (``host``), the engines (``rewrite``, ``batches``, ``blocks``,
``divert``, ``oversize``, ``unparsed``), ``negotiate`` (the version an ``initialize`` response
fixes), ``observe`` (the notes that describe a frame and its fate) and ``tracking`` (the bounded
tables of requests awaiting an answer). Pure: values in, values out.
"""
