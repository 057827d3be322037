"""verl's rollout engine settings for a measured configuration: what the probe cannot measure, by rules.

The probe generates with Hugging Face `generate` on the training weights; verl generates with a rollout engine
(vLLM by default) that claims its own share of every GPU for its copy of the weights and its KV cache. In
verl 0.9.1's colocated V1 trainer (sync mode) only the training states stay on the GPU while vLLM generates:
vLLM sleeps during training (`rollout.free_cache_engine`: weights and KV cache released,
`trainer/ppo/v1/trainer_sync.py` `on_sample_end`) and wakes after the weights are synced
(`workers/engine_workers.py` `update_weights`), the training engine frees its gradients when a train step
ends (`workers/engine/fsdp/transformer_impl.py` `EngineTrainModeCtx.__exit__`: `optimizer_zero_grad`), moves
its weights (`param_offload`) and Adam's states (`optimizer_offload`) to the host where offloaded, and the
reference is always held on the host (`CPUOffload` / `CPUOffloadPolicy` for a forward-only engine). So the
resident states are the weights and the optimizer's states each rank keeps on the device. The rules:

    gpu_memory_utilization   (card - resident states - runtime) x (1 - MARGIN) / card, rounded down to 0.05
                             and kept in [0.05, 0.9]: the share vLLM may claim when it starts or wakes
                             beside the states (it refuses more, or fails to map its pool back). Below verl's
                             default 0.5 only when the states leave less, and a note says so.
    tensor_model_parallel    1 (one vLLM replica per GPU) unless the bf16 weights do not fit that share on
                             one GPU: then the smallest divisor d of the GPUs (and of the attention heads)
                             whose shard (2 B/param / d) fits
    max_model_len            max_prompt_length + max_response_length (verl's default, null, would take the
                             model's maximum positions and size the KV cache for them)

A configuration that sets verl's own knobs (`gpu_memory_utilization`, `tensor_model_parallel_size`,
`max_num_seqs`: searched and measured with `--engine verl`) keeps its values instead of the rules'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.config.knobs import VERL_DEFAULT_UTILIZATION, ProbeConfig
from autotune.units import GIB, divisors

__all__ = [
    "MARGIN",
    "ROLLOUT_ENGINES",
    "RULES",
    "VERL_DEFAULT_TENSOR_PARALLEL",
    "VERL_DEFAULT_WORKERS",
    "RolloutEngine",
    "pool_findings",
    "recorded_resident_bytes",
    "rollout_engine",
]

ROLLOUT_ENGINES = ("vllm", "sglang", "trtllm")  # verl 0.9.1's registered names (workers/rollout/base.py)
MARGIN = 0.10  # of the free memory, left for the allocators' fragmentation and the CUDA graphs
STEP = 0.05
UTILIZATION_RANGE = (0.05, 0.9)
VERL_DEFAULT_TENSOR_PARALLEL = 2  # rollout.tensor_model_parallel_size in verl 0.9.1's rollout.yaml
VERL_DEFAULT_WORKERS = 8  # data.dataloader_num_workers and rollout.agent.num_workers in verl 0.9.1's YAML
RULES = (
    "gpu_memory_utilization = (card - the training states resident while vLLM generates) × 0.9 / card, "
    "rounded down to 0.05, never below verl's default 0.5 unless the states leave less; "
    "tensor_model_parallel_size = 1 unless the bf16 weights do not fit that share on one GPU (then the "
    "smallest divisor of the GPUs and of the model's attention heads whose share fits); "
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
    # why each of the first two has its value: "measured" (the configuration's own, --engine verl), "memory"
    # (the share from the resident states), "rule", or "verl's default"; not written to best_config.yaml
    basis: tuple[tuple[str, str], ...] = ()

    def why(self, field: str) -> str | None:
        return dict(self.basis).get(field)


def recorded_resident_bytes(result: Mapping[str, Any] | None) -> int | None:
    """The training states the most loaded rank held on its device, as the built-in probe recorded them at the
    end of an iteration (`rank_peaks[i].state_bytes`): weights and optimizer states, the gradients left out
    (verl frees them when a train step ends). None where no rank recorded them (--engine verl and trl, older
    studies)."""
    peaks = (result or {}).get("rank_peaks") or []
    recorded = [p.get("state_bytes") for p in peaks if isinstance(p, dict)]
    states = [s for s in recorded if isinstance(s, dict)]
    if not states:
        return None
    return max(int(s.get("weights", 0)) + int(s.get("optimizer", 0)) for s in states)


def rollout_engine(
    config: ProbeConfig,
    gpus: int,
    name: str = "vllm",
    card_bytes: float | None = None,
    resident_bytes: float | None = None,
    model_parameters: int | None = None,
    attention_heads: int | None = None,
) -> RolloutEngine:
    """The rollout settings of the module docstring beside `resident_bytes` of training states (and runtime)
    per GPU; without a card or the states, verl's default share. The configuration's own values of verl's
    knobs win over the rules."""
    utilization = config.gpu_memory_utilization
    notes: list[str] = []
    basis = {"gpu_memory_utilization": "measured", "tensor_model_parallel_size": "measured"}
    if utilization is None:
        utilization, notes, basis["gpu_memory_utilization"] = _utilization_rule(card_bytes, resident_bytes)
    tp = config.tensor_model_parallel_size
    if tp is None:
        tp, tp_notes = _tensor_parallel_rule(gpus, utilization, card_bytes, model_parameters, attention_heads)
        notes += tp_notes
        basis["tensor_model_parallel_size"] = "rule" if tp == 1 else "memory"
    chosen = [
        f"{key}={value:g}"
        for key in ("gpu_memory_utilization", "tensor_model_parallel_size", "max_num_seqs")
        if (value := getattr(config, key)) is not None
    ]
    if chosen:
        notes.append(
            f"{', '.join(chosen)}: the configuration's own (measured with --engine verl), not a rule"
        )
    return RolloutEngine(
        name,
        tp,
        utilization,
        config.sequence_length,
        tuple(notes),
        config.max_num_seqs,
        tuple(basis.items()),
    )


def largest_share(card_bytes: float, resident_bytes: float, margin: float = MARGIN) -> float:
    """The largest gpu_memory_utilization (a multiple of STEP, unclamped) whose pool fits beside
    `resident_bytes` of training states, keeping `margin` of what they leave free: the export's rule and the
    memory verdict's rollout fix (memory/rollout_phase.py), one arithmetic."""
    free = max(0.0, card_bytes - resident_bytes)
    return math.floor(free * (1 - margin) / card_bytes / STEP + 1e-9) * STEP


