"""Inside a probe rank (imported only by the programs in runners/): models, one PPO/GRPO iteration, measurement."""
