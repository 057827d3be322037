"""The verl keys autotune reads, with verl 0.9.1's defaults and types (verl_schema.json, written by
tools/verl_schema.py from verl's `_generated_ppo_trainer.yaml`).

    kind("data.train_batch_size")                 # "int"
    effective("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", values)   # the actor's budget

A key's value is the file's, else verl's default; a default that interpolates another key
(`${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false}`, `${.ppo_max_token_len_per_gpu}`) follows it
as OmegaConf resolves it when verl reads the config.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "MISSING",
    "READ_KEYS",
    "SCHEMA_FILE",
    "default",
    "effective",
    "export_default",
    "kind",
    "type_error",
]

AR = "actor_rollout_ref"
SCHEMA_FILE = Path(__file__).with_name("verl_schema.json")
MISSING = "???"  # OmegaConf's mandatory value
READ_KEYS = (
    "data.train_batch_size",
    "data.gen_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "data.dataloader_num_workers",
    f"{AR}.model.path",
    f"{AR}.model.enable_gradient_checkpointing",
    f"{AR}.model.lora_rank",
    f"{AR}.model.lora_alpha",
    f"{AR}.actor.ppo_mini_batch_size",
    f"{AR}.actor.ppo_micro_batch_size",
    f"{AR}.actor.ppo_micro_batch_size_per_gpu",
    f"{AR}.actor.use_dynamic_bsz",
    f"{AR}.actor.ppo_max_token_len_per_gpu",
    f"{AR}.actor.use_kl_loss",
    f"{AR}.actor.kl_loss_coef",
    f"{AR}.actor.fsdp_config.fsdp_size",
    f"{AR}.actor.fsdp_config.param_offload",
    f"{AR}.actor.fsdp_config.optimizer_offload",
    f"{AR}.actor.fsdp_config.offload_policy",
    f"{AR}.actor.fsdp_config.reshard_after_forward",
    f"{AR}.rollout.name",
    f"{AR}.rollout.n",
    f"{AR}.rollout.log_prob_micro_batch_size",
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu",
    f"{AR}.rollout.log_prob_use_dynamic_bsz",
    f"{AR}.rollout.log_prob_max_token_len_per_gpu",
    f"{AR}.rollout.gpu_memory_utilization",
    f"{AR}.rollout.tensor_model_parallel_size",
    f"{AR}.rollout.max_model_len",
    f"{AR}.rollout.max_num_seqs",
    f"{AR}.rollout.agent.num_workers",
    f"{AR}.ref.log_prob_micro_batch_size",
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu",
    f"{AR}.ref.log_prob_use_dynamic_bsz",
    f"{AR}.ref.log_prob_max_token_len_per_gpu",
    "critic.enable",
    "critic.ppo_mini_batch_size",
    "critic.ppo_micro_batch_size",
    "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size",
    "critic.forward_micro_batch_size_per_gpu",
    "critic.use_dynamic_bsz",
    "critic.ppo_max_token_len_per_gpu",
    "critic.forward_max_token_len_per_gpu",
    "algorithm.adv_estimator",
    "algorithm.use_kl_in_reward",
    "algorithm.kl_ctrl.kl_coef",
    "reward_model.enable",
    "reward_model.model.path",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
)
# ${key}, ${.sibling}, ${oc.select:key,default}: the interpolations verl's defaults use for these keys
_INTERPOLATION = re.compile(r"^\$\{(?:oc\.select:)?([A-Za-z0-9_.]+)(?:,([^}]*))?\}$")
_ABSENT = object()


@functools.cache
def _schema() -> dict[str, dict[str, Any]]:
    text = resources.files("autotune.formats").joinpath("verl_schema.json").read_text()
    keys: dict[str, dict[str, Any]] = json.loads(text)["keys"]
    return keys


@functools.cache
def _export_defaults() -> dict[str, Any]:
    text = resources.files("autotune.formats").joinpath("verl_schema.json").read_text()
    found: dict[str, Any] = json.loads(text).get("export_defaults", {})
    return found


def export_default(key: str) -> Any:
    """verl 0.9.1's default of a key the export writes (a leading `+` ignored: the dataclass's default);
    KeyError for a key the export does not write."""
    return _export_defaults()[key.lstrip("+")]


def kind(key: str) -> str | None:
    """The type verl's config gives the key ("int", "float", "bool", "str"); None: a key autotune does not
    read."""
    entry = _schema().get(key)
    return entry["type"] if entry else None


def default(key: str) -> Any:
    """verl's default as its YAML writes it (an interpolation stays a string; "???" is mandatory)."""
    return _schema()[key]["default"]


def type_error(key: str, value: Any) -> str | None:
    """Why verl's config cannot take `value` for `key` (None: it can, or autotune does not read the key). null
    is allowed where verl's default is null; ints are floats too, as OmegaConf and verl's dataclasses read
    them; text is never a number or a switch (a quoted '4' is the string "4" to Hydra)."""
    want = kind(key)
    if want is None or (isinstance(value, str) and _INTERPOLATION.match(value)):
        return None
    if value is None:
        return None if default(key) is None else f"null, where verl wants {_NAMES[want]}"
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, (str, int, float)) and not isinstance(value, bool),
    }[want]
    if ok:
        return None
    shown = "text" if isinstance(value, str) else type(value).__name__
    return f"{shown}, where verl wants {_NAMES[want]}"


_NAMES = {"bool": "true or false", "int": "a whole number", "float": "a number", "str": "text"}


def effective(key: str, values: Mapping[str, Any], depth: int = 0) -> Any:
    """The value verl reads for `key`: the file's (`values`, keys as Hydra composes them), else verl's
    default, with a `${...}` interpolation followed; an interpolation autotune cannot follow is returned as
    written (its type then refuses it where a number is needed)."""
    value = values[key] if key in values else (default(key) if kind(key) else _ABSENT)
    if value is _ABSENT:
        return None
    match = _INTERPOLATION.match(value) if isinstance(value, str) else None
    if match is None or depth > 8:
        return value
    target, fallback = match.groups()
    if target.startswith("."):  # relative: a sibling of the key
        target = key.rpartition(".")[0] + target
    if target in values or kind(target):
        return effective(target, values, depth + 1)
    if fallback is not None:
        return _literal(fallback)
    return value


def _literal(text: str) -> Any:
    """An interpolation's default in verl's YAML (`false`, `16384`, `null`): read as YAML, where they mean
    what they mean to Hydra."""
    import yaml

    return yaml.safe_load(text.strip())
