"""The RFD algebra (pure): metadata patches, the upsert registry, merging, annotation, state.

Contract: what the ACP RFD "v2 Metadata Patches" says, as values and functions: ``patch`` (apply
and compose one-level ``_meta`` patches), ``registry`` (which ``session/update`` kinds are upserts
of which entity, per protocol version), ``updates`` (merging two updates of one entity without
losing clears and removals), ``annotate`` (adding a rule's keys to an upsert without tracking
state) and ``state`` (what a client stores: the reference the tests judge by). No I/O, no clock,
no logging; never mutates its arguments. Depends on nothing but ``acp_proxy.base.jsontypes``.
"""
