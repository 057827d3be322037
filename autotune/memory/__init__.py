"""Memory: the analytic model of a probe rank's peak, its calibration, sharded estimates and advice."""

__all__ = ["advice", "gpus", "model", "sharded"]
