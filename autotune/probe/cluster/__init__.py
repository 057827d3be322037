"""Probes on the user's Ray cluster (`--ray ADDRESS`): the tuner joins the cluster, checks before any probe
that it has the nodes and GPUs asked for, and runs each probe's ranks as Ray actors in a placement group of
their own (docs/scale.md, "Ray")."""

__all__ = ["connect", "faults", "host", "placement", "ray_probe"]
