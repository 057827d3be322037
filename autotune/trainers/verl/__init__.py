"""verl 0.9.1 behind autotune's trainer interface: as the trainer a study exports for (verl_trainer.py) and
as the engine of a probe (verl_engine.py)."""

__all__ = ["verl_engine", "verl_export", "verl_trainer"]
