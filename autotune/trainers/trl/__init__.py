"""TRL 1.16 behind autotune's trainer interface: as the trainer a study exports for (trl_trainer.py, with
space_check.py: what its GRPOTrainer can run) and as the engine of a probe (trl_engine.py)."""

__all__ = ["space_check", "trl_engine", "trl_trainer"]
