"""Propose and decide: the sampler that chooses the next configuration, its speed surrogate, and the policy
that prunes a configuration before it is probed."""

__all__ = ["policy", "sampler", "surrogate"]
