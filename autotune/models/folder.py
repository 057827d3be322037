"""A registry model as a Hugging Face folder, for a trainer that loads models by path (verl).

    write_model_folder("tiny-llama", Path("/tmp/tiny-llama"), weights=True)

autotune's test models have no hub id: verl reads their configuration and tokenizer from a folder before it
starts (its validate_config builds its model config from `model.path`), and on CPU it trains them, which
needs weights too: random, as the built-in probe's (`--weights random`).
"""

from __future__ import annotations

from pathlib import Path

from autotune.models.catalog import resolve_model
from autotune.models.tokenizer import load_tokenizer

__all__ = ["write_model_folder"]


def write_model_folder(name: str, out: Path, weights: bool = False) -> Path:
    """`name`'s config and tokenizer (the registry's; autotune's offline BPE for its own models) in `out`;
    with `weights`, random float32 weights (seed 0) too."""
    spec = resolve_model(name)
    load_tokenizer(spec).save_pretrained(out)
    if not weights:
        spec.config.save_pretrained(out)
        return out
    import torch
    from transformers.utils import logging

    from autotune.models.catalog import build_causal_lm

    torch.manual_seed(0)
    model = build_causal_lm(spec, torch.float32)
    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # "Writing model shards" would cut into a run's trial lines
    try:
        model.save_pretrained(out)
    finally:
        if shown:
            logging.enable_progress_bar()
    return out
