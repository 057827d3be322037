"""The files autotune writes and reads back: the seed schema (best_config.yaml), verl overrides and launch
scripts (read by Hydra's own parser, against verl 0.9.1's schema) and TRL's trl_config.yaml (read by TRL's
own parser, or by the same rules over its shipped schema)."""

__all__ = [
    "defaults",
    "hydra_read",
    "launch_script",
    "read",
    "rollout",
    "seed_yaml",
    "target",
    "trl",
    "trl_read",
    "verl",
    "verl_defaults",
    "verl_schema",
    "verl_table",
]
