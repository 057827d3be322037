"""The files autotune writes and reads back: the seed schema (best_config.yaml), verl overrides and launch
scripts (read by Hydra's own parser, against verl 0.9.1's schema) and TRL's trl_config.yaml."""

__all__ = [
    "hydra_read",
    "launch_script",
    "read",
    "rollout",
    "seed_yaml",
    "target",
    "trl",
    "verl",
    "verl_defaults",
    "verl_schema",
    "verl_table",
]
