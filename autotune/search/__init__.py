"""The search: spaces, the Optuna study, the tuner loop, storages, probe slots, `run` and `worker`."""

__all__ = [
    "coordination",
    "outage",
    "outcome",
    "plan",
    "policy",
    "run",
    "slots",
    "space",
    "storage",
    "study",
    "tuner",
    "worker",
]
