"""Record: the Optuna study (storages, trials, the plan), what each probe's outcome records, dead tuners'
trials and storage outages."""

__all__ = ["coordination", "journal", "optuna_private", "outage", "outcome", "plan", "storage", "trials"]
