"""Inside a probe rank, imported only by the programs in runners/: models, a PPO/GRPO iteration, measures."""

__all__ = ["measure", "models", "packing", "ppo", "process", "prompts", "rl_math", "sharding", "trace"]
