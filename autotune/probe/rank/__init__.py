"""Inside a probe rank, imported only by the programs in runners/: models, a PPO/GRPO iteration, measures."""

__all__ = [
    "measure",
    "memory_wall",
    "model_build",
    "packing",
    "pass_math",
    "ppo",
    "process",
    "prompts",
    "rl_math",
    "sharding",
    "trace",
    "trace_passes",
    "trace_resident",
    "verl_math",
]
