"""Peak bytes per GPU of a config held as a job holds it: replicated, or sharded by FSDP, with offload.

    estimate = estimate_with(MemoryModel(arch, 4, "cuda"), config)   # CUDA priors, uncalibrated; or the
                                                                     # study's model, calibrated
    estimate.peak, estimate.states, estimate.phases, estimate.peak_phase

The probe's memory model covers every holding the probe can run (autotune.memory.calibration): the config
carries its holding (sharding, offload, checkpointing, LoRA), and the peak is `MemoryModel.predict`, the
number the study's sampler compares with its limit; here the model's terms are gathered for `check`'s report.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autotune.config.knobs import ProbeConfig
from autotune.config.passes import Passes
from autotune.memory.calibration import MemoryModel
from autotune.units import GIB, gib

__all__ = ["MemoryEstimate", "describe", "estimate_with", "model_label"]


@dataclass(frozen=True)
class MemoryEstimate:
    peak: int  # predicted bytes per GPU: constant + exact + factor × dynamic
    raw: int  # the terms' sum
    states: dict[str, int]  # weights, gradients, optimizer, ... (alive all the time)
    phases: dict[str, int]  # rollout, scoring, update (what each gathers or brings back, and its transients)
    constant: float
    factor: float
    gathered: int = 0  # the largest weights FSDP gathers at once in a training pass (full_shard: two units)
    tokens: dict[str, int] = dataclasses.field(default_factory=dict)  # verl's passes: each micro batch's

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.__getitem__)


def model_label(model: MemoryModel) -> str:
    """Which memory model made a prediction: the device's priors, or calibrated on measurements."""
    device = "CUDA" if model.device == "cuda" else "CPU"
    if model.passes is Passes.TRL_FUSED:  # a label names whose passes they are
        from autotune.formats.trl import TRL_VERSION

        device = f"TRL {TRL_VERSION}'s passes, {device}"
    if model.points:
        return f"{device}, calibrated on {model.points} measurement{'s' if model.points > 1 else ''}"
    return f"{device} priors, uncalibrated"


def estimate_with(model: MemoryModel, config: ProbeConfig) -> MemoryEstimate:
    """Peak bytes per rank of `config`, held as it says, under `model` (`model.predict`: the study's
    number)."""
    held = config
    b = model.breakdown(held)
    states = {
        "weights": b.weights,
        "gradients": b.gradients,
        "optimizer": b.optimizer,
        "ddp_buckets": b.ddp_buckets,
        "rollout_buffer": b.rollout_buffer,
    }
    phases = {phase: int(b.phase_total(phase)) for phase in b.phases}
    exact = (b.total, states, phases, model.constant, model.factor, b.gathered_update, b.tokens)
    return MemoryEstimate(model.predict(held), *exact)


def _micro_batch_detail(estimate: MemoryEstimate, config: ProbeConfig, phase: str) -> str:
    """' (micro batch of 5,120 tokens packed)' for the phase that peaks: verl's passes count the tokens of the
    largest micro batch; padded rows count samples × their length."""
    if phase not in ("update", "scoring"):
        return ""
    if not estimate.tokens:
        rows = config.micro_batch_size if phase == "update" else config.forward_micro_batch_size
        return f" (micro batch {rows} × {config.sequence_length} tokens)"
    if phase == "update":
        tokens = max(estimate.tokens["update"], estimate.tokens["critic_update"])
        return f" (micro batch of {tokens:,} tokens packed)"
    tokens = max(estimate.tokens["forward"], estimate.tokens["critic_forward"])
    return f" (log-prob micro batch of {tokens:,} tokens packed, with the entropy)"


def describe(
    estimate: MemoryEstimate,
    sharding: str,
    label: str,
    offload: bool,
    config: ProbeConfig,
    gpus: int,
    reward: bool,
    label_of_model: str = "CUDA priors, uncalibrated",
) -> str:
    """How the peak is made up and how it was computed: one sentence."""
    s = estimate.states
    models = "actor + critic" if config.algorithm == "ppo" else "actor"
    models += " + reference" if config.use_kl and not config.use_lora else ""
    models += " + reward model" if reward else ""
    if config.offload_policy:
        how = f"{label} over {gpus} GPUs, states on the CPU (Adam steps there), units copied in to compute"
    elif offload:
        how = f"{label} over {gpus} GPUs, parameter and optimizer states offloaded to CPU between phases"
    elif sharding != "none" and gpus == 1:
        gathered = gib(estimate.gathered, None)
        how = f"{label} on 1 GPU: nothing to divide, weights gathered {gathered} GiB at a time"
    elif sharding == "full_shard":
        how = (
            f"{label} over {gpus} GPUs: parameter, gradient and optimizer states ÷ {gpus}, "
            f"weights gathered {gib(estimate.gathered, None)} GiB at a time in training"
        )
    elif sharding == "shard_grad_op":
        how = f"{label}: states ÷ {gpus}, weights gathered whole from forward to backward"
    else:
        how = "states replicated on every GPU"
    phase = estimate.peak_phase
    detail = _micro_batch_detail(estimate, config, phase)
    return (
        f"{models}: weights {gib(s['weights'], None)} + gradients {gib(s['gradients'], None)} + Adam states "
        f"{gib(s['optimizer'], None)} GiB ({how}), then the {phase} phase "
        f"{gib(estimate.phases[phase], None)} GiB"
        f"{detail}; peak = {estimate.constant / GIB:.2f} GiB + states + {estimate.factor:g} × the "
        f"transients (the memory model of autotune's probe, {label_of_model})"
    )
