"""The probe, tuner side: launch a probe's ranks in their own process group, time it out, classify it."""

__all__ = [
    "classify",
    "conditions",
    "contract",
    "devices",
    "engines",
    "environment",
    "forkserver",
    "launcher",
    "rank",
    "traced",
    "trl",
    "verl",
]
