"""The report: select the Pareto-best trial and write best_config.yaml, verl overrides, tables and plots."""
