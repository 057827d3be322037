"""A stand-in for fastapi: only importable (the CPU runtime check imports it)."""
