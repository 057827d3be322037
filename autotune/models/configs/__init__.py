"""The registry's architectures: the published config.json of each model name (data, no code)."""

__all__ = []