def _utilization_rule(card_bytes: float | None, resident_bytes: float | None) -> tuple[float, list[str], str]:
    """What the resident training states leave of the card, less the margin; verl's default without a card.
    Returns the share, its notes and its basis."""
    if not card_bytes or resident_bytes is None:
        return (
            VERL_DEFAULT_UTILIZATION,
            [f"gpu_memory_utilization is verl's default {VERL_DEFAULT_UTILIZATION}: no card was known"],
            "verl's default",
        )
    free = max(0.0, card_bytes - resident_bytes)
    share = largest_share(card_bytes, resident_bytes)
    utilization = round(min(max(share, UTILIZATION_RANGE[0]), UTILIZATION_RANGE[1]), 2)
    states = f"the training states resident while vLLM generates ({resident_bytes / GIB:.2f} GiB)"
    card = f"the {card_bytes / GIB:.2f} GiB card"
    if share < UTILIZATION_RANGE[0]:
        return (
            utilization,
            [
                f"{states} leave the rollout engine less than {UTILIZATION_RANGE[0]:.0%} of {card}: it may "
                f"not start; offload or shard the training states"
            ],
            "memory",
        )
    if utilization < VERL_DEFAULT_UTILIZATION:
        return (
            utilization,
            [
                f"gpu_memory_utilization={utilization:g}, below verl's default {VERL_DEFAULT_UTILIZATION}: "
                f"{states} leave {free / card_bytes:.0%} of {card}, less the {MARGIN:.0%} margin; vLLM would "
                f"not start or wake beside them at the default"
            ],
            "memory",
        )
    return utilization, [], "memory"


def _tensor_parallel_rule(
    gpus: int,
    utilization: float,
    card_bytes: float | None,
    model_parameters: int | None,
    attention_heads: int | None = None,
) -> tuple[int, list[str]]:
    """1 (a vLLM replica per GPU: verl starts W // TP of them) unless the bf16 weights do not fit the pool;
    then the smallest divisor of the GPUs whose share of them fits, among those that split the attention heads
    evenly (vLLM refuses any other; see config.rules.head_findings). Which size generates faster is not
    measured here: --engine verl searches it."""
    if not model_parameters or not card_bytes:
        return 1, []
    pool = utilization * card_bytes
    weights = 2 * model_parameters
    sizes = [d for d in divisors(gpus) if not attention_heads or attention_heads % d == 0]
    fitting = [d for d in sizes if weights / d < pool]
    if fitting:
        tp = fitting[0]
        if weights / tp <= pool / 2:
            return tp, []
        return tp, [
            f"the bf16 weights ({weights / tp / GIB:.1f} GiB per GPU at tensor_model_parallel_size={tp}) "
            f"take more than half the {pool / GIB:.1f} GiB rollout pool: the KV cache will be small "
            f"(--engine verl can measure a larger tensor parallel size)"
        ]
    largest = sizes[-1]  # 1 divides everything: never empty
    heads = f" (the largest that divides the {attention_heads} attention heads)" if largest < gpus else ""
    return largest, [
        f"the bf16 weights ({weights / GIB:.1f} GiB) do not fit the rollout pool "
        f"even split over {largest} GPUs{heads}: tensor_model_parallel_size={largest}, and vLLM may not start"
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
