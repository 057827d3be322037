"""The trainer's own default of each system knob the pick weighs, read from the trainer's schema.

    trainer_defaults("trl")
    # {"micro_batch_size": 8, "gradient_checkpointing": True, "num_rollout_workers": 0}

A value off the trainer's default needs a measured reason (docs/design.md, "The pick"): where the probes
cannot tell two contenders apart, the one that keeps more of these defaults is recommended. The values come
from the same tables the exports and `check` read (trl_schema.json, verl_schema.json's export defaults), so
they are TRL 1.16's and verl 0.9.1's, not a copy.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["trainer_defaults"]

# knob -> the trainer's field that carries it (one field, the knob's value as written)
TRL_FIELDS = {
    "micro_batch_size": "per_device_train_batch_size",
    "gradient_checkpointing": "gradient_checkpointing",  # TRL's GRPOConfig field (default true)
    "num_rollout_workers": "dataloader_num_workers",
}
AR = "actor_rollout_ref"
VERL_KEYS = {
    "gradient_checkpointing": f"{AR}.model.enable_gradient_checkpointing",
    "num_rollout_workers": "data.dataloader_num_workers",
    "param_offload": f"{AR}.actor.fsdp_config.param_offload",
    "optimizer_offload": f"{AR}.actor.fsdp_config.optimizer_offload",
    "offload_policy": f"{AR}.actor.fsdp_config.offload_policy",
    "use_dynamic_bsz": f"{AR}.actor.use_dynamic_bsz",
}


@functools.cache
def _defaults(target: str) -> tuple[tuple[str, Any], ...]:
    if target == "trl":
        from autotune.formats.trl_read import fields

        schema = fields()
        return tuple((knob, schema[name]["default"]) for knob, name in TRL_FIELDS.items())
    from autotune.formats.verl_schema import export_default

    return tuple((knob, export_default(key)) for knob, key in VERL_KEYS.items())


def trainer_defaults(target: str) -> dict[str, Any]:
    """The trainer's default value of each knob it has one for ("verl" or "trl")."""
    return dict(_defaults(target))
