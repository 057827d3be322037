"""The probe, tuner side: launch a probe's ranks in their own process group, time it out, classify it."""

__all__ = [
    "classify",
    "cluster",
    "conditions",
    "contract",
    "devices",
    "environment",
    "forkserver",
    "launcher",
    "launching",
    "rank",
    "traced",
    "trl_backend",
    "verl",
]
