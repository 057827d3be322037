"""Memory: the analytic model of a probe rank's peak (architecture, states, activations, phases, breakdown)
and its calibration, sharded estimates, the budget a peak is judged against, the verdict on a config file (the
rollout phase beside the training phases), and advice."""

__all__ = [
    "activations",
    "advice",
    "architecture",
    "breakdown",
    "budget",
    "calibration",
    "gpus",
    "phases",
    "rollout_phase",
    "room",
    "sharded",
    "states",
    "verdict",
]
