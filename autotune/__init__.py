"""autotune: measured, memory-safe batch settings for verl-style PPO/GRPO post-training."""

__version__ = "0.1.0"
