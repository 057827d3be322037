"""The files autotune writes and reads back: the seed schema (best_config.yaml) and verl overrides."""
