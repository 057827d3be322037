"""The seed article's config schema: best_config.yaml is written in it, and `autotune check` reads it back.

    document = seed_document(config, model="llama-2-7b", reward_model="function", measured={...}, gpus=2)
    text = seed_yaml(document, header="# ...\n")
    target = read_seed(yaml.safe_load(text), Path("best_config.yaml"))    # target.config == config

The schema (as the article writes its hand-made configs): the batch knobs at the top level,
`actor_model_config` (model, LoRA, gradient checkpointing, optionally `fsdp_config`), `reward_model_config`,
and `fsdp_config` (at the top level or inside `actor_model_config`: the article's text allows both; inside
wins). Keys the article uses outside that schema (init_kl_coef, kl_target, log_level, dataset_cache_dir) and
best_config.yaml's `measured:` block are accepted unchecked.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from autotune.config.checker import MISSING, Checker
from autotune.config.knobs import (
    KNOB_NAMES,
    MINI_BATCH,
    VERL_KNOBS,
    ProbeConfig,
    mini_batch_size,
    resolve_mini_batch,
)
from autotune.config.rules import Finding
from autotune.errors import UserError
from autotune.formats.rollout import RolloutEngine
from autotune.formats.target import Target
from autotune.models.names import model_name_or_path

__all__ = ["SHARDING", "VERL_EXPORT", "kl_placement", "read_seed", "seed_document", "seed_yaml"]

INT, BOOL, STR, NUM, SECTION = "int", "bool", "str", "number", "section"
KNOBS: dict[str, str] = {
    "rollout_batch_size": INT,
    "train_batch_size": INT,
    MINI_BATCH: INT,  # samples per optimizer step, as the spaces say it: the accumulation steps follow
    "micro_batch_size": INT,
    "gradient_accumulation_steps": INT,
    "num_rollout_workers": INT,
    "max_prompt_length": INT,
    "max_response_length": INT,
    "log_prob_micro_batch_size": INT,
    "gradient_checkpointing": BOOL,
    "algorithm": STR,
    "rollout_n": INT,
    "kl_coef": NUM,
    "kl_placement": STR,
    # verl's own knobs (`--engine verl`), written when the configuration sets them (`_verl_knobs`)
    **{
        name: NUM if name == "gpu_memory_utilization" else BOOL if name == "use_dynamic_bsz" else INT
        for name in VERL_KNOBS
    },
}
REQUIRED = (
    "rollout_batch_size",
    "train_batch_size",
    "micro_batch_size",
    "max_prompt_length",
    "max_response_length",
)
ACCUMULATION = "gradient_accumulation_steps"  # or mini_batch_size: one of them is required
# best_config.yaml's order: the mini batch as every command takes it, and the accumulation steps it means on
# the measured GPUs, which the seed article's trainers read
WRITTEN_KNOBS = (
    "rollout_batch_size",
    "train_batch_size",
    MINI_BATCH,
    "micro_batch_size",
    ACCUMULATION,
    "num_rollout_workers",
    "max_prompt_length",
    "max_response_length",
)
# The article's fsdp_config (sharding_strategy; cpu_offload: FSDP's CPU offload, i.e. verl's offload_policy)
# and verl's phase offloads
FSDP_KEYS = {"sharding_strategy": STR, "cpu_offload": BOOL, "param_offload": BOOL, "optimizer_offload": BOOL}
SECTIONS: dict[str, dict[str, str]] = {
    "actor_model_config": {
        "model_name_or_path": STR,
        "use_lora": BOOL,
        "lora_r": INT,
        "lora_alpha": INT,
        "gradient_checkpointing": BOOL,
        "fsdp_config": SECTION,
    },
    "critic_model_config": {
        "use_lora": BOOL,
        "lora_r": INT,
        "lora_alpha": INT,
        "gradient_checkpointing": BOOL,
    },
    "reward_model_config": {"model_name_or_path": STR, "trainable": BOOL},
    "rollout_engine": {
        "name": STR,
        "tensor_model_parallel_size": INT,
        "gpu_memory_utilization": NUM,
        "max_model_len": INT,
        "max_num_seqs": INT,
    },
    "fsdp_config": FSDP_KEYS,
}
# each exported verl key beside verl's default and why it differs (formats/verl_defaults.py): for people
VERL_EXPORT = "verl_export"
UNCHECKED = {"init_kl_coef", "kl_target", "log_level", "dataset_cache_dir", "measured", VERL_EXPORT}
SHARDING = {  # torch FSDP strategy -> how the states are modelled
    "FULL_SHARD": "full_shard",
    "HYBRID_SHARD": "full_shard",  # full shard within a node: the same per GPU on one node
    "SHARD_GRAD_OP": "shard_grad_op",
    "_HYBRID_SHARD_ZERO2": "shard_grad_op",
    "NO_SHARD": "none",
}
STRATEGY = {"replicate": "NO_SHARD", "full_shard": "FULL_SHARD", "shard_grad_op": "SHARD_GRAD_OP"}


# --- writing ---------------------------------------------------------------------------------------------


def seed_document(
    config: ProbeConfig,
    model: str,
    reward_model: str,
    measured: dict[str, Any] | None = None,
    engine: RolloutEngine | None = None,
    *,
    gpus: int,
) -> dict[str, Any]:
    """`config` on `gpus` GPUs in the seed's schema, with the recipe verl needs to run it as measured (KL, the
    critic's LoRA and checkpointing, the rollout engine); `measured` (the study's figures) becomes a
    `measured:` block."""
    c = config
    sizes = {**c.to_dict(), MINI_BATCH: mini_batch_size(c, gpus)}
    data: dict[str, Any] = {key: sizes[key] for key in WRITTEN_KNOBS}
    if c.log_prob_micro_batch_size is not None:
        data["log_prob_micro_batch_size"] = c.log_prob_micro_batch_size
    data.update(
        gradient_checkpointing=c.gradient_checkpointing,
        algorithm=c.algorithm,
        rollout_n=c.rollout_n,
        kl_coef=c.kl_coef,
        kl_placement=kl_placement(c),
    )
    data.update(_verl_knobs(c))
    data["actor_model_config"] = {
        "model_name_or_path": model_name_or_path(model),
        **_trained(c),
        "fsdp_config": _fsdp(c),
    }
    if c.algorithm == "ppo":
        data["critic_model_config"] = _trained(c)
    if engine is not None:
        data["rollout_engine"] = {
            "name": engine.name,
            "tensor_model_parallel_size": engine.tensor_model_parallel_size,
            "gpu_memory_utilization": engine.gpu_memory_utilization,
            "max_model_len": engine.max_model_len,
        }
        if engine.max_num_seqs is not None:
            data["rollout_engine"]["max_num_seqs"] = engine.max_num_seqs
    if reward_model != "function":
        data["reward_model_config"] = {
            "model_name_or_path": model_name_or_path(reward_model),
            "trainable": False,
        }
    if measured is not None:
        data["measured"] = measured
    return data


def _verl_knobs(c: ProbeConfig) -> dict[str, Any]:
    """verl's knobs the configuration sets (None and false are the rules' and verl's defaults: left out)."""
    return {name: getattr(c, name) for name in VERL_KNOBS if getattr(c, name) not in (None, False)}


