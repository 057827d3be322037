"""The rollout phase of a verl step, beside the training phases in the memory verdict.

While vLLM generates, its pool (`rollout.gpu_memory_utilization` × the card: vLLM claims that share at
start and on every wake) sits beside the training states that stay on the GPU (weights and Adam's states;
verl frees the gradients after the update). The step's peak is the larger of that and the training phases.

    phase = rollout_phase(target, card_bytes=80 * GIB, resident=43 * GIB)  # None: the file sets no share
    phase.peak                                      # 43 + 0.6 × 80 = 91 GiB
    rollout_fix(phase, card, training_peak)         # "... rollout.gpu_memory_utilization 0.6→0.35: ..."
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config.knobs import VERL_DEFAULT_UTILIZATION
from autotune.formats.rollout import largest_share
from autotune.formats.target import Target
from autotune.memory.budget import Budget
from autotune.units import GIB, gib

__all__ = ["RolloutPhase", "rollout_fix", "rollout_phase"]

SHARE_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"  # a verl file's
SMALLEST_SHARE = 0.10  # below this vLLM's pool holds little beside its weights: not offered as a fix


@dataclass(frozen=True)
class RolloutPhase:
    share: float  # rollout.gpu_memory_utilization
    card_bytes: float
    resident: int  # the training states left on the GPU while vLLM generates
    assumed: bool = False  # the file names no share: verl's default

    @property
    def pool(self) -> float:
        return self.share * self.card_bytes

    @property
    def peak(self) -> int:
        return int(self.resident + self.pool)

    def limit(self, headroom: float) -> float:
        """The study's limit for this phase: the card less `headroom` of what the resident states leave free
        (the margin the export's share rule keeps: formats/rollout.py MARGIN), as vLLM preallocates its
        pool and the allocators' fragmentation is the training side's."""
        return self.card_bytes - headroom * (self.card_bytes - self.resident)

    def verdict(self, card: Budget) -> str:
        """fits (at or below its limit), tight (up to the card) or over."""
        if self.peak <= self.limit(card.headroom):
            return "fits"
        return "tight" if self.peak <= card.bytes else "over"

    def describe(self) -> str:
        return (
            f"while vLLM generates, its pool {self.share:g}{' (verl default)' if self.assumed else ''} × "
            f"{self.card_bytes / GIB:.1f} GiB = "
            f"{self.pool / GIB:.1f} GiB sits beside the training states left on the GPU "
            f"({self.resident / GIB:.1f} GiB): {gib(self.peak, None)} GiB"
        )


def rollout_phase(target: Target, card_bytes: float, resident: int) -> RolloutPhase | None:
    """The rollout phase of the file's verl job on a card of `card_bytes`: at the share it names, else at
    verl's default share (`assumed`); None for a file with no rollout engine (TRL's, autotune's own without
    a `rollout_engine` block)."""
    if target.engine is None:
        return None
    share = getattr(target.engine, "gpu_memory_utilization", None)
    if share is None or (target.overrides is not None and SHARE_KEY not in target.overrides):
        return RolloutPhase(VERL_DEFAULT_UTILIZATION, card_bytes, resident, assumed=True)
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share <= 1:
        return None
    return RolloutPhase(float(share), card_bytes, resident)


def rollout_fix(
    phase: RolloutPhase,
    card: Budget,
    training_peak: float,
    offloaded: tuple[float, float] | None = None,
    weights_share: float = 0.0,
) -> str:
    """The rollout's own first aid, every fix offered fitting the study's limit: the largest share
    (`largest_share`, the export's rule) beside the resident states when the training phases fit too; the
    states offloaded (`offloaded`: the training and rollout peaks with param_offload and optimizer_offload)
    when both fit; else, in words, fewer states on the GPU. A share is never below `weights_share`, the part
    of the card vLLM's bf16 weights take on one GPU (it could not start)."""
    offered = []
    share = largest_share(phase.card_bytes, phase.resident, card.headroom)
    if share >= max(SMALLEST_SHARE, weights_share) and training_peak <= card.limit:
        after = phase.resident + share * phase.card_bytes
        offered.append(
            f"rollout.gpu_memory_utilization {phase.share:g}→{share:.2f}: {gib(after, None)} GiB (a smaller "
            f"KV cache: generation may slow)"
        )
    if offloaded is not None and offloaded[0] <= card.limit and offloaded[1] <= phase.limit(card.headroom):
        offered.append(
            f"param_offload: true and optimizer_offload: true (verl moves them to the host for the rollout): "
            f"{gib(max(offloaded), None)} GiB"
        )
    if offered:
        return "fits with any one of: " + "; ".join(f"{i}) {fix}" for i, fix in enumerate(offered, start=1))
    return (
        "nothing the rollout's settings alone can change fits: fewer training states on the GPU while vLLM "
        "generates (param_offload and optimizer_offload, LoRA, sharding over more GPUs), then a smaller share"
    )
