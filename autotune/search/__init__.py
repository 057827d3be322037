"""The search: spaces, the Optuna study, the tuner loop, storages, probe slots, `run` and `worker`."""
