"""The report: select the Pareto-best trial and write best_config.yaml, verl overrides, tables and plots."""

__all__ = ["command", "console", "data", "html", "markdown", "selection", "tables", "write"]
