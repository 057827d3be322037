"""The tuning run: `autotune run` and `autotune worker`, the loop over probe slots, the tuner that decides and
records each trial, and the live view."""

__all__ = ["live", "loop", "main", "prepare", "slots", "tuner", "worker"]
