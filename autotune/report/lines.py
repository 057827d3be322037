"""How a configuration and a trial read in one line: the run's trial lines (autotune.run.live), the report's
tables and the gain's probes, with the legend of the short names.

    short_config(config)   # "R32 m4 g2 lm8 w1 ckpt"
    trial_line(trial)      # "#7   ok   R32 m4 ...  4.520 samples/s  0.622 GiB  (predicted 0.600)  41 s"
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial

from autotune.config.knobs import ProbeConfig
from autotune.probe.conditions import disturbance, timeout_under_load
from autotune.probe.contract import ProbeResult
from autotune.status import Attr, Status
from autotune.study.trials import trial_config, trial_environment, trial_status
from autotune.units import GIB

__all__ = [
    "LEGEND",
    "RECIPE_SHORT",
    "SHORT_NAMES",
    "VERL_LEGEND",
    "VERL_SHORT",
    "VERL_WORDS",
    "short_config",
    "side_line",
    "trial_line",
    "verl_short",
]

SHORT_NAMES = (
    ("T", "train_batch_size", "train batch"),
    ("M", "mini_batch_size", "mini batch"),
    ("R", "rollout_batch_size", "rollout batch"),
    ("m", "micro_batch_size", "micro batch per GPU"),
    ("g", "gradient_accumulation_steps", "gradient accumulation"),
    ("lm", "forward_micro_batch_size", "log-prob micro batch"),
    ("w", "num_rollout_workers", "rollout workers"),
    ("Lp", "max_prompt_length", "prompt length"),
    ("Lr", "max_response_length", "response length"),
)
RECIPE_SHORT = ("T", "M", "Lp", "Lr")  # shown in a trial line only when the study searches them
VERL_SHORT = (  # verl's own knobs (--engine verl), shown when a configuration sets them
    ("gmu", "gpu_memory_utilization", "the rollout engine's share of each GPU"),
    ("tp", "tensor_model_parallel_size", "the rollout's tensor parallel size"),
    ("seqs", "max_num_seqs", "vLLM's max_num_seqs"),
)
LEGEND = (
    "trial lines: "
    + ", ".join(f"{short} {words}" for short, _, words in SHORT_NAMES)
    + "; ckpt gradient checkpointing; shard: how the training states are split over the GPUs"
)
VERL_WORDS = (  # verl's short names explained: in the run's legend and under the report's tables
    ", ".join(f"{short} {words}" for short, _, words in VERL_SHORT)
    + ", dyn dynamic batch size with the update's tokens per GPU (m, g and lm then unread), lp and cr the "
    + "forward passes' and the critic's (the update's when not shown)"
)
VERL_LEGEND = f"; verl's own knobs, when set: {VERL_WORDS}"  # added to LEGEND for an --engine verl study


def short_config(config: ProbeConfig, searched_recipe: Sequence[str] = ()) -> str:
    """`R32 m4 g2 lm8 w2 ckpt full_shard`: the system knobs, and the recipe knobs only when searched."""
    parts = []
    for short, attr, _ in SHORT_NAMES:
        if short in RECIPE_SHORT and attr not in searched_recipe:
            continue
        parts.append(f"{short}{getattr(config, attr)}")
    if config.gradient_checkpointing:
        parts.append("ckpt")
    if config.sharding != "replicate":
        parts.append(config.sharding)
    parts += [
        name for name in ("param_offload", "optimizer_offload", "offload_policy") if getattr(config, name)
    ]
    return " ".join(filter(None, [*parts, verl_short(config)]))


def verl_short(config: ProbeConfig) -> str:
    """`gmu0.4 seqs256 dyn4096`: verl's own knobs the configuration sets (empty when none)."""
    parts = [f"{short}{value:g}" for short, attr, _ in VERL_SHORT if (value := getattr(config, attr))]
    if config.use_dynamic_bsz:
        parts.append(f"dyn{config.ppo_max_token_len_per_gpu or ''}")
        for short, budget in (
            ("lp", config.log_prob_max_token_len_per_gpu),
            ("cr", config.critic_max_token_len_per_gpu),
        ):
            if budget:
                parts.append(f"{short}{budget}")
    return " ".join(parts)


def trial_line(trial: FrozenTrial, searched_recipe: Sequence[str] = ()) -> str:
    """`#7 ok  R32 m4 ...  4.52 samples/s  0.622 GiB (predicted 0.600)  41 s` and what else matters."""
    status, attrs = trial_status(trial), trial.user_attrs
    config = trial_config(trial)
    result = attrs.get(Attr.RESULT) or {}
    parts = [f"#{trial.number:<3} {status:<13}", short_config(config, searched_recipe) if config else "-"]
    if trial.values is not None and status == Status.OK:
        parts.append(f"{trial.values[0]:.3f} samples/s")
    if trial.values is not None and trial.values[1]:
        parts.append(f"{trial.values[1] / GIB:.3f} GiB")
    predicted = attrs.get(Attr.PREDICTED_PEAK_BYTES)
    if predicted:
        parts.append(f"(predicted {predicted / GIB:.3f})")
    if result.get("wall_seconds"):
        parts.append(f"{result['wall_seconds']:.0f} s")
    if attrs.get(Attr.DUPLICATE_OF) is not None:
        parts.append(f"= #{attrs[Attr.DUPLICATE_OF]}")
    if attrs.get(Attr.SEED_CONFIG):
        parts.append(f"hand-made '{attrs[Attr.SEED_CONFIG]}'")
    if first := attrs.get(Attr.FIRST_TRY):
        parts.append(
            f"(a second try: the first timed out at {first['timeout_seconds']:.0f} s, {first['busy']})"
        )
    busy = disturbance(trial_environment(trial))
    if busy:
        parts.append(f"[{busy}]")
    needed = timeout_under_load(trial_environment(trial), float(result.get("wall_seconds") or 0.0))
    if status == Status.TIMEOUT and needed:
        parts.append(f"(at that load it may need --timeout-per-probe {needed:.0f})")
    if status not in (Status.OK,) and result.get("message"):
        parts.append(f"- {str(result['message']).splitlines()[0][:120]}")
    return "  ".join(parts)


def side_line(label: str, result: ProbeResult) -> str:
    """`  #5 (recommended): ok 8.430 samples/s, 0.592 GiB [other work ...]`: one probe of the back-to-back
    gain or of a confirmation (autotune.report.gain.Side's label)."""
    busy = disturbance(result.environment)
    return (
        f"  {label}: {result.status} {result.samples_per_sec:.3f} samples/s, "
        f"{result.peak_memory_bytes / GIB:.3f} GiB" + (f" [{busy}]" if busy else "")
    )
