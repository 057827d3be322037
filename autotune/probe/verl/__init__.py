"""The verl probe backend: run real verl (`python -m verl.trainer.main_ppo`) for a few steps and read it."""

__all__ = ["backend", "cpu", "dataset", "failures", "install", "metrics", "run_log", "verl_run"]
