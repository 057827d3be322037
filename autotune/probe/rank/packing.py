"""A rollout as verl's training passes see it: samples of their own lengths, packed without padding.

verl packs a micro batch's sequences into one row (`use_remove_padding`, on by default): input ids of shape
(1, total tokens), position ids restarting at every sequence, and the attention kept within each sequence
(flash-attn's varlen kernels on GPU; Hugging Face builds the same block-diagonal mask from the position ids).
The logits come out for every packed token, and each response token's log-prob is read at the position before
it. Example: prompts of 3 and 2 tokens, responses of 2 and 1 → one row of 8 tokens, positions 0 1 2 3 4 0 1 2;
the first response's tokens are predicted at packed positions 2 and 3, the second's at 6.

Micro batches, as verl forms them (verl/workers/engine/utils.py `prepare_micro_batches`):
- fixed: consecutive chunks of k samples;
- under a token budget B: the fewest micro batches of at most B tokens, balanced (utils/seqlen_balancing.py
  `rearrange_micro_batches`: ceil(tokens / B) of them, one more until every one holds at most B).
The probe's first micro batch of each pass is the worst case that is priced (`autotune.config.job_lengths`):
`plan_responses` sets the synthetic responses' lengths so that the first samples hold exactly those tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = [
    "Packed",
    "PassPacking",
    "Rollout",
    "balanced_micro_batches",
    "fit_prefix",
    "pack",
    "plan_responses",
    "prefix_under_budget",
]


@dataclass
class Rollout:
    """A rank's samples: each its prompt's tokens and its response's, no padding; the answers of one prompt
    are adjacent (rollout_n of them)."""

    prompts: list[torch.Tensor]
    responses: list[torch.Tensor]
    max_response_length: int

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def lengths(self) -> list[int]:
        return [len(p) + len(r) for p, r in zip(self.prompts, self.responses, strict=True)]

    @property
    def response_lengths(self) -> list[int]:
        return [len(r) for r in self.responses]

    def padded_responses(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, mask) of shape (samples, max_response_length): the per-token tensors verl keeps."""
        ids = torch.zeros(len(self), self.max_response_length, dtype=torch.long)
        mask = torch.zeros(len(self), self.max_response_length, dtype=torch.float32)
        for row, response in enumerate(self.responses):
            ids[row, : len(response)] = response
            mask[row, : len(response)] = 1.0
        return ids.to(device), mask.to(device)


@dataclass
class Packed:
    """One packed micro batch: the model's inputs, and where each response token's prediction sits."""

    input_ids: torch.Tensor  # (1, tokens)
    position_ids: torch.Tensor  # (1, tokens)
    labels: torch.Tensor  # (tokens,): the next token at every position (verl rolls the ids by one)
    response_positions: torch.Tensor  # (samples, max_response_length): packed position predicting each token
    response_mask: torch.Tensor  # (samples, max_response_length)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def responses_of(self, per_token: torch.Tensor) -> torch.Tensor:
        """A per-packed-token tensor (tokens,) as (samples, max_response_length), 0 where there is none."""
        return per_token[self.response_positions] * self.response_mask.to(per_token.dtype)


def pack(rollout: Rollout, indices: Sequence[int], device: torch.device) -> Packed:
    """The samples at `indices` packed into one row, as verl's remove-padding path builds it."""
    pieces, positions = [], []
    where = torch.zeros(len(indices), rollout.max_response_length, dtype=torch.long)
    mask = torch.zeros(len(indices), rollout.max_response_length, dtype=torch.float32)
    offset = 0
    for row, index in enumerate(indices):
        prompt, response = rollout.prompts[index], rollout.responses[index]
        pieces += [prompt, response]
        length = len(prompt) + len(response)
        positions.append(torch.arange(length))
        # the logit at position t predicts token t + 1: the response's j-th token is read at p - 1 + j
        start = offset + len(prompt) - 1
        where[row, : len(response)] = torch.arange(start, start + len(response))
        mask[row, : len(response)] = 1.0
        offset += length
    ids = torch.cat(pieces)
    return Packed(
        input_ids=ids.unsqueeze(0).to(device),
        position_ids=torch.cat(positions).unsqueeze(0).to(device),
        labels=torch.roll(ids, shifts=-1).to(device),
        response_positions=where.to(device),
        response_mask=mask.to(device),
    )