def kl_placement(config: ProbeConfig) -> str:
    """Where the probe (and verl, as exported) puts the KL: PPO in the reward, GRPO in the loss."""
    if not config.use_kl:
        return "none"
    return "reward" if config.algorithm == "ppo" else "loss"


def _trained(c: ProbeConfig) -> dict[str, Any]:
    """How a trained model (the actor, the critic) is trained: LoRA and gradient checkpointing."""
    trained: dict[str, Any] = {"use_lora": c.use_lora}
    if c.use_lora:
        trained.update(lora_r=c.lora_r, lora_alpha=c.lora_alpha)
    trained["gradient_checkpointing"] = c.gradient_checkpointing
    return trained


def _fsdp(c: ProbeConfig) -> dict[str, Any]:
    """How the states are held, in the article's fsdp_config (cpu_offload is FSDP's own offload)."""
    return {
        "sharding_strategy": STRATEGY[c.sharding],
        "cpu_offload": c.offload_policy,
        "param_offload": c.param_offload,
        "optimizer_offload": c.optimizer_offload,
    }


def seed_yaml(document: dict[str, Any], header: str = "") -> str:
    return header + yaml.safe_dump(document, sort_keys=False, allow_unicode=True)


# --- reading ---------------------------------------------------------------------------------------------


