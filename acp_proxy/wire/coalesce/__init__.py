"""The outbound queue toward one side: bounded, ordered, coalescing under backpressure.

Contract: ``queue`` (the queue itself), ``keys`` (a waiting line's merge class and entity),
``merge`` (how waiting updates of one entity combine, per the v2 Metadata Patches RFD: clears and
removals kept), ``take`` (cutting the head for one write), ``gate`` (when to write toward a peer
the queue merges for), ``pace`` (the consumer's reading pace) and ``rate`` (the optional rate
limit). Pure: no clock read, no I/O.
"""
