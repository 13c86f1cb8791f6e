"""The control features at run time: the policy and the budgets.

Contract: ``policy_runtime`` (the policy's link in every connection's chain and its audit file)
and ``budget_runtime`` (the budgets' state file, their link, what a budget event becomes). The
decisions themselves are the pure ``acp_proxy.policy`` and ``acp_proxy.budget``'s.
"""
