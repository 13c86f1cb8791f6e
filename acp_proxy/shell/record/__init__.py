"""Session records on disk: written while frames pass, read back in bounded memory.

Contract: ``recorder`` (``--record``: frames appended as JSON Lines), ``recordfile`` (opening a
record or the log file safely: no link followed, private) and ``recordread`` (a record's sessions
read line by line). What a record line says is the pure ``acp_proxy.record``'s.
"""
