"""What changes in the user's own file when a study tuned some of its system knobs: the trainer's keys of
those knobs whose value the file does not already give.

    verl_changes(best, gpus=8, knobs={"micro_batch_size"}, file_values=target.overrides)
    # {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "8", ...}   Hydra text, for the file
    trl_changes(best, knobs={"micro_batch_size"}, file_data=yaml_mapping)
    # {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2}  YAML values

Only the keys of the knobs the study searched are written (a knob held at the file's value keeps the file's
key as it is, even where autotune's own export would spell it another way), and only where the value differs
from what the trainer reads in the file today (its value, else the trainer's default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from autotune.config.knobs import ProbeConfig
from autotune.formats import trl as trl_format
from autotune.formats.trl_read import parse_trl
from autotune.formats.verl import DEPRECATED_MICRO, format_value
from autotune.formats.verl_route import Job
from autotune.formats.verl_schema import effective
from autotune.formats.verl_table import ROUTES

__all__ = ["trl_changes", "verl_changes"]

MICRO, ACCUM = "micro_batch_size", "gradient_accumulation_steps"  # ProbeConfig's fields
DYNAMIC = "use_dynamic_bsz"


def verl_changes(
    config: ProbeConfig, gpus: int, knobs: Iterable[str], file_values: Mapping[str, Any]
) -> dict[str, str]:
    """verl's keys (Hydra text) that carry `knobs` of `config` and differ from the file's `file_values` (as
    Hydra composed them). A key verl's YAML lacks is written `++key` (added, or replaced where a config file
    has it); a deprecated global micro batch the file sets is set to null beside its per-GPU key, which verl
    refuses to read together with it."""
    searched = set(knobs)
    job = Job(config, gpus, None, None)
    # dynamic batch size turned off is written where it would be on: the file may have it on
    dynamic = Job(dataclasses.replace(config, use_dynamic_bsz=True), gpus, None, None)
    changes: dict[str, str] = {}
    for route in ROUTES:
        if route.knob not in searched or not route.reads:
            continue
        for key in route.written(dynamic if route.knob == DYNAMIC else job):
            bare = key.name.lstrip("+")
            value = key.value(job)
            if _same(effective(bare, file_values), value):
                continue
            changes["++" + bare if key.name.startswith("+") else bare] = format_value(value)
            old = DEPRECATED_MICRO.get(bare)
            if old is not None and file_values.get(old) is not None:
                changes[old] = "null"
    return changes


def trl_changes(config: ProbeConfig, knobs: Iterable[str], file_data: Mapping[str, Any]) -> dict[str, Any]:
    """TRL's fields that carry `knobs` of `config` and differ from what TRL reads in the file `file_data` (its
    YAML mapping). With the micro batch go the accumulation steps that keep the file's own mini batch per
    process (the study may have measured a rehearsal's); ValueError when the micro batch does not divide it.
    Gradient checkpointing keeps the name the file uses for it (transformers' old one or its new one)."""
    searched = set(knobs) | ({ACCUM} if MICRO in knobs else set())
    read = parse_trl(dict(file_data), where="the file")
    share = read["per_device_train_batch_size"] * read["gradient_accumulation_steps"]
    if MICRO in searched and share % config.micro_batch_size:
        raise ValueError(
            f"per_device_train_batch_size {config.micro_batch_size} does not divide the file's "
            f"{share} samples per process and optimizer step"
        )
    if MICRO in searched:
        config = dataclasses.replace(config, gradient_accumulation_steps=share // config.micro_batch_size)
    fields = trl_format.trl_fields(config).grpo
    changes: dict[str, Any] = {}
    for route in trl_format.ROUTES:
        if route.knob not in searched or not route.reads:
            continue
        for name in route.fields:
            if name not in fields or _same(read.get(name), fields[name]):
                continue
            changes[_field_name(name, file_data)] = fields[name]
    return changes


def _field_name(name: str, file_data: Mapping[str, Any]) -> str:
    """The file's own spelling of gradient checkpointing, when it uses the other one."""
    aliases = ("gradient_checkpointing", "activation_checkpointing")
    if name in aliases and name not in file_data:
        return next((alias for alias in aliases if alias in file_data), name)
    return name


def _same(read: Any, wanted: Any) -> bool:
    """Equal as the trainer reads them: a bool is not the number 1."""
    return type(read) is type(wanted) and read == wanted if isinstance(wanted, bool) else read == wanted