def read_seed(data: dict[str, Any], path: Path, gpus: int | None = None) -> Target:
    """A parsed seed-schema file, its mini batch read on `gpus` GPUs (default: the measured ones, else 1);
    wrong types and missing batch knobs are one UserError, unknown keys findings."""
    check = Checker("")
    findings = [
        _unknown(key, guess, [*KNOBS, *SECTIONS, *sorted(UNCHECKED)])
        for key, guess in check.unknown_keys("", data, (*KNOBS, *SECTIONS, *UNCHECKED), record=False)
    ]
    knobs = {key: _typed(check, key, data[key], kind) for key, kind in KNOBS.items() if key in data}
    sections = {name: _section(check, name, data.get(name) or {}, findings) for name in SECTIONS}
    missing = [k for k in REQUIRED if k not in data]
    if MINI_BATCH not in data and ACCUMULATION not in data:
        missing.append(f"{MINI_BATCH} (or {ACCUMULATION})")
    if missing:
        check.error(
            ", ".join(missing),
            MISSING,
            f"missing: best_config.yaml's batch knobs are {', '.join(REQUIRED)} and {MINI_BATCH} (or "
            f"{ACCUMULATION})",
        )
    if check.errors:
        raise UserError(f"config '{path}': " + "; ".join(check.errors))
    raw_measured = data.get("measured")
    measured: dict[str, Any] = raw_measured if isinstance(raw_measured, dict) else {}
    measured_gpus = measured.get("gpus") if isinstance(measured.get("gpus"), int) else None
    knobs = _accumulation(knobs, gpus or measured_gpus or 1, measured_gpus, path, findings)
    actor, reward = sections["actor_model_config"], sections["reward_model_config"]
    fsdp = {**sections["fsdp_config"], **actor.get("fsdp_config", {})}
    strategy = str(fsdp.get("sharding_strategy", "NO_SHARD" if not fsdp else "FULL_SHARD")).upper()
    config = _held(_config(knobs, actor), strategy, fsdp)
    findings += _strategy_findings(strategy) + _placement_findings(knobs.get("kl_placement"), config)
    engine = sections["rollout_engine"]
    budget = measured.get("budget_gib")
    return Target(
        kind="seed schema",
        config=config,
        model=actor.get("model_name_or_path"),
        reward_model=reward.get("model_name_or_path"),
        reward_trainable=bool(reward.get("trainable", False)),
        sharding=SHARDING.get(strategy, "none"),
        sharding_label=f"FSDP {strategy}" if fsdp else "replicated (DDP)",
        offload=config.offloaded,
        gpus=measured_gpus,
        memory_gib=float(budget) if isinstance(budget, (int, float)) else None,
        findings=findings,
        engine=RolloutEngine(**engine) if engine else None,
    )


def _accumulation(
    knobs: dict[str, Any], gpus: int, measured_gpus: int | None, path: Path, findings: list[Finding]
) -> dict[str, Any]:
    """The knobs with the mini batch as accumulation steps on `gpus` GPUs. The mini batch is the recipe: where
    the file's own steps disagree, they are a problem on the measured GPUs and a note on others (a study's
    best_config.yaml checked for another GPU count)."""
    given = knobs.get(ACCUMULATION)
    if knobs.get(MINI_BATCH) is None:
        return knobs
    try:
        resolved = resolve_mini_batch({**knobs, ACCUMULATION: None}, gpus, where="")
    except UserError as exc:
        if given is None:  # nothing else says how many steps: no config to check
            raise UserError(f"config '{path}': {exc}") from None
        # the file's steps still make a config (a mini batch that differs on these GPUs): checked as such
        findings.append(Finding("schema", str(exc), f"a multiple of {knobs['micro_batch_size'] * gpus}"))
        return {k: v for k, v in knobs.items() if k != MINI_BATCH}
    derived = resolved[ACCUMULATION]
    if given is not None and given != derived:
        elsewhere = measured_gpus is not None and gpus != measured_gpus
        problem = (
            f"{ACCUMULATION}={given} disagrees with {MINI_BATCH}={knobs[MINI_BATCH]}, which is {derived} "
            f"step(s) of micro batch {resolved['micro_batch_size']} on {gpus} GPU(s)"
            + (
                f" (the file's steps are for its {measured_gpus} GPU(s)); checked as {derived}"
                if elsewhere
                else ""
            )
        )
        fix = f"{ACCUMULATION}: {derived}, or leave it out: it follows from {MINI_BATCH}"
        findings.append(
            Finding(
                "schema",
                problem,
                fix,
                key=ACCUMULATION,
                value=given,
                severity="note" if elsewhere else "problem",
            )
        )
    return resolved


