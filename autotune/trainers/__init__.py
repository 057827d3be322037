"""The trainers autotune tunes jobs for, each behind one interface (base.py), in a package of its own (verl/,
trl/); the built-in probe's engine (builtin.py); and the registry that finds them by name (registry.py)."""

__all__ = ["base", "builtin", "export", "registry", "trl", "verl"]
