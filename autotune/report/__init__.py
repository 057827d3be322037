"""The report: select the Pareto-best trial and write best_config.yaml, verl overrides, tables and plots."""

__all__ = [
    "command",
    "console",
    "data",
    "gain",
    "html",
    "lines",
    "markdown",
    "missing_gain",
    "pick",
    "selection",
    "tables",
    "write",
]
