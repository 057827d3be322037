"""The token lengths of the job's samples, and the tokens the largest micro batch of each training pass holds.

verl packs a micro batch's sequences without padding (`use_remove_padding`, on by default), so a micro batch
costs the tokens its samples have, prompt + response, not micro × (Lp + Lr). Which tokens those are depends on
the data. Example: GSM8K-like prompts of ~120 tokens and responses of ~300 under limits of 512/1024: a fixed
micro batch of 40 holds about 17,000 tokens on the data, 61,440 at the limits.

    lengths = JobLengths.from_counts(prompt_counts, response_counts, response_source="data")
    tokens = pass_tokens(config, lengths, gpus=8)     # PassTokens(update=..., forward=..., critic_*=...)

What "the largest micro batch" is, per pass (`pass_tokens`):
- a fixed micro batch of k samples: at the limits k × (Lp + Lr); on the data the 99th percentile of the tokens
  of k consecutive samples (n answers share a prompt), by a seeded simulation: a step has many micro batches,
  and its largest is what meets the memory;
- a token budget B (`use_dynamic_bsz`): verl cuts a GPU's mini batch (update) or share (forward passes) into
  micro batches of at most B tokens (utils/seqlen_balancing.py `rearrange_micro_batches`), so the worst case
  verl allows is one filled to B, whatever the data: B, as near as whole sequences at the limits allow, or
  the whole pool when it holds fewer tokens than B.

Both sides of the probe boundary use these functions: the memory model prices the tokens, and a probe rank
fills the first micro batch of each pass to them (`autotune.probe.rank.packing`), so that what is measured is
the worst case that is priced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.config.knobs import ProbeConfig

__all__ = [
    "LENGTH_SOURCES",
    "MICRO_QUANTILE",
    "JobLengths",
    "PassTokens",
    "micro_batch_tokens",
    "pass_tokens",
]

LENGTH_SOURCES = ("data", "verl log", "max")  # where a length comes from; "max": the limit itself
MICRO_QUANTILE = 99.0  # a fixed micro batch's tokens on the data: this percentile of its simulated sums
SAMPLE_LIMIT = (
    4096  # counts kept per kind (a seeded subsample): enough for the percentiles, small in a job file
)
_SIMULATED = 2048  # micro batches simulated per percentile
_SEED = 0


@dataclass(frozen=True)
class JobLengths:
    """Token counts of the job's prompts and responses: the data's, a verl log's, or none (at the limits).

    Counts above a limit are cut to it when used (verl truncates or filters prompts, and stops a response at
    max_response_length); an empty tuple means every sample is at its limit, the worst case."""

    prompts: tuple[int, ...] = ()
    responses: tuple[int, ...] = ()
    prompt_source: str = "max"
    response_source: str = "max"

    def __post_init__(self) -> None:
        for kind, source, counts in (
            ("prompt", self.prompt_source, self.prompts),
            ("response", self.response_source, self.responses),
        ):
            if source not in LENGTH_SOURCES:
                raise ValueError(f"{kind}_source must be one of {LENGTH_SOURCES}, but got {source!r}.")
            if (source == "max") != (not counts):
                raise ValueError(f"{kind} counts go with a source other than 'max', but got {source!r}.")
            if any(not isinstance(c, int) or c < 0 for c in counts):
                raise ValueError(f"{kind} counts must be whole numbers >= 0.")

    @classmethod
    def from_counts(
        cls,
        prompts: Sequence[int] | np.ndarray | None = None,
        responses: Sequence[int] | np.ndarray | None = None,
        response_source: str = "data",
    ) -> JobLengths:
        """From token counts (a dataset's); None or empty keeps that kind at its limit."""
        kept_prompts, kept_responses = _subsample(prompts), _subsample(responses)
        return cls(
            prompts=kept_prompts,
            responses=kept_responses,
            prompt_source="data" if kept_prompts else "max",
            response_source=response_source if kept_responses else "max",
        )

    @property
    def on_data(self) -> bool:
        """Whether any length comes from the data (or a log) rather than the limits."""
        return bool(self.prompts or self.responses)

    @property
    def label(self) -> str:
        """'data' when any length is the data's (or a log's), else 'max': the verdict's `memory.lengths`."""
        return "data" if self.on_data else "max"

    def at_limits(self) -> JobLengths:
        return JobLengths()

    def prompt_lengths(self, limit: int) -> np.ndarray:
        return _clipped(self.prompts, limit)

    def response_lengths(self, limit: int) -> np.ndarray:
        return _clipped(self.responses, limit)

    def describe(self, prompt_limit: int, response_limit: int) -> str:
        """'prompts from the data (median 118, max 301 tokens), responses at the limit 1024'."""
        prompts = _describe("prompts", self.prompt_source, self.prompt_lengths(prompt_limit), prompt_limit)
        responses = self.response_lengths(response_limit)
        return f"{prompts}, {_describe('responses', self.response_source, responses, response_limit)}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> JobLengths:
        if not data:
            return cls()
        return cls(
            prompts=tuple(int(c) for c in data.get("prompts") or ()),
            responses=tuple(int(c) for c in data.get("responses") or ()),
            prompt_source=data.get("prompt_source", "max"),
            response_source=data.get("response_source", "max"),
        )


def _subsample(counts: Sequence[int] | np.ndarray | None) -> tuple[int, ...]:
    if counts is None or len(counts) == 0:
        return ()
    array = np.asarray(counts, dtype=np.int64)
    if array.size > SAMPLE_LIMIT:
        array = np.random.default_rng(_SEED).choice(array, SAMPLE_LIMIT, replace=False)
    return tuple(int(c) for c in array)


def _clipped(counts: tuple[int, ...], limit: int) -> np.ndarray:
    """The counts cut to the limit (at least one token each); none: one sample at the limit."""
    if not counts:
        return np.array([limit], dtype=np.int64)
    return np.clip(np.asarray(counts, dtype=np.int64), 1, limit)


def _describe(kind: str, source: str, counts: np.ndarray, limit: int) -> str:
    if source == "max":
        return f"{kind} at the limit {limit}"
    where = "the data" if source == "data" else "a verl log"
    return f"{kind} from {where} (median {int(np.median(counts))}, max {int(counts.max())} tokens)"


# --- the tokens of a micro batch --------------------------------------------------------------------------


@dataclass(frozen=True)
class PassTokens:
    """Tokens of the largest micro batch per GPU in each training pass (0: the pass does not run)."""

    update: int  # the actor's update
    forward: int  # the old log-prob and reference passes
    critic_update: int = 0
    critic_forward: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PassTokens:
        return cls(**{f.name: int(data.get(f.name, 0)) for f in dataclasses.fields(cls)})

    @classmethod
    def from_packing(cls, packing: dict[str, dict[str, int]] | None) -> PassTokens | None:
        """What a probe packed (its result's `packing`, by pass): each pass's largest micro batch; None
        without it (TRL's padded passes, or a probe of an older version)."""
        if not packing or "update" not in packing:
            return None

        def largest(*names: str) -> int:
            return max((packing[n]["max_tokens"] for n in names if n in packing), default=0)

        return cls(
            update=largest("update"),
            forward=largest("forward", "reference"),
            critic_update=largest("critic update"),
            critic_forward=largest("critic forward"),
        )


def pass_tokens(config: ProbeConfig, lengths: JobLengths, gpus: int) -> PassTokens:
    """The largest micro batch of each pass, per GPU, as verl forms them on these lengths (module docstring).

    Fixed micro batches: m samples (update), the log-prob micro batch (forward passes), the critic the same.
    Dynamic: the actor's budget, the log-prob budget, the critic's (both of its passes, as V1 wires it),
    each over the GPU's mini batch (updates) or its share of the train batch (forward passes)."""
    mini = max(1, config.micro_batch_size * config.gradient_accumulation_steps)  # samples per GPU per step
    share = max(1, config.train_batch_size // gpus)
    critic = config.algorithm == "ppo"
    if config.use_dynamic_bsz:
        update, forward, critic_budget = config.token_budgets
        tokens = PassTokens(
            update=_budget_tokens(config, lengths, update, mini),
            forward=_budget_tokens(config, lengths, forward, share),
            critic_update=_budget_tokens(config, lengths, critic_budget, mini) if critic else 0,
            critic_forward=_budget_tokens(config, lengths, critic_budget, share) if critic else 0,
        )
        return tokens
    update = micro_batch_tokens(config, lengths, config.micro_batch_size)
    forward = micro_batch_tokens(config, lengths, config.forward_micro_batch_size)
    return PassTokens(update, forward, update if critic else 0, forward if critic else 0)


def micro_batch_tokens(config: ProbeConfig, lengths: JobLengths, samples: int) -> int:
    """Tokens of the largest fixed micro batch of `samples` consecutive samples: at the limits every sample
    is Lp + Lr; on the data the MICRO_QUANTILE-th percentile of simulated micro batches."""
    most = samples * config.sequence_length
    if not lengths.on_data:
        return most
    sums = _simulated_sums(config, lengths, samples)
    return min(most, int(np.ceil(np.percentile(sums, MICRO_QUANTILE))))


def _simulated_sums(config: ProbeConfig, lengths: JobLengths, samples: int) -> np.ndarray:
    """Token sums of `_SIMULATED` micro batches of `samples` consecutive samples, prompts drawn per group of
    rollout_n answers (the answers of one prompt are adjacent, as verl repeats them)."""
    rng = np.random.default_rng(_SEED)
    n = config.rollout_n
    prompts = lengths.prompt_lengths(config.max_prompt_length)
    responses = lengths.response_lengths(config.max_response_length)
    # one long stream of whole groups, cut into consecutive micro batches, as a GPU's share is cut
    groups = -(-_SIMULATED * samples // n)
    stream = np.repeat(rng.choice(prompts, groups), n) + rng.choice(responses, groups * n)
    return stream[: _SIMULATED * samples].reshape(_SIMULATED, samples).sum(axis=1)


def _budget_tokens(config: ProbeConfig, lengths: JobLengths, budget: int, pool: int) -> int:
    """The worst case under a token budget: a micro batch filled to it, or the whole pool (a GPU's mini batch
    or share) when that holds fewer tokens. At the limits only whole sequences of Lp + Lr fit."""
    whole_pool = micro_batch_tokens(config, lengths, pool)
    if whole_pool <= budget:
        return whole_pool
    if lengths.on_data:
        return budget
    return max(1, budget // config.sequence_length) * config.sequence_length
