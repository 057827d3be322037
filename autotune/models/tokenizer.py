"""Tokenizers that work offline: a local model's own, or the project's byte-level BPE.

- A local model directory (`--model /path/to/model`) that holds tokenizer files is tokenized with its own
  tokenizer (`AutoTokenizer.from_pretrained(path, local_files_only=True)`): token counts are exact.
- A registry name (`llama-2-7b`, `qwen2.5-7b`, ...) ships an architecture but not the real tokenizer, which
  cannot be downloaded here. Such models use the tokenizer shipped with this project,
  `autotune/models/tokenizer_files/autotune-bpe.json`: a byte-level BPE of ~23k tokens trained by
  `tools/make_tokenizer.py`
  on the English docstrings, comments and reference text of Python's standard library. Its token counts are
  an approximation of the real model's (of the same order for English prose; code, other languages and
  numbers can differ by tens of percent), so prompt and response lengths measured on user data are
  approximate too. For exact counts, point `--model` at a local directory that holds the real tokenizer.

The project tokenizer's ids are all below every registry model's vocabulary size (tested), so its ids can
feed any registry model. Special tokens: `<pad>` 0, `<s>` 1 (bos, added to every encoding, as Llama does),
`</s>` 2 (eos), and `<|im_start|>` / `<|im_end|>` for a generic ChatML chat template.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from autotune.models.catalog import ModelSpec

__all__ = [
    "load_local_tokenizer",
    "load_project_tokenizer",
    "load_tokenizer",
    "stand_in_template",
    "stand_in_tokenizer",
]

TOKENIZER_DIR = Path(__file__).resolve().parent / "tokenizer_files"
PROJECT_TOKENIZER_FILE = TOKENIZER_DIR / "autotune-bpe.json"
PROJECT_TOKENIZER_META = TOKENIZER_DIR / "autotune-bpe.meta.json"
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}
CHAT_TOKENS = ["<|im_start|>", "<|im_end|>"]

# Generic ChatML: `<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n`.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def load_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerBase:
    """The model's own tokenizer when its directory has one, else the project tokenizer (see module doc)."""
    if spec.tokenizer_path is not None:
        return load_local_tokenizer(spec.tokenizer_path, trust_remote_code=spec.trust_remote_code)
    tokenizer = load_project_tokenizer()
    vocab_size = getattr(spec.config, "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise UserError(
            f"model {spec.name!r} has a vocabulary of {vocab_size} tokens, fewer than the "
            f"{len(tokenizer)} of the project tokenizer: use a local model directory with its own tokenizer"
        )
    return tokenizer


def load_local_tokenizer(path: Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """A local directory's tokenizer, offline, with a pad token (set to eos when it has none)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (ValueError, OSError, KeyError, json.JSONDecodeError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UserError(
            f"cannot load the tokenizer in '{path}': {reason}; fix or remove its tokenizer files"
        ) from exc
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token  # batching needs padding; verl does the same
    return tokenizer


def load_project_tokenizer() -> PreTrainedTokenizerBase:
    """A fresh copy of the project tokenizer (callers may change padding side etc.)."""
    import copy

    return copy.deepcopy(_project_tokenizer())


@functools.cache
def _project_tokenizer() -> PreTrainedTokenizerBase:
    from transformers import PreTrainedTokenizerFast

    if not PROJECT_TOKENIZER_FILE.is_file():
        raise UserError(
            f"the project tokenizer '{PROJECT_TOKENIZER_FILE}' is missing: reinstall autotune, "
            f"or run `python tools/make_tokenizer.py` in a checkout"
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(PROJECT_TOKENIZER_FILE),
        additional_special_tokens=CHAT_TOKENS,
        model_max_length=1_000_000,  # the model's max_position_embeddings is the real limit
        padding_side="right",
        **SPECIAL_TOKENS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def stand_in_tokenizer(model: str, vocab_size: int) -> str:
    """What counts made with the project tokenizer for a registry `model` are, said plainly: the same for
    every registry name, and not the model's own tokenizer's."""
    return (
        f"approximate: autotune's byte-level BPE stand-in ({vocab_size:,} tokens), not {model}'s tokenizer "
        f"(a registry name ships no tokenizer and nothing is downloaded), so every registry name counts alike"
    )


def stand_in_template(model: str) -> str:
    """The chat template the project tokenizer applies: generic ChatML, not the registry model's own."""
    return f"a generic ChatML template (a stand-in, not {model}'s own chat template)"
