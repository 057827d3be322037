"""Memory: the analytic model of a probe rank's peak, its calibration, sharded estimates, the budget a peak is
judged against, the verdict on a config file (the rollout phase beside the training phases), and advice."""

__all__ = ["advice", "budget", "gpus", "model", "rollout_phase", "room", "sharded", "verdict"]
