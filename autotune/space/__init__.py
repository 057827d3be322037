"""The search space a YAML file describes, every sample of it valid (docs/search-spaces.md)."""

__all__ = ["model", "schema", "shipped", "specs"]
