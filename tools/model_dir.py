"""Write a local Hugging Face model folder (config.json and a tokenizer, no weights) for a registry name.

verl reads a model's configuration and tokenizer from a path before it starts (its validate_config builds
its model config from `model.path`); autotune's test models have no hub id, so this gives them a folder:

    .venv/bin/python tools/model_dir.py tiny-llama /tmp/tiny-llama

The tokenizer is the registry's (autotune's offline BPE for registry names).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.models.catalog import resolve_model
from autotune.models.tokenizer import load_tokenizer


def write_model_dir(name: str, out: Path) -> Path:
    spec = resolve_model(name)
    spec.config.save_pretrained(out)
    load_tokenizer(spec).save_pretrained(out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", help="a registry name (autotune models)")
    parser.add_argument("out", type=Path, help="the folder to write")
    args = parser.parse_args()
    print(write_model_dir(args.name, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
