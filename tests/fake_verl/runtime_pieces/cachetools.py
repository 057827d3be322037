"""A stand-in for cachetools: only importable (the CPU runtime check imports it)."""
