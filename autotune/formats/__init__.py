"""The files autotune writes and reads back: the seed schema (best_config.yaml), verl overrides and launch
scripts (bash evaluates a script, Hydra's own parser reads the overrides, against verl 0.9.1's schema), TRL's
trl_config.yaml (read by TRL's own parser, or by the same rules over its shipped schema), and the user's own
file handed back with the tuned values (tuned_file)."""

__all__ = [
    "bash_eval",
    "defaults",
    "hydra_read",
    "launch_script",
    "read",
    "rollout",
    "seed_yaml",
    "target",
    "trl",
    "trl_read",
    "tuned_file",
    "tuned_values",
    "verl",
    "verl_config_file",
    "verl_defaults",
    "verl_launch",
    "verl_route",
    "verl_schema",
    "verl_table",
]
