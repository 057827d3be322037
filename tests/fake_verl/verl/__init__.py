"""A stand-in for verl 0.9.1, for autotune's tests on machines without GPUs (where real verl refuses to run
PPO): `python -m verl.trainer.main_ppo KEY=VALUE ...` with this folder on PYTHONPATH writes what verl writes —
the file logger's JSON lines and the console's step lines — or fails the ways verl fails. Not verl: it trains
nothing; its timings and memory figures are made up from the configuration so that a study has a shape."""

__version__ = "0.9.1"
