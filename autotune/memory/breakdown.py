"""A probe rank's peak memory from the architecture and the batch knobs, term by term, before any runtime
or calibration (`autotune.memory.calibration` adds both).

The model follows what `autotune.probe.rank.ppo` and `autotune.probe.rank.model_build` actually allocate,
per rank:

- static (alive through the whole iteration): the weights of the actor, the reference (none with LoRA: the
  base model with adapters disabled is the reference; none without KL), the critic (PPO only) and the reward
  model, in the probe's dtypes (GPU: trainable fp32 computing in bf16, frozen bf16; CPU: everything fp32);
  the fp32 gradients and the two fp32 AdamW moments of every trainable parameter; DDP's gradient buckets (one
  more copy of the gradients) when replicated over W > 1; the rollout buffer (ids, masks, per-token floats).
  Sharded (FSDP), actor, critic and reference states are ÷ W — on CUDA the reference's shards live on the
  host — and the reward model stays whole. Offloaded (CUDA), the weights and gradients, or Adam's states,
  leave the static terms and come back in the phases that use them; with offload_policy they never come
  back whole (each unit is copied in for its compute, Adam steps on the host).
- one transient per phase, of which only the largest counts (the phases run one after another):
  rollout (KV cache of R/W samples × (Lp+Lr) tokens, the per-step logits, the prefill; sharded, the actor's
  whole weights gathered at the compute dtype, as the rollout engine holds them), scoring (a forward-only
  pass at the log-prob micro batch, logits of the response positions, the reward model at R/W) and update
  (training activations at the micro batch, the logits chain with its gradients, the optimizer step's
  temporaries). Under full_shard each pass holds the gathered unit (the largest of a block, the embedding, the
  LM head) and its prefetched neighbour, and backward the unit's gradient with its fp32 reduce-scatter input;
  under shard_grad_op what a forward gathered stays gathered until that model's backward (the reference's for
  good), as FSDP2 does without resharding.

Each phase separates exact bytes (states, gathered weights: `phase_states`) from the dynamic ones
(activations, logits, caches: `phases`), because only the dynamic ones are scaled by the calibration's
factor. The terms live in architecture.py, states.py, activations.py and phases.py; this module adds
them up.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from autotune.config.job_lengths import JobLengths, PassTokens, pass_tokens
from autotune.config.knobs import ProbeConfig
from autotune.config.passes import Passes
from autotune.memory.architecture import DEVICES, Architecture, Precision
from autotune.memory.phases import PassBatches, backward_moment, rollout_terms, scoring_terms, update_terms
from autotune.memory.states import Holding, sharded_terms, static_terms

__all__ = ["MemoryBreakdown", "check_passes", "minimum_bytes", "predict_components", "priced_lengths"]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-rank bytes, by term. `total` = static terms + the largest phase (phases do not overlap), each phase
    being its exact bytes (`phase_states`: states brought back by offload, gathered weights) plus its dynamic
    ones (`phases`: activations, logits, caches)."""

    # static
    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    ddp_buckets: int = 0
    rollout_buffer: int = 0
    # rollout
    kv_cache: int = 0
    generation_logits: int = 0
    prefill_activations: int = 0
    generation_autocast_weights: int = 0
    # scoring
    scoring_activations: int = 0  # inside a layer: the final hidden states' size + one layer's transients
    scoring_hidden: int = 0  # the final hidden states, alive while the logits are made
    scoring_logits: int = 0
    scoring_autocast_weights: int = 0
    reward_activations: int = 0
    # update
    activations: int = 0
    logits: int = 0
    backward_workspace: int = 0
    backward_end: int = 0  # backward's last moment: the first layer's backward (`training_activations`)
    update_autocast_weights: int = 0
    released_gradients: int = 0  # zero_grad(set_to_none) frees these before the micro-batch (g == 1)
    optimizer_step: int = 0
    # sharded and offloaded states, per phase (exact)
    gathered_rollout: int = 0  # the actor's whole weights, gathered for generation
    gathered_scoring: int = 0  # full_shard: two units; shard_grad_op: every model a forward gathered
    gathered_update: int = 0
    reduce_scatter: int = 0  # backward: the unit's gradient (compute dtype) and its fp32 reduce-scatter input
    loaded_rollout: int = 0  # offload: states on the device only during the phase
    loaded_scoring: int = 0
    loaded_update: int = 0
    backward_peak: int = 0  # the update's forward and backward before the optimizer steps (over static)
    backward_dynamic: int = 0  # of which activations, logits and workspace, at backward's largest moment
    tokens: dict[str, int] = field(default_factory=dict)  # verl's passes: each pass's largest micro batch
    phases: dict[str, int] = field(default_factory=dict)
    phase_states: dict[str, int] = field(default_factory=dict)

    @property
    def static(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.ddp_buckets + self.rollout_buffer

    def phase_total(self, phase: str, factor: float = 1.0) -> float:
        return self.phase_states.get(phase, 0) + factor * self.phases[phase]

    def peak_phase_at(self, factor: float = 1.0) -> str:
        if not self.phases:
            return "static"
        return max(self.phases, key=lambda phase: self.phase_total(phase, factor))

    @property
    def peak_phase(self) -> str:
        return self.peak_phase_at()

    @property
    def exact(self) -> int:
        """Bytes known exactly at the peak phase: the states, and what the phase gathers or brings back."""
        return self.static + self.phase_states.get(self.peak_phase, 0)

    @property
    def dynamic(self) -> int:
        """The rest of the peak: activations, logits, caches, temporaries."""
        return self.total - self.exact

    @property
    def total(self) -> int:
        peak = max((self.phase_total(phase) for phase in self.phases), default=0)
        return self.static + int(peak)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(static=self.static, total=self.total, peak_phase=self.peak_phase)
        return data


def priced_lengths(lengths: JobLengths | None, passes: Passes) -> JobLengths:
    """The lengths a model of `passes` prices: the job's for verl's packed passes; the limits for TRL's, which
    pad every batch to its longest sequences whatever the data (so a verdict says `max`, as it prices)."""
    return JobLengths() if passes.padded else (lengths or JobLengths())


def check_passes(passes: Passes) -> None:
    """A stored string must be made a `Passes` where it is read: a plain one would be asked what it does."""
    if not isinstance(passes, Passes):
        raise ValueError(f"passes must be a Passes ({', '.join(Passes)}), but got {passes!r}.")


def predict_components(
    arch: Architecture,
    config: ProbeConfig,
    world_size: int = 1,
    device: str = "cuda",
    lengths: JobLengths | None = None,
    passes: Passes = Passes.VERL,
    tokens: PassTokens | None = None,
) -> MemoryBreakdown:
    """Per-rank bytes of one probe configuration, term by term (no constant, no calibration factor).

    verl's passes price each pass's largest micro batch in tokens: `tokens` when given (what a probe
    packed), else `pass_tokens` on the job's `lengths` (None: every sample at the limits). TRL's price padded
    rows, and a rollout by Hugging Face generate."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, but got {device!r}.")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, but got {world_size}.")
    check_passes(passes)
    if passes.padded:
        config = config.with_fixed_micro_batches(world_size)  # TRL has no dynamic batch size
    tokens = tokens or pass_tokens(config, lengths or JobLengths(), world_size)
    return _components(arch, config, world_size, device, passes, tokens)


def _components(
    arch: Architecture, config: ProbeConfig, world_size: int, device: str, passes: Passes, tokens: PassTokens
) -> MemoryBreakdown:
    p = Precision.of(device, config.use_lora, config.sharded)
    held = Holding.of(config, world_size, device)
    runs = PassBatches.of(config, device, passes, tokens)
    rollout = rollout_terms(arch, config, p, world_size)
    scoring = scoring_terms(arch, config, p, world_size, runs)
    update = update_terms(arch, config, p, held, runs)
    sharded = sharded_terms(arch, config, p, held)
    get = sharded.get
    backward_states, backward = backward_moment(update, get)
    # the optimizer step comes after backward: activations, gathered weights and autocast copies are gone
    stepping = backward_states + backward < update["optimizer_step"]
    phase_states = {
        "rollout": rollout["generation_autocast_weights"]
        + get("gathered_rollout", 0)
        + get("loaded_rollout", 0),
        "scoring": scoring["scoring_autocast_weights"]
        + get("gathered_scoring", 0)
        + get("loaded_scoring", 0),
        "update": get("loaded_update", 0) + (0 if stepping else backward_states),
    }
    phases = {
        "rollout": rollout["kv_cache"] + rollout["generation_logits"] + rollout["prefill_activations"],
        "scoring": max(
            # a layer's transients are gone when the logits are made (the trace at 7B: the peak is the logits)
            scoring["scoring_activations"],
            scoring["scoring_hidden"] + scoring["scoring_logits"],
            scoring["reward_activations"],
        ),
        "update": max(update["optimizer_step"] if stepping else backward, 0),
    }
    if passes.packed:  # verl's: the rollout is vLLM's pool (generation_bytes), not a training phase
        rollout = dict.fromkeys(rollout, 0)
        phases.pop("rollout")
        phase_states.pop("rollout")
    return MemoryBreakdown(
        tokens=tokens.to_dict() if passes.packed else {},
        backward_peak=get("loaded_update", 0) + backward_states + backward,
        backward_dynamic=backward,
        phases=phases,
        phase_states=phase_states,
        **static_terms(arch, config, p, held, world_size, passes),
        **rollout,
        **scoring,
        **update,
        **sharded,
    )


def minimum_bytes(
    arch: Architecture, config: ProbeConfig | None = None, world_size: int = 1, device: str = "cuda"
) -> int:
    """Weights + gradients + optimizer state (+ DDP buckets), as `config` holds them: below this no batch
    setting fits at all."""
    b = predict_components(arch, config or ProbeConfig(), world_size, device)
    return b.weights + b.gradients + b.optimizer + b.ddp_buckets
