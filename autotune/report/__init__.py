"""The report: pick the recommended trial and write best_config.yaml, the trainer's file, tables and plots."""

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
