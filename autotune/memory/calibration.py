"""The memory model the tuner asks: the analytic terms (`autotune.memory.breakdown`) plus what they cannot
know, fitted to the probes' measured peaks and saved with the study.

What the formula cannot know is the runtime (CUDA context or the Python+torch process), as `constant`, and
the allocator's fragmentation and caching, as `factor` on the dynamic bytes only:

    model = MemoryModel(Architecture.from_specs(resolve_model("tiny-llama"), None), device="cpu")
    model.calibrate([(config_a, 580_000_000), (config_b, 1_000_000_000)])   # only `ok` probes' peaks
    model.predict(config_c)          # bytes = constant + exact + factor × dynamic
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from autotune.config.job_lengths import JobLengths, PassTokens
from autotune.config.knobs import VERL_DEFAULT_UTILIZATION, ProbeConfig
from autotune.config.passes import Passes
from autotune.memory.architecture import DEVICES, Architecture
from autotune.memory.breakdown import (
    MemoryBreakdown,
    check_passes,
    minimum_bytes,
    predict_components,
    priced_lengths,
)
from autotune.units import GIB

__all__ = ["PRIORS", "MemoryModel", "fit_constant_and_factor", "priors"]

# Priors, before any measurement. CPU: the peak RSS of the smallest tiny-llama probe is 0.51 GiB, of which
# the models and tensors are ~0.12 GiB; the rest (0.38 GiB fitted over 19 probes, bench/memory_points) is
# Python + torch + transformers + peft.
# CUDA: the CUDA context and cuBLAS/NCCL workspaces (0.5–1 GiB), and the caching allocator's rounding and
# fragmentation (a factor).
PRIORS: dict[str, tuple[float, float]] = {"cpu": (0.39 * GIB, 1.0), "cuda": (0.75 * GIB, 1.1)}
# A TRL 1.16 process on CPU (--engine trl, `trl grpo`) also imports TRL, datasets and accelerate: 0.52-0.56
# GiB beyond the priced terms over 9 TRL probes of tiny-llama (48-144 tokens, micro batch 2-8).
TRL_PRIORS: dict[str, tuple[float, float]] = {"cpu": (0.53 * GIB, 1.0), "cuda": PRIORS["cuda"]}


def priors(device: str, passes: Passes = Passes.VERL) -> tuple[float, float]:
    """(constant, factor) before any measurement, for the process that runs the passes on `device` (a fused
    LM head is TRL 1.16's own process, which imports more)."""
    return (TRL_PRIORS if passes.fused_head else PRIORS)[device]


PRIOR_STRENGTH = 0.3  # how firmly a calibration keeps the prior factor (see fit_constant_and_factor)
FACTOR_RANGE = (0.5, 3.0)


class MemoryModel:
    """bytes = constant + exact + factor × dynamic (`predict_components`); constant and factor are fitted."""

    def __init__(
        self,
        arch: Architecture,
        world_size: int = 1,
        device: str = "cuda",
        constant: float | None = None,
        factor: float | None = None,
        rollout_card_bytes: float | None = None,
        vllm_rollout: bool = False,
        lengths: JobLengths | None = None,
        passes: Passes = Passes.VERL,
    ) -> None:
        if device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, but got {device!r}.")
        check_passes(passes)
        prior_constant, prior_factor = priors(device, passes)
        self.arch = arch
        self.world_size = world_size
        self.device = device
        self.constant = float(prior_constant if constant is None else constant)
        self.factor = float(prior_factor if factor is None else factor)
        self.points = 0  # measurements the calibration used
        # --engine verl: the card whose share vLLM claims (None: the built-in probe, no pool to model)
        self.rollout_card_bytes = rollout_card_bytes
        # a job whose rollout runs in vLLM's own pool (judged by the share, `generation_bytes` and check's
        # pool findings): a Hugging Face generate phase is then no peak of the job (verl's passes have none)
        self.vllm_rollout = vllm_rollout
        self.passes = passes  # whose training passes: verl's packed ones, or TRL's padded ones
        self.lengths = priced_lengths(lengths, passes)  # the job's token lengths: what a micro batch holds

    def breakdown(self, config: ProbeConfig, tokens: PassTokens | None = None) -> MemoryBreakdown:
        """The terms of `config` on the model's lengths, or with the `tokens` a probe packed."""
        found = predict_components(
            self.arch, config, self.world_size, self.device, self.lengths, self.passes, tokens
        )
        if not self.vllm_rollout and self.colocated_pool(config) is None:
            return found
        return dataclasses.replace(
            found,
            phases={k: v for k, v in found.phases.items() if k != "rollout"},
            phase_states={k: v for k, v in found.phase_states.items() if k != "rollout"},
        )

    def raw_bytes(self, config: ProbeConfig) -> int:
        return self.breakdown(config).total

    def split(self, config: ProbeConfig, tokens: PassTokens | None = None) -> tuple[int, int]:
        """(exact, dynamic) bytes at the phase that peaks under this model's factor."""
        b = self.breakdown(config, tokens)
        phase = b.peak_phase_at(self.factor)
        exact = b.static + b.phase_states.get(phase, 0) + (self.colocated_pool(config) or 0)
        return exact, b.phases.get(phase, 0)

    def colocated_pool(self, config: ProbeConfig) -> int | None:
        """TRL with vLLM colocated (use_vllm, vllm_mode colocate: a set share): vLLM's pool lives in the
        training process, and without TRL's vllm_enable_sleep_mode (off by default) it stays there through
        the training passes, so it adds to their peak; None when TRL generates with transformers. An unknown
        card (None) prices no pool (0)."""
        if self.passes.packed or config.gpu_memory_utilization is None:
            return None
        if self.rollout_card_bytes is None:
            return 0
        return int(config.gpu_memory_utilization * self.rollout_card_bytes)

    def predict(self, config: ProbeConfig) -> int:
        """constant + exact + factor × dynamic: state sizes are exact, the factor covers what the allocator
        makes of activations, logits and caches."""
        exact, dynamic = self.split(config)
        training = int(self.constant + exact + self.factor * dynamic)
        return max(training, self.generation_bytes(config))

    def generation_bytes(self, config: ProbeConfig) -> int:
        """--engine verl: vLLM's pool beside the training states that stay resident while it generates.
        verl puts vLLM to sleep for the training phases (free_cache_engine, on by default:
        vllm_async_server.py:853-862), so the pool and the training peak never meet. Without a set share the
        verl probe runs with verl's default share, and so does the export of its study."""
        if self.rollout_card_bytes is None or self.passes.padded:  # TRL's colocated pool: `split`
            return 0
        share = (
            VERL_DEFAULT_UTILIZATION
            if config.gpu_memory_utilization is None
            else config.gpu_memory_utilization
        )
        return int(self.minimum_bytes(config) + share * self.rollout_card_bytes)

    def relative_error(self, config: ProbeConfig, measured: int) -> float:
        """(predicted − measured) / measured: positive when the model over-predicts."""
        if measured <= 0:
            raise ValueError(f"measured bytes must be > 0, but got {measured}.")
        return (self.predict(config) - measured) / measured

    def minimum_bytes(self, config: ProbeConfig | None = None) -> int:
        return int(self.constant + minimum_bytes(self.arch, config, self.world_size, self.device))

    def calibrate(self, points: Iterable[tuple[Any, ...]]) -> MemoryModel:
        """Least-squares fit of measured − exact ≈ constant + factor × dynamic over `ok` probes' peaks:
        points (config, peak), or (config, peak, tokens) with the tokens the probe packed (verl's passes), so
        that a probe is priced on what it held.

        One point (or points whose raw totals coincide) keeps the prior factor and fits the constant; two or
        more fit both, the factor clamped to [0.5, 3] and the constant to >= 0 (the other refitted after a
        clamp). With no points the priors stay.
        """
        splits = [(self.split(c, *rest[1:]), rest[0]) for c, *rest in points]
        pairs = [(float(dynamic), float(m - exact)) for (exact, dynamic), m in splits]
        if not pairs:
            return self
        self.constant, self.factor = fit_constant_and_factor(pairs, self.factor)
        self.points = len(pairs)
        return self

    def with_calibration(self, constant: float, factor: float) -> MemoryModel:
        """A copy of this model with another calibration (e.g. one fitted on another model's probes)."""
        copy = MemoryModel(
            self.arch,
            self.world_size,
            self.device,
            constant,
            factor,
            self.rollout_card_bytes,
            self.vllm_rollout,
            self.lengths,
            self.passes,
        )
        return copy

    def with_lengths(self, lengths: JobLengths) -> MemoryModel:
        """A copy of this model (its calibration kept) that prices micro batches on other lengths."""
        copy = self.with_calibration(self.constant, self.factor)
        copy.lengths, copy.points = priced_lengths(lengths, self.passes), self.points
        return copy

    def to_dict(self) -> dict[str, Any]:
        return {
            "architecture": dataclasses.asdict(self.arch),
            "world_size": self.world_size,
            "device": self.device,
            "constant": self.constant,
            "factor": self.factor,
            "points": self.points,
            "rollout_card_bytes": self.rollout_card_bytes,
            "vllm_rollout": self.vllm_rollout,
            "lengths": self.lengths.to_dict(),
            "passes": self.passes.value,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryModel:
        model = cls(
            Architecture(**data["architecture"]),
            world_size=int(data["world_size"]),
            device=data["device"],
            constant=float(data["constant"]),
            factor=float(data["factor"]),
            rollout_card_bytes=data.get("rollout_card_bytes"),
            vllm_rollout=bool(data.get("vllm_rollout", False)),
            lengths=JobLengths.from_dict(data.get("lengths")),
            passes=Passes(data.get("passes", Passes.VERL)),  # stored as the plain string
        )
        model.points = int(data.get("points", 0))
        return model


def fit_constant_and_factor(pairs: list[tuple[float, float]], prior_factor: float) -> tuple[float, float]:
    """(constant, factor) minimising Σ (measured − constant − factor·raw)² under the clamps.

    The prior factor counts as one more observation of the slope, as strong as a point PRIOR_STRENGTH × the
    mean raw away from the mean: points that span a narrow range of sizes (where the slope is mostly
    allocator noise) stay near the prior, a wide range follows the data. Over the 455 triples of 15 measured
    tiny-llama probes this cut the 90th-percentile held-out median error from 12.5% to 9.3%.
    """
    low, high = FACTOR_RANGE
    n = len(pairs)
    mean_raw = sum(r for r, _ in pairs) / n
    mean_measured = sum(m for _, m in pairs) / n
    spread = sum((r - mean_raw) ** 2 for r, _ in pairs)
    covariance = sum((r - mean_raw) * (m - mean_measured) for r, m in pairs)
    weight = (PRIOR_STRENGTH * mean_raw) ** 2 if n > 1 else 0.0
    if spread + weight <= 1e-12 * max(mean_raw, 1.0) ** 2:  # one point, or all at the same raw total
        factor = min(max(prior_factor, low), high)
    else:
        factor = min(max((covariance + weight * prior_factor) / (spread + weight), low), high)
    constant = mean_measured - factor * mean_raw
    if constant < 0:  # the runtime costs something: refit the factor through the origin instead
        constant = 0.0
        squares = sum(r * r for r, _ in pairs)
        if squares > 0:
            factor = min(max(sum(r * m for r, m in pairs) / squares, low), high)
    if not math.isfinite(constant) or not math.isfinite(factor):
        raise ValueError(f"calibration points must be finite, but got {pairs}.")
    return constant, factor
