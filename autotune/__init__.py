"""autotune: measured, memory-safe batch settings for verl-style PPO/GRPO post-training."""

__all__ = [
    "check",
    "cli",
    "config",
    "data",
    "errors",
    "formats",
    "memory",
    "models",
    "probe",
    "report",
    "search",
    "status",
    "units",
]

__version__ = "0.1.0"
