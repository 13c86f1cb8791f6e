"""Proxy chains: this proxy as one component of a conductor's chain.

Contract: ``envelope`` (the conductor dialects' successor envelopes, unwrapped and wrapped by
byte splicing) and ``component`` (one component's conductor connection, split into its client and
agent sides). Pure.
"""