def _placement_findings(placement: str | None, config: ProbeConfig) -> list[Finding]:
    """kl_placement follows from the algorithm and kl_coef (PPO: reward, GRPO: loss, 0: none)."""
    expected = kl_placement(config)
    if placement is None or placement == expected:
        return []
    problem = (
        f"kl_placement={placement}: with algorithm={config.algorithm} and kl_coef={config.kl_coef:g} the KL "
        f"goes in the {expected} (PPO: the reward, GRPO: the loss, kl_coef 0: nowhere), as the probe measured"
    )
    return [Finding("schema", problem, f"kl_placement: {expected}", key="kl_placement", value=placement)]


def _typed(check: Checker, path: str, value: Any, kind: str) -> Any:
    if kind == INT:
        return check.integer(path, value)
    if kind == BOOL:
        return check.boolean(path, value)
    if kind == STR:
        return check.text(path, value)
    if kind == NUM:
        return check.number(path, value)
    return check.mapping(path, value)


def _unknown(key: str, guess: str | None, known: list[str]) -> Finding:
    return Finding(
        "schema",
        f"unknown key {key}: not in best_config.yaml's schema, so nothing reads it"
        + (f" (did you mean {guess!r}?)" if guess else ""),
        f"rename it to {guess}" if guess else f"remove it; known keys: {', '.join(known)}",
        key=key,
    )


def _section(check: Checker, name: str, raw: Any, findings: list[Finding]) -> dict[str, Any]:
    """A section's typed values; unknown keys become findings, wrong types errors."""
    if check.mapping(name, raw) is None:
        return {}
    schema = SECTIONS[name]
    for key, guess in check.unknown_keys(name, raw, tuple(schema), record=False):
        findings.append(_unknown(key, guess, list(schema)))
    values = {}
    for key, value in raw.items():
        if key == "fsdp_config":
            values[key] = _section(check, "fsdp_config", value, findings)
        elif key in schema:
            values[key] = _typed(check, f"{name}.{key}", value, schema[key])
    return values


def _config(knobs: dict[str, Any], actor: dict[str, Any]) -> ProbeConfig:
    values = {k: v for k, v in knobs.items() if v is not None and k in KNOB_NAMES}
    values.setdefault("num_rollout_workers", 1)  # the article: "default 1, fine for debugging"
    if "gradient_checkpointing" in actor:
        values["gradient_checkpointing"] = actor["gradient_checkpointing"]
    values["use_lora"] = bool(actor.get("use_lora", False))
    for key in ("lora_r", "lora_alpha"):
        if actor.get(key) is not None:
            values[key] = actor[key]
    return dataclasses.replace(ProbeConfig(), **values)


def _held(config: ProbeConfig, strategy: str, fsdp: dict[str, Any]) -> ProbeConfig:
    sharding = SHARDING.get(strategy, "none")
    return dataclasses.replace(
        config,
        sharding="replicate" if sharding == "none" else sharding,
        offload_policy=bool(fsdp.get("cpu_offload", False)),
        param_offload=bool(fsdp.get("param_offload", False)),
        optimizer_offload=bool(fsdp.get("optimizer_offload", False)),
    )


def _strategy_findings(strategy: str) -> list[Finding]:
    if strategy in SHARDING:
        return []
    problem = f"fsdp_config.sharding_strategy={strategy}: not a torch FSDP strategy"
    return [
        Finding("schema", problem, f"use one of {', '.join(SHARDING)}", key="fsdp_config.sharding_strategy")
    ]
