"""The outbound queue toward one side: bounded, ordered, coalescing under backpressure.

Contract: ``queue`` (the queue itself), ``fresh`` (the frames pushed since its last merge pass),
``run`` (its tail run: the per-entity index, how a waiting line joins it), ``keys`` (a waiting
line's merge class and entity, from one parse), ``merge`` (how waiting updates of one entity
combine, per the v2 Metadata Patches RFD: clears and removals kept), ``shape`` and
``bytes_merge`` (the bytes path: what a line is from one scan, and the merges of the kinds that
dominate real streams without a parse), ``take`` (cutting the head for one write), ``gate`` (when
to write toward a peer the queue merges for), ``pace`` (the consumer's reading pace) and ``rate``
(the optional rate limit). Pure: no clock read, no I/O.
"""
