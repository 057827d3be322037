"""What a traced pass holds on the device beside what it allocates: the resident training states, as a GPU
run keeps them during each pass (autotune.probe.rank.trace: offload's moves are applied here, after the passes
ran with every state in place).

- param_offload brings a model's weights for its forward passes, its weights and gradients for its update
  (verl frees the gradients when a train step ends);
- optimizer_offload brings Adam's states for the update;
- offload_policy keeps the actor's and critic's states on the host throughout, their gradients and Adam's
  step too (`device_side`);
- a GPU run keeps the sharded reference on the host (verl's forward-only engine).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from autotune.config.knobs import ProbeConfig
from autotune.probe.traced import PhasePeak

__all__ = [
    "STATE_TERMS",
    "away",
    "device_side",
    "on_device",
    "reference_on_host",
    "resident_states",
    "trained_states",
]


def reference_on_host(models: Any, layout: str, sharded: bool) -> int:
    """A GPU run keeps the sharded reference on the host (verl's forward-only engine): not device bytes."""
    if layout != "cuda" or not sharded or models.ref is None:
        return 0
    from autotune.probe.rank.measure import state_bytes

    only_ref = dataclasses.replace(
        models, actor=models.ref, ref=None, critic=None, reward=None, actor_optimizer=None
    )
    return state_bytes(only_ref, "cpu")["weights"]


def resident_states(models: Any, buffer: list[torch.Tensor], layout: str, sharded: bool) -> dict[str, int]:
    """Every state in place (no offload), the reference's host shards left out."""
    from autotune.probe.rank.measure import state_bytes

    states = state_bytes(models, "cpu")
    states["weights"] -= reference_on_host(models, layout, sharded)
    return {**states, "rollout_buffer": sum(t.nbytes for t in buffer)}


STATE_TERMS = ("weights", "gradients", "optimizer")


def trained_states(models: Any) -> dict[int, dict[str, int]]:
    """id(model) -> the states offload moves, for the actor and the critic: weights, gradients, Adam's."""
    from autotune.probe.rank.measure import state_bytes

    found = {}
    for model, optimizer in (
        (models.actor, models.actor_optimizer),
        (models.critic, models.critic_optimizer),
    ):
        if model is not None:
            alone = dataclasses.replace(
                models, actor=model, ref=None, critic=None, reward=None, actor_optimizer=optimizer
            )
            alone = dataclasses.replace(alone, critic_optimizer=None)
            found[id(model)] = state_bytes(alone, "cpu")
    return found


def away(config: ProbeConfig, states: dict[str, int], in_use: bool, updating: bool) -> dict[str, int]:
    """What offload keeps on the host of one trained model's states during a pass: `in_use`, the pass runs
    that model; `updating`, the pass is its update."""
    if config.offload_policy:  # FSDP2's CPUOffloadPolicy: each unit is copied in for its compute only
        return dict(states)
    away = dict.fromkeys(STATE_TERMS, 0)
    if config.param_offload:
        away["weights"] = 0 if in_use else states["weights"]
        away["gradients"] = 0 if in_use and updating else states["gradients"]
    if config.optimizer_offload and not (in_use and updating):
        away["optimizer"] = states["optimizer"]
    return away


def on_device(
    config: ProbeConfig,
    resident: dict[str, int],
    trained: dict[int, dict[str, int]],
    model: Any,
    updating: bool,
) -> dict[str, int]:
    """The resident bytes a GPU run keeps on the device during a pass of `model` (the states when no pass
    runs: `model` None): `resident` less what offload keeps on the host."""
    on = dict(resident)
    for owner, states in trained.items():
        for term, nbytes in away(config, states, owner == id(model), updating).items():
            on[term] -= nbytes
    return on


def device_side(found: list[PhasePeak], resident: dict[str, int]) -> list[PhasePeak]:
    """A pass of a model held under offload_policy: its gradients land on the host as they are reduced and
    Adam steps there, so neither counts on the device; an update's peak is then its backward's."""
    kept = []
    for phase in found:
        parts = {**phase.parts, "gradients": resident.get("gradients", 0), "optimizer_step": 0}
        kept.append(PhasePeak(phase.name, sum(parts.values()), parts))
    if len(kept) == 2 and kept[0].peak > kept[1].peak:  # the backward moment and the update's
        kept[1] = PhasePeak(kept[1].name, kept[0].peak, kept[0].parts)
    return kept
