"""A stand-in for uvicorn: only importable (the CPU runtime check imports it)."""
