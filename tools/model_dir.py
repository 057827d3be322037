"""Write a local Hugging Face model folder (config.json and a tokenizer; random weights with --weights) for a
registry name.

verl reads a model's configuration and tokenizer from a path before it starts (its validate_config builds
its model config from `model.path`); autotune's test models have no hub id, so this gives them a folder:

    .venv/bin/python tools/model_dir.py tiny-llama /tmp/tiny-llama
    .venv/bin/python tools/model_dir.py tiny-llama /tmp/tiny-llama --weights   # one verl can train (on CPU)

The tokenizer is the registry's (autotune's offline BPE for registry names).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.models.folder import write_model_folder as write_model_dir

__all__ = ["write_model_dir"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", help="a registry name (autotune models)")
    parser.add_argument("out", type=Path, help="the folder to write")
    parser.add_argument("--weights", action="store_true", help="also random weights (seed 0)")
    args = parser.parse_args()
    print(write_model_dir(args.name, args.out, args.weights))
    return 0


if __name__ == "__main__":
    sys.exit(main())
