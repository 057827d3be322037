"""Prompts for the probe, fed through a DataLoader with `num_workers = num_rollout_workers` as verl does.

Each worker does what a real RL dataloader does per sample: build a prompt text and tokenize it, then the
collate function truncates/left-pads to `max_prompt_length`. The text is synthetic (deterministic words),
so the measured work is real tokenisation without shipping a data set.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset

__all__ = ["SyntheticPrompts", "left_pad_collate", "prompt_batches"]

_WORDS = (
    "the model answers a question about numbers and code when reward scores each response token by token "
    "policy value advantage batch memory gradient rollout prompt length sample train update step clip "
    "learning rate optimizer state cache attention layer hidden vocabulary sequence reference critic"
).split()


class SyntheticPrompts(Dataset):
    """An endless-enough set of prompt texts, tokenized on access (in a DataLoader worker).

    With `texts` (the user's data, `autotune run --data`) the prompts are those texts, cycled, so the probe
    sees the data's own length distribution; otherwise synthetic texts that fill max_prompt_length.
    """

    def __init__(
        self,
        tokenizer,
        max_prompt_length: int,
        seed: int = 0,
        size: int = 10**9,
        texts: list[str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.seed = seed
        self.size = size
        self.texts = texts

    def __len__(self) -> int:
        return self.size

    def text(self, index: int) -> str:
        if self.texts:
            return self.texts[(self.seed + index) % len(self.texts)]
        rng = random.Random(self.seed * 1_000_003 + index)
        # About one word per token: enough words that every prompt fills max_prompt_length (worst case).
        return " ".join(rng.choice(_WORDS) for _ in range(self.max_prompt_length + 8))

    def __getitem__(self, index: int) -> list[int]:
        return self.tokenizer(self.text(index), add_special_tokens=False)["input_ids"]


def left_pad_collate(max_prompt_length: int, pad_token_id: int):
    """Keep each prompt's last max_prompt_length tokens and left-pad shorter ones (generation needs that)."""

    def collate(samples: list[list[int]]) -> dict[str, torch.Tensor]:
        ids = torch.full((len(samples), max_prompt_length), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(samples), max_prompt_length), dtype=torch.long)
        for row, tokens in enumerate(samples):
            tokens = tokens[-max_prompt_length:]
            if tokens:
                ids[row, -len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
                mask[row, -len(tokens) :] = 1
        return {"input_ids": ids, "attention_mask": mask}

    return collate


def prompt_batches(
    tokenizer,
    prompts_per_call: int,
    max_prompt_length: int,
    num_workers: int,
    rank: int,
    seed: int = 0,
    texts: list[str] | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless prompt batches for one rank; the workers persist across iterations, as in training."""
    dataset = SyntheticPrompts(tokenizer, max_prompt_length, seed=seed * 7919 + rank, texts=texts)
    loader = DataLoader(
        dataset,
        batch_size=prompts_per_call,
        shuffle=False,
        num_workers=num_workers,
        collate_fn=left_pad_collate(max_prompt_length, tokenizer.pad_token_id),
        persistent_workers=num_workers > 0,
        drop_last=True,
    )
    return iter(loader)
