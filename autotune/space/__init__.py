"""The search space a YAML file describes, every sample of it valid (docs/search-spaces.md)."""

__all__ = ["loading", "model", "schema", "shipped", "specs"]
