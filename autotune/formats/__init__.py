"""The files autotune writes and reads back: the seed schema (best_config.yaml) and verl overrides."""

__all__ = ["read", "rollout", "seed_yaml", "target", "verl", "verl_table"]
