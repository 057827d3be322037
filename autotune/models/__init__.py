"""Model architectures (the registry, local directories) and tokenizers, for both sides of the probe."""

__all__ = ["configs", "listing", "names", "registry", "tokenizer"]
