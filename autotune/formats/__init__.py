"""The files autotune writes and reads back: the seed schema (best_config.yaml), verl overrides and TRL's
trl_config.yaml."""

__all__ = ["read", "rollout", "seed_yaml", "target", "trl", "verl", "verl_table"]
