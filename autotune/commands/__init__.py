"""The commands, one module each with its parser (`add_parser`) and its entry point (`run`), registered in
`COMMANDS` in the order `autotune --help` lists them. A command's work lives in its stage's package."""

from autotune.commands import check, lengths, models, probe, report, run, spaces, worker

__all__ = [
    "COMMANDS",
    "arguments",
    "check",
    "lengths",
    "models",
    "probe",
    "report",
    "run",
    "spaces",
    "worker",
]

COMMANDS = {
    "probe": probe,
    "run": run,
    "report": report,
    "worker": worker,
    "lengths": lengths,
    "check": check,
    "models": models,
    "spaces": spaces,
}
