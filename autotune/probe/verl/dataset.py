"""The prompts a verl probe trains on: a parquet of the recipe's shape in verl 0.9.1's RL dataset layout.

verl's `RLHFDataset` (verl/utils/dataset/rl_dataset.py) reads a `prompt` column of chat messages, and its
reward loop reads `data_source` and `reward_model.ground_truth` (verl/experimental/reward_loop/reward_manager/
naive.py:42-43). `data_source` "openai/gsm8k" is scored by verl's default reward with the standard library
only (verl/utils/reward_score/__init__.py:44-47), from a plain number as the ground truth. Each prompt is at
least `prompt_tokens` long: verl's agent loop left-truncates a longer one to max_prompt_length
(verl/experimental/agent_loop/agent_loop.py:437-446), so every prompt the probe times has exactly that length,
as every response runs to max_response_length (ignore_eos).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

__all__ = ["DATA_SOURCE", "prompt_text", "write_dataset"]

DATA_SOURCE = "openai/gsm8k"
WORDS = ("count", "the", "apples", "in", "each", "basket", "and", "add", "them", "up")


def prompt_text(index: int, prompt_tokens: int, count_tokens: Callable[[str], int] | None = None) -> str:
    """A question at least `prompt_tokens` long: words until the tokenizer counts enough (without one, twice
    as many words as tokens: every word is at least one token)."""
    words = [f"Question {index}:"]
    target = prompt_tokens if count_tokens else 2 * prompt_tokens
    step = max(8, prompt_tokens // 8)
    while True:
        words += [WORDS[(len(words) + k + index) % len(WORDS)] for k in range(step)]
        text = " ".join(words) + '. Output the final answer after "####".'
        if (count_tokens(text) if count_tokens else len(words)) >= target:
            return text


def write_dataset(
    path: Path, rows: int, prompt_tokens: int, count_tokens: Callable[[str], int] | None = None
) -> Path:
    """`rows` distinct prompts in verl's layout, written to `path` (parquet)."""
    records = [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt_text(index, prompt_tokens, count_tokens)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(index % 97)},
            "extra_info": {"split": "train", "index": index},
        }
        for index in range(rows)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame.from_records(records).to_parquet(path, index=False)
    return path
