"""verl's rollout engine settings for a measured configuration: what the probe cannot measure, by rules.

The probe generates with Hugging Face `generate` on the training weights; verl generates with a rollout engine
(vLLM by default) that claims its own share of every GPU for its copy of the weights and its KV cache while
the training states stay resident. The probe measures the training side; these rules size the rest:

    gpu_memory_utilization   (card - the training side's measured peak) x (1 - MARGIN) / card, rounded
                             down to 0.05 and kept in [0.05, 0.9]: the share vLLM may claim at start-up
                             without exceeding what the training states leave free (it refuses more)
    tensor_model_parallel    the smallest divisor d of the GPUs whose shard of the bf16 weights
                             (2 B/param / d) takes at most half of that share (the rest is KV cache): 1 when
                             the model fits one GPU's share
    max_model_len            max_prompt_length + max_response_length (verl's default, null, would take the
                             model's maximum positions and size the KV cache for them)

A configuration that sets verl's own knobs (`gpu_memory_utilization`, `tensor_model_parallel_size`,
`max_num_seqs`: searched and measured with `--engine verl`) keeps its values instead of the rules'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.config.knobs import VERL_DEFAULT_UTILIZATION, ProbeConfig
from autotune.units import GIB, divisors

__all__ = [
    "MARGIN",
    "ROLLOUT_ENGINES",
    "RULES",
    "RolloutEngine",
    "pool_findings",
    "rollout_engine",
]

ROLLOUT_ENGINES = ("vllm", "sglang", "trtllm")  # verl 0.9.1's registered names (workers/rollout/base.py)
MARGIN = 0.10  # of the free memory, left for the allocators' fragmentation and the CUDA graphs
STEP = 0.05
UTILIZATION_RANGE = (0.05, 0.9)
RULES = (
    "gpu_memory_utilization = (card - the training side's measured peak) × 0.9 / card, rounded down to 0.05; "
    "tensor_model_parallel_size = the smallest divisor of the GPUs (and of the model's attention heads, "
    "which vLLM splits over it) whose share of the bf16 weights fits half of that pool; "
    "max_model_len = max_prompt_length + max_response_length"
)


@dataclass(frozen=True)
class RolloutEngine:
    name: str = "vllm"
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = VERL_DEFAULT_UTILIZATION
    max_model_len: int | None = None
    notes: tuple[str, ...] = ()  # where a rule could not be applied, or gives a warning
    max_num_seqs: int | None = None  # None: verl's default (rollout.yaml: 256), not written


def rollout_engine(
    config: ProbeConfig,
    gpus: int,
    name: str = "vllm",
    card_bytes: float | None = None,
    resident_bytes: float | None = None,
    model_parameters: int | None = None,
    attention_heads: int | None = None,
) -> RolloutEngine:
    """The rollout settings of the module docstring; without a card or a measurement, verl's default share.
    The configuration's own values of verl's knobs win over the rules."""
    utilization = config.gpu_memory_utilization
    notes: list[str] = []
    if utilization is None:
        utilization, notes = _utilization_rule(card_bytes, resident_bytes)
    tp = config.tensor_model_parallel_size
    if tp is None:
        tp, tp_notes = _tensor_parallel_rule(gpus, utilization, card_bytes, model_parameters, attention_heads)
        notes += tp_notes
    chosen = [
        f"{key}={value:g}"
        for key in ("gpu_memory_utilization", "tensor_model_parallel_size", "max_num_seqs")
        if (value := getattr(config, key)) is not None
    ]
    if chosen:
        notes.append(
            f"{', '.join(chosen)}: the configuration's own (measured with --engine verl), not a rule"
        )
    return RolloutEngine(name, tp, utilization, config.sequence_length, tuple(notes), config.max_num_seqs)


def _utilization_rule(card_bytes: float | None, resident_bytes: float | None) -> tuple[float, list[str]]:
    """What the training side's peak leaves of the card, less the margin; verl's default without a card."""
    if not card_bytes or resident_bytes is None:
        return VERL_DEFAULT_UTILIZATION, [
            f"gpu_memory_utilization is verl's default {VERL_DEFAULT_UTILIZATION}: no card was known"
        ]
    free = max(0.0, card_bytes - resident_bytes)
    share = math.floor(free * (1 - MARGIN) / card_bytes / STEP + 1e-9) * STEP
    utilization = round(min(max(share, UTILIZATION_RANGE[0]), UTILIZATION_RANGE[1]), 2)
    if share >= UTILIZATION_RANGE[0]:
        return utilization, []
    return utilization, [
        f"the training side's peak ({resident_bytes / GIB:.2f} GiB) leaves the rollout engine less "
        f"than {UTILIZATION_RANGE[0]:.0%} of the {card_bytes / GIB:.2f} GiB card: it may not start; "
        f"offload or shard the training states"
    ]


def _tensor_parallel_rule(
    gpus: int,
    utilization: float,
    card_bytes: float | None,
    model_parameters: int | None,
    attention_heads: int | None = None,
) -> tuple[int, list[str]]:
    """The smallest divisor of the GPUs whose share of the bf16 weights fits half the pool, among those that
    split the attention heads evenly (vLLM refuses any other; see config.rules.head_findings)."""
    if not model_parameters or not card_bytes:
        return 1, []
    pool = utilization * card_bytes
    sizes = [d for d in divisors(gpus) if not attention_heads or attention_heads % d == 0]
    fitting = [d for d in sizes if 2 * model_parameters / d <= pool / 2]
    if fitting:
        return fitting[0], []
    largest = sizes[-1]  # 1 divides everything: never empty
    heads = f" (the largest that divides the {attention_heads} attention heads)" if largest < gpus else ""
    return largest, [
        f"the bf16 weights ({2 * model_parameters / GIB:.1f} GiB) do not fit half the rollout pool "
        f"even split over {largest} GPUs{heads}: tensor_model_parallel_size={largest}, and the KV cache "
        f"will be small"
    ]


def pool_findings(
    utilization: float,
    card_bytes: float,
    resident_bytes: float,
    where: str = "rollout.gpu_memory_utilization",
) -> list[str]:
    """What is wrong with a rollout share beside training states of `resident_bytes` (`autotune check`)."""
    free = card_bytes - resident_bytes
    if utilization * card_bytes <= free:
        return []
    claimed, card, resident, left = (
        x / GIB for x in (utilization * card_bytes, card_bytes, resident_bytes, free)
    )
    return [
        f"{where}={utilization:g} claims {claimed:.1f} GiB of the {card:.1f} GiB card, but the training "
        f"states (about {resident:.1f} GiB) leave {max(left, 0):.1f} GiB free: the engine will not start"
    ]
