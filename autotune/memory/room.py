"""Room left on the card: when a config's peak leaves a quarter of the card free, the system knobs that room
allows, each with its predicted peak (the seed article's other half: batches too small leave the GPU idle).
Never a recipe change: the train and mini batch, the lengths and what is trained stay.

    room_changes(model, config, card)   # [("gradient_checkpointing: false", 52.1 GiB), ...], each fitting
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from autotune.config.knobs import ProbeConfig
from autotune.memory.budget import Budget
from autotune.memory.calibration import MemoryModel

__all__ = ["ROOM_SHARE", "room_changes"]

ROOM_SHARE = 0.25  # the share of the card left free from which the room is worth saying


def room_changes(
    model: MemoryModel,
    config: ProbeConfig,
    card: Budget,
    peak_of: Callable[[ProbeConfig], float] | None = None,
) -> list[tuple[str, int]]:
    """The system changes that still fit `card`'s limit (each alone, with its predicted peak), when the
    config's peak leaves at least ROOM_SHARE of the card; [] otherwise. `peak_of`: a config's peak over the
    whole step (the rollout phase too); default the model's training phases."""
    peak_of = peak_of or model.predict
    if peak_of(config) > card.bytes * (1 - ROOM_SHARE):
        return []
    found = []
    for change, candidate in _candidates(config, model.world_size, trl=model.passes.padded):
        peak = int(peak_of(candidate))
        if peak <= card.limit:
            found.append((change, peak))
    return found


def _candidates(c: ProbeConfig, gpus: int, trl: bool = False) -> list[tuple[str, ProbeConfig]]:
    """Single system changes that spend memory for speed, in the trainer's names (TRL's fields for TRL:
    its log-prob passes take the micro batch, it has no token budget and no offload switch)."""
    found = []
    if c.gradient_checkpointing:
        name = "activation_checkpointing" if trl else "gradient_checkpointing"
        found.append((f"{name}: false", dataclasses.replace(c, gradient_checkpointing=False)))
    if trl:
        if c.gradient_accumulation_steps % 2 == 0:
            micro, steps = c.micro_batch_size * 2, c.gradient_accumulation_steps // 2
            change = (
                f"per_device_train_batch_size {c.micro_batch_size}→{micro} (gradient_accumulation_steps "
                f"{steps})"
            )
            found.append(
                (change, dataclasses.replace(c, micro_batch_size=micro, gradient_accumulation_steps=steps))
            )
        return found
    per_gpu = c.micro_batch_size * c.gradient_accumulation_steps  # a GPU's share of the mini batch
    if c.use_dynamic_bsz:
        budget = c.token_budget * 2
        if budget <= per_gpu * c.sequence_length:
            change = f"ppo_max_token_len_per_gpu {c.token_budget}→{budget}"
            found.append((change, dataclasses.replace(c, ppo_max_token_len_per_gpu=budget)))
    elif c.gradient_accumulation_steps % 2 == 0:
        micro, steps = c.micro_batch_size * 2, c.gradient_accumulation_steps // 2
        change = f"micro_batch_size {c.micro_batch_size}→{micro} (gradient_accumulation_steps {steps})"
        found.append(
            (change, dataclasses.replace(c, micro_batch_size=micro, gradient_accumulation_steps=steps))
        )
    forward = c.forward_micro_batch_size * 2
    if not c.use_dynamic_bsz and forward <= c.train_batch_size // max(1, gpus):
        change = f"log_prob_micro_batch_size {c.forward_micro_batch_size}→{forward}"
        found.append((change, dataclasses.replace(c, log_prob_micro_batch_size=forward)))
    if c.offload_policy or c.param_offload or c.optimizer_offload:
        fewer = dataclasses.replace(c, offload_policy=False, param_offload=False, optimizer_offload=False)
        found.append(("no offload (the states stay on the GPU)", fewer))
    return found
