"""autotune: measured, memory-safe batch settings for verl-style PPO/GRPO post-training."""

__all__ = [
    "check",
    "cli",
    "commands",
    "config",
    "data",
    "errors",
    "files",
    "formats",
    "memory",
    "models",
    "probe",
    "report",
    "run",
    "search",
    "space",
    "status",
    "study",
    "swap",
    "trainers",
    "units",
]

from importlib import metadata

try:  # one version, pyproject.toml's, as the installed distribution reports it
    __version__ = metadata.version("autotune-rl")
except metadata.PackageNotFoundError:  # a checkout on sys.path that was never installed
    __version__ = "unknown"
