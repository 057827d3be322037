"""Model architectures (the registry, local directories) and tokenizers, for both sides of the probe."""

__all__ = ["catalog", "configs", "folder", "listing", "names", "tokenizer"]