# --- micro batches ------------------------------------------------------------------------------------------


def prefix_under_budget(lengths: Sequence[int], budget: int) -> int:
    """How many leading samples fit in `budget` tokens (at least one: verl asserts every sequence fits)."""
    total, count = 0, 0
    for length in lengths:
        if count and total + length > budget:
            break
        total += length
        count += 1
    return count


def balanced_micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """verl's rule for a token budget: ceil(tokens / budget) micro batches (at most one per sample), balanced
    by tokens, one more until each holds at most `budget`. Balanced here by the longest-first greedy rule
    (verl uses Karmarkar-Karp's differencing): the count, which decides the time, is the same rule's."""
    if not lengths:
        return []
    count = min(len(lengths), -(-sum(lengths) // budget))
    while True:
        bins: list[list[int]] = [[] for _ in range(count)]
        loads = [0] * count
        for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            lightest = loads.index(min(loads))
            bins[lightest].append(index)
            loads[lightest] += lengths[index]
        if max(loads) <= budget or count == len(lengths):
            return [sorted(b) for b in bins if b]
        count += 1


@dataclass
class PassPacking:
    """What one pass packed: for `autotune probe`'s output and the memory model's calibration."""

    micro_batches: int = 0
    tokens: int = 0
    max_tokens: int = 0
    sizes: list[int] = field(default_factory=list)  # tokens of each micro batch of the first step

    def add(self, tokens: int) -> None:
        self.micro_batches += 1
        self.tokens += tokens
        self.max_tokens = max(self.max_tokens, tokens)

    def to_dict(self) -> dict[str, int]:
        return {"micro_batches": self.micro_batches, "tokens": self.tokens, "max_tokens": self.max_tokens}


# --- the synthetic responses' lengths --------------------------------------------------------------------


def fit_prefix(
    prompts: Sequence[int], responses: list[int], start: int, end: int, tokens: int, limit: int
) -> None:
    """Change responses[start:end] (each within 1..limit) so that the first `end` samples hold `tokens` in
    all, as near as the limits allow: from the last sample back, each takes what it can of the difference."""
    missing = tokens - sum(prompts[:end]) - sum(responses[:end])
    for index in range(end - 1, start - 1, -1):
        if missing == 0:
            return
        new = min(limit, max(1, responses[index] + missing))
        missing -= new - responses[index]
        responses[index] = new


def plan_responses(
    prompts: Sequence[int],
    responses: Sequence[int],
    limit: int,
    fixed: Sequence[tuple[int, int]] = (),
    budgets: Sequence[tuple[int, int]] = (),
) -> list[int]:
    """Response lengths for the synthetic rollout: the drawn ones, changed so that each pass's first micro
    batch holds its priced tokens.

    `fixed`: (samples, tokens): the first `samples` samples hold `tokens` (a fixed micro batch's worst case).
    `budgets`: (pool, tokens): under a token budget, the first samples of the first `pool` samples (a GPU's
    mini batch or share) hold exactly `tokens`: the micro batch verl fills to its budget. Prefixes are fitted
    shortest first, each changing only the samples past the one before it."""
    planned = list(responses)
    targets: list[tuple[int, int]] = [(samples, tokens) for samples, tokens in fixed]
    for pool, tokens in budgets:
        total, count = 0, 0
        while count < pool and total < tokens:
            total += prompts[count] + planned[count]
            count += 1
        targets.append((count, tokens))
    done = 0
    for samples, tokens in sorted(set(targets)):
        if samples > done:
            fit_prefix(prompts, planned, done, samples, tokens, limit)
            done = samples
    return planned
