"""The tuning run: `autotune run` and `autotune worker`, the loop over probe slots, the tuner that decides and
records each trial, the live view, and `run --from`'s reading and handing back of the user's own file."""

__all__ = [
    "from_file",
    "identity",
    "job_data",
    "live",
    "loop",
    "main",
    "prepare",
    "slots",
    "tuned",
    "tuner",
    "worker",
]
