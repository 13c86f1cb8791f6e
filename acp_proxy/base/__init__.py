"""The ground floor: what every room of the proxy uses and that uses nothing of the proxy.

Contract: ``jsontypes`` (the JSON value types and the single ``OMITTED`` sentinel: omitted and
``null`` are different values everywhere) and ``values`` (``@value``, the frozen slotted
dataclass every value type is made with). Pure; imports nothing from ``acp_proxy``. Middleware
authors import the JSON types from ``acp_proxy.middleware``, the stable public path.
"""
