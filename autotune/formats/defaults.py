"""The trainer's own default of each system knob the pick weighs, read from the trainer's schema.

    trl_defaults()
    # {"micro_batch_size": 8, "gradient_checkpointing": True, "num_rollout_workers": 0}

A value off the trainer's default needs a measured reason (docs/design.md, "The pick"): where the probes
cannot tell two contenders apart, the one that keeps more of these defaults is recommended. The values come
from the same tables the exports and `check` read (trl_schema.json, verl_schema.json's export defaults), so
they are TRL 1.16's and verl 0.9.1's, not a copy.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["trl_defaults", "verl_defaults"]

# The knobs the pick weighs, each read where the export writes it (the first key or field of its route)
TRL_KNOBS = ("micro_batch_size", "gradient_checkpointing", "num_rollout_workers")
VERL_KNOBS = (
    "gradient_checkpointing",
    "num_rollout_workers",
    "param_offload",
    "optimizer_offload",
    "offload_policy",
    "use_dynamic_bsz",
)
# The export writes transformers' current name; TRL's GRPOConfig keeps the default on the older one
TRL_DEFAULT_FIELD = {"activation_checkpointing": "gradient_checkpointing"}


@functools.cache
def _trl_defaults() -> tuple[tuple[str, Any], ...]:
    from autotune.formats.trl import ROUTE_OF
    from autotune.formats.trl_read import fields

    schema = fields()
    named = {knob: ROUTE_OF[knob].fields[0] for knob in TRL_KNOBS}
    return tuple((knob, schema[TRL_DEFAULT_FIELD.get(f, f)]["default"]) for knob, f in named.items())


@functools.cache
def _verl_defaults() -> tuple[tuple[str, Any], ...]:
    from autotune.formats.verl_schema import export_default
    from autotune.formats.verl_table import route

    return tuple((knob, export_default(route(knob).keys[0].name)) for knob in VERL_KNOBS)


def trl_defaults() -> dict[str, Any]:
    """TRL 1.16's default value of each knob it has one for."""
    return dict(_trl_defaults())


def verl_defaults() -> dict[str, Any]:
    """verl 0.9.1's default value of each knob it has one for."""
    return dict(_verl_defaults())
