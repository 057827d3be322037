"""How each knob reaches verl 0.9.1: the one table that decides which keys the export writes.

    for route in ROUTES:           # every ProbeConfig field, and the job's own settings (GPUs, model, engine)
        route.knob, route.reads    # reads False: not a verl knob (only autotune's built-in probe has it)
        for key in route.keys:     # the keys that carry it, for the trainer the export targets
            key.name, key.reaches  # what verl builds from the key (tests/test_verl_objects.py proves it)

The target is verl's default trainer, V1 in sync mode (`trainer.use_v1`, `trainer.v1.trainer_mode: sync`;
paths below are inside the verl 0.9.1 wheel). A key is written only when verl's objects change with it, or
when verl's own config check refuses the job without it (`reaches` is then empty and `why` says which check):
`tests/test_verl_objects.py` builds the objects verl's workers are built from with verl's own code, changes
each key, and fails when a key it expects to move them moves nothing.

Two knobs of the seed article are not what they seem in verl's V1 trainer:
- the rollout batch: `data.gen_batch_size` is only how many prompts the dataloader fetches at a time. In sync
  mode every prompt of a step is joined and submitted to vLLM at once (trainer/ppo/v1/trainer_base.py
  `_next_train_batch`, `_submit_batch_to_rollout`); how many sequences run together is vLLM's
  `max_num_seqs`, within its KV-cache pool. The built-in probe's R (Hugging Face `generate` in chunks of R)
  has no verl key: it is not exported, and a study does not search it unless asked.
- the critic's micro batches: the V1 critic is built from its engine config (`critic.fsdp`), whose dynamic
  batch size is on by default with `critic.ppo_infer_max_token_len_per_gpu` as both token budgets
  (trainer_base.py:265-268); `critic.ppo_micro_batch_size_per_gpu` is read only by the critic's config check
  (workers/config/critic.py:103-108). The export sets the engine's own fields.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.config.knobs import KNOB_NAMES
from autotune.formats.verl_route import (
    ADV_ESTIMATORS,
    AR,
    CRITIC_ENGINE,
    Job,
    Key,
    Route,
    agent_workers,
    always,
    mini_batch_samples,
    no_sync_as_probed,
)

__all__ = [
    "IGNORED_BY_V1",
    "JOB_ROUTES",
    "ROUTES",
    "ignored_keys",
    "not_verl_knobs",
    "route",
]


def _critic(job: Job) -> bool:
    return job.critic


def _fixed(job: Job) -> bool:
    return job.fixed_micro


def _fixed_critic(job: Job) -> bool:
    return job.critic and job.fixed_micro


def _fixed_full_weights_reference(job: Job) -> bool:
    return _full_weights_reference(job) and job.fixed_micro


def _fixed_lora_reference(job: Job) -> bool:
    return job.reference and job.config.use_lora and job.fixed_micro


def _dynamic(job: Job) -> bool:
    return job.config.use_dynamic_bsz


def _dynamic_critic(job: Job) -> bool:
    return job.critic and job.config.use_dynamic_bsz


def _lora(job: Job) -> bool:
    return job.config.use_lora


def _lora_critic(job: Job) -> bool:
    return job.critic and job.config.use_lora


def _kl_in_reward(job: Job) -> bool:
    return job.config.use_kl and job.config.algorithm == "ppo"


def _kl_in_loss(job: Job) -> bool:
    return job.config.use_kl and job.config.algorithm == "grpo"


def _full_weights_reference(job: Job) -> bool:
    """A reference model of its own (KL without LoRA; with LoRA it is the actor with its adapters off)."""
    return job.reference and not job.config.use_lora


def _model_path(job: Job) -> bool:
    return bool(job.model_path)


def _critic_model_path(job: Job) -> bool:
    return job.critic and bool(job.model_path)


def _c(field: str) -> Callable[[Job], Any]:
    """The configuration's own value of a field."""
    return lambda job: getattr(job.config, field)


def _e(field: str) -> Callable[[Job], Any]:
    """The rollout engine's value of a field."""
    return lambda job: getattr(job.engine, field)


def _sharded(fsdp: str, when: Callable[[Job], bool], who: str) -> tuple[Key, ...]:
    """FSDP2 as the probe held the states: over every GPU (fsdp_size -1) or in shard groups of one GPU
    (fsdp_size 1: replicated, gradients all-reduced); resharded after the forward (full_shard) or kept to the
    backward (shard_grad_op)."""
    return (
        Key(
            f"{fsdp}.fsdp_size",
            lambda job: -1 if job.config.sharded else 1,
            when,
            (f"{who}.engine.fsdp_size",),
        ),
        Key(
            f"{fsdp}.reshard_after_forward",
            lambda job: job.config.sharding != "shard_grad_op",
            when,
            (f"{who}.engine.reshard_after_forward",),
        ),
    )


def _offload(field: str) -> tuple[Key, ...]:
    return (
        Key(f"{AR}.actor.fsdp_config.{field}", _c(field), always, (f"actor.engine.{field}",)),
        Key(f"{CRITIC_ENGINE}.{field}", _c(field), _critic, (f"critic.engine.{field}",)),
    )


def _kl_coef_keys() -> tuple[Key, ...]:
    """The probe's KL: PPO folds it into the reward (k1, verl's `kl`), GRPO adds it to the loss (k3, verl's
    `low_var_kl`); with kl_coef 0 there is none, and verl builds no reference model."""
    return (
        Key("algorithm.use_kl_in_reward", _kl_in_reward, always, ("algorithm.use_kl_in_reward",)),
        Key(f"{AR}.actor.use_kl_loss", _kl_in_loss, always, ("actor.config.use_kl_loss",)),
        Key("algorithm.kl_penalty", lambda job: "kl", _kl_in_reward, ("algorithm.kl_penalty",)),
        Key("algorithm.kl_ctrl.kl_coef", _c("kl_coef"), _kl_in_reward, ("algorithm.kl_ctrl.kl_coef",)),
        Key(
            f"{AR}.actor.kl_loss_type", lambda job: "low_var_kl", _kl_in_loss, ("actor.config.kl_loss_type",)
        ),
        Key(f"{AR}.actor.kl_loss_coef", _c("kl_coef"), _kl_in_loss, ("actor.config.kl_loss_coef",)),
    )


def _budget(job: Job) -> int:
    return job.config.token_budgets[0]


def _forward_budget(job: Job) -> int:
    return job.config.token_budgets[1]


def _critic_budget(job: Job) -> int:
    return job.config.token_budgets[2]


def _dynamic_full_weights_reference(job: Job) -> bool:
    return _full_weights_reference(job) and job.config.use_dynamic_bsz


ROUTES: tuple[Route, ...] = (
    # --- the recipe: what is trained ---
    Route(
        "train_batch_size",
        (
            Key(
                "data.train_batch_size",
                lambda job: job.config.train_batch_size // job.config.rollout_n,
                reaches=("replay.train_batch_size", "data.loader.batch_size"),
            ),
        ),
    ),
    Route("rollout_n", (Key(f"{AR}.rollout.n", _c("rollout_n"), reaches=("rollout.n",)),)),
    Route(
        "gradient_accumulation_steps",  # with m and W: the mini batch, samples per optimizer step
        (
            Key(
                f"{AR}.actor.ppo_mini_batch_size",
                lambda job: mini_batch_samples(job.config, job.gpus) // job.config.rollout_n,
                reaches=("actor.config.ppo_mini_batch_size", "critic.config.ppo_mini_batch_size"),
            ),
        ),
    ),
    Route(
        "max_prompt_length",
        (Key("data.max_prompt_length", _c("max_prompt_length"), reaches=("rollout.prompt_length",)),),
    ),
    Route(
        "max_response_length",
        (Key("data.max_response_length", _c("max_response_length"), reaches=("rollout.response_length",)),),
    ),
    Route(
        "algorithm",
        (
            Key(
                "algorithm.adv_estimator",
                lambda job: ADV_ESTIMATORS[job.config.algorithm],
                reaches=("algorithm.adv_estimator", "trainer.use_critic"),
            ),
        ),
    ),
    Route("kl_coef", _kl_coef_keys()),
    Route(
        "use_lora",  # with lora_r: verl turns LoRA on by a rank above 0
        (
            Key(f"{AR}.model.lora_rank", _c("lora_r"), _lora, ("actor.model.lora_rank",)),
            Key("critic.model.lora_rank", _c("lora_r"), _lora_critic, ("critic.model.lora_rank",)),
            # the probe's LoRA base is bf16; verl would load a training model in fp32 (engine/fsdp.yaml)
            Key(
                f"{AR}.actor.fsdp_config.model_dtype",
                lambda job: "bf16",
                _lora,
                ("actor.engine.model_dtype",),
            ),
            Key(
                f"{CRITIC_ENGINE}.model_dtype",
                lambda job: "bf16",
                _lora_critic,
                ("critic.engine.model_dtype",),
            ),
        ),
    ),
    Route("lora_r", (), why="written as use_lora's lora_rank"),
    Route(
        "lora_alpha",
        (
            Key(f"{AR}.model.lora_alpha", _c("lora_alpha"), _lora, ("actor.model.lora_alpha",)),
            Key("critic.model.lora_alpha", _c("lora_alpha"), _lora_critic, ("critic.model.lora_alpha",)),
        ),
    ),
    # --- the system: how fast, in how much memory ---
    Route(
        "rollout_batch_size",
        (),
        reads=False,
        why=(
            "verl's V1 trainer submits every prompt of a step to the rollout engine at once "
            "(trainer/ppo/v1/trainer_base.py _next_train_batch, _submit_batch_to_rollout); "
            "data.gen_batch_size is only the dataloader's fetch size, and how many sequences generate "
            "together is vLLM's max_num_seqs within its KV-cache pool"
        ),
    ),
    Route(
        "micro_batch_size",
        (
            Key(
                f"{AR}.actor.ppo_micro_batch_size_per_gpu",
                _c("micro_batch_size"),
                _fixed,
                ("actor.engine.micro_batch_size_per_gpu",),
            ),
            Key(
                f"+{CRITIC_ENGINE}.micro_batch_size_per_gpu",
                _c("micro_batch_size"),
                _fixed_critic,
                ("critic.engine.micro_batch_size_per_gpu",),
            ),
            # read by no V1 worker, but the critic's config check refuses a critic without it unless its own
            # use_dynamic_bsz (the actor's, critic.yaml:43; a switch V1 ignores) is on
            Key(
                "critic.ppo_micro_batch_size_per_gpu",
                _c("micro_batch_size"),
                _fixed_critic,
                why="the critic config check refuses a critic without it (workers/config/critic.py:103-108)",
            ),
        ),
    ),
    Route(
        "log_prob_micro_batch_size",
        (
            Key(
                f"{AR}.rollout.log_prob_micro_batch_size_per_gpu",
                lambda job: job.config.forward_micro_batch_size,
                _fixed,
                ("actor.engine.infer_micro_batch_size_per_gpu",),
            ),
            Key(
                f"{AR}.ref.log_prob_micro_batch_size_per_gpu",
                lambda job: job.config.forward_micro_batch_size,
                _fixed_full_weights_reference,
                ("ref.engine.infer_micro_batch_size_per_gpu",),
            ),
            # with LoRA the reference is the actor with its adapters off, at the actor's forward micro batch
            # (trainer_base.py:1703-1707), but validate_config still asks for the reference's own
            Key(
                f"{AR}.ref.log_prob_micro_batch_size_per_gpu",
                lambda job: job.config.forward_micro_batch_size,
                _fixed_lora_reference,
                why="validate_config refuses a reference policy without it (utils/config.py:169-175)",
            ),
            Key(
                f"+{CRITIC_ENGINE}.infer_micro_batch_size_per_gpu",
                lambda job: job.config.forward_micro_batch_size,
                _fixed_critic,
                ("critic.engine.infer_micro_batch_size_per_gpu",),
            ),
        ),
    ),
    Route(
        "num_rollout_workers",
        (
            Key(
                "data.dataloader_num_workers",
                lambda job: job.worker_count,
                reaches=("data.loader.num_workers",),
            ),
            Key(
                f"{AR}.rollout.agent.num_workers",
                lambda job: agent_workers(job.config, job.worker_count),
                reaches=("agent_loop.num_workers",),
            ),
        ),
    ),
    Route(
        "gradient_checkpointing",
        (
            Key(
                f"{AR}.model.enable_gradient_checkpointing",
                _c("gradient_checkpointing"),
                reaches=("actor.model.enable_gradient_checkpointing",),
            ),
            Key(
                "critic.model.enable_gradient_checkpointing",
                _c("gradient_checkpointing"),
                _critic,
                ("critic.model.enable_gradient_checkpointing",),
            ),
        ),
    ),
    Route(
        "sharding",
        (
            *_sharded(f"{AR}.actor.fsdp_config", always, "actor"),
            *_sharded(f"{AR}.ref.fsdp_config", _full_weights_reference, "ref"),
            *_sharded(CRITIC_ENGINE, _critic, "critic"),
        ),
    ),
    Route("param_offload", _offload("param_offload")),
    Route("optimizer_offload", _offload("optimizer_offload")),
    Route("offload_policy", _offload("offload_policy")),
    # --- verl's own knobs: vLLM's (--engine verl), and dynamic batch size ---
    Route(
        "gpu_memory_utilization",
        (
            Key(
                f"{AR}.rollout.gpu_memory_utilization",
                _e("gpu_memory_utilization"),
                reaches=("rollout.gpu_memory_utilization",),
            ),
        ),
    ),
    Route(
        "tensor_model_parallel_size",
        (
            Key(
                f"{AR}.rollout.tensor_model_parallel_size",
                _e("tensor_model_parallel_size"),
                reaches=("rollout.tensor_model_parallel_size",),
            ),
        ),
    ),
    Route(
        "max_num_seqs",
        (
            Key(
                f"{AR}.rollout.max_num_seqs",
                _e("max_num_seqs"),
                lambda job: job.engine.max_num_seqs is not None,  # else verl's 256 (rollout.yaml)
                ("rollout.max_num_seqs",),
            ),
        ),
    ),
    # The old-log-prob and reference passes take the actor's switch and budget by interpolation
    # (rollout/rollout.yaml:113-117, ref/ref.yaml:20-24): one key each sets every actor-side pass.
    Route(
        "use_dynamic_bsz",
        (
            Key(
                f"{AR}.actor.use_dynamic_bsz",
                _c("use_dynamic_bsz"),
                _dynamic,
                ("actor.engine.use_dynamic_bsz",),
            ),
            # the V1 critic's engine has dynamic batch size on unless told (workers/config/engine.py:100)
            Key(
                f"+{CRITIC_ENGINE}.use_dynamic_bsz",
                _c("use_dynamic_bsz"),
                _critic,
                ("critic.engine.use_dynamic_bsz",),
            ),
        ),
    ),
    Route(
        "ppo_max_token_len_per_gpu",  # the update's budget
        (
            Key(
                f"{AR}.actor.ppo_max_token_len_per_gpu",
                _budget,
                _dynamic,
                ("actor.engine.max_token_len_per_gpu",),
            ),
        ),
    ),
    # The forward passes' budgets, written even where they equal the actor's (which they copy by
    # interpolation otherwise): V1 sets the actor engine's inference budget from the rollout's key and the
    # reference engine's from the reference's (trainer/ppo/v1/trainer_base.py:552-581, 620-626); with LoRA the
    # reference is the actor with its adapters off, at the actor's inference budget.
    Route(
        "log_prob_max_token_len_per_gpu",
        (
            Key(
                f"{AR}.rollout.log_prob_max_token_len_per_gpu",
                _forward_budget,
                _dynamic,
                ("actor.engine.infer_max_token_len_per_gpu",),
            ),
            Key(
                f"{AR}.ref.log_prob_max_token_len_per_gpu",
                _forward_budget,
                _dynamic_full_weights_reference,
                ("ref.engine.infer_max_token_len_per_gpu",),
            ),
        ),
    ),
    # V1 sizes both of the critic engine's budgets by this CriticConfig field, which critic.yaml lacks
    # (trainer/ppo/v1/trainer_base.py:265-268)
    Route(
        "critic_max_token_len_per_gpu",
        (
            Key(
                "+critic.ppo_infer_max_token_len_per_gpu",
                _critic_budget,
                _dynamic_critic,
                ("critic.engine.max_token_len_per_gpu", "critic.engine.infer_max_token_len_per_gpu"),
            ),
        ),
    ),
)

JOB_ROUTES: tuple[Route, ...] = (
    Route(
        "gpus",
        (
            Key(
                "trainer.n_gpus_per_node",
                lambda job: job.gpus // job.nodes,
                reaches=("trainer.resource_pool",),
            ),
            Key("trainer.nnodes", lambda job: job.nodes, reaches=("trainer.resource_pool",)),
        ),
    ),
    Route(
        "model",
        (
            Key(f"{AR}.model.path", lambda job: job.model_path, _model_path, ("actor.model.path",)),
            Key("critic.model.path", lambda job: job.model_path, _critic_model_path, ("critic.model.path",)),
        ),
    ),
    Route(
        "rollout engine",  # the engine verl generates with (mandatory) and its context length
        (
            Key(f"{AR}.rollout.name", _e("name"), reaches=("rollout.name",)),
            Key(f"{AR}.rollout.max_model_len", _e("max_model_len"), reaches=("rollout.max_model_len",)),
        ),
    ),
    Route(
        "training engine",  # FSDP2, gradients reduced as the probe reduced them (no_sync_as_probed)
        (
            Key(f"{AR}.actor.strategy", lambda job: "fsdp2", reaches=("actor.engine.strategy",)),
            Key("critic.strategy", lambda job: "fsdp2", _critic, ("critic.engine.strategy",)),
            Key(
                f"{AR}.actor.fsdp_config.use_no_sync_for_gradient_accumulation",
                no_sync_as_probed,
                reaches=("actor.engine.use_no_sync_for_gradient_accumulation",),
            ),
            Key(
                f"{CRITIC_ENGINE}.use_no_sync_for_gradient_accumulation",
                no_sync_as_probed,
                _critic,
                ("critic.engine.use_no_sync_for_gradient_accumulation",),
            ),
            # the probe's reference computes in bf16; verl loads it in fp32 (engine/fsdp.yaml model_dtype)
            Key(
                f"{AR}.ref.fsdp_config.model_dtype",
                lambda job: "bf16",
                _full_weights_reference,
                ("ref.engine.model_dtype",),
            ),
        ),
    ),
)

# Keys verl 0.9.1 accepts that its V1 sync trainer does not read (or reads otherwise than their names say):
# `autotune check` says so for a file that sets them.
IGNORED_BY_V1: dict[str, str] = {
    "data.gen_batch_size": (
        "read only as the dataloader's fetch size: V1 submits every prompt of a step to the rollout engine "
        "at once, and how many sequences generate together is rollout.max_num_seqs"
    ),
    "critic.forward_micro_batch_size_per_gpu": (
        f"the V1 critic cuts its forward micro-batches by its engine config: {CRITIC_ENGINE}.use_dynamic_bsz "
        f"(on by default) with critic.ppo_infer_max_token_len_per_gpu, or "
        f"+{CRITIC_ENGINE}.infer_micro_batch_size_per_gpu"
    ),
    "critic.use_dynamic_bsz": (
        f"the V1 critic's engine has its own switch, {CRITIC_ENGINE}.use_dynamic_bsz (on by default)"
    ),
    "critic.ppo_max_token_len_per_gpu": (
        "V1 sizes both of the critic engine's token budgets by critic.ppo_infer_max_token_len_per_gpu"
    ),
    "critic.forward_max_token_len_per_gpu": (
        "V1 sizes both of the critic engine's token budgets by critic.ppo_infer_max_token_len_per_gpu"
    ),
}


def route(knob: str) -> Route:
    for found in (*ROUTES, *JOB_ROUTES):
        if found.knob == knob:
            return found
    raise KeyError(knob)


def not_verl_knobs() -> tuple[str, ...]:
    """The configuration's knobs verl has no key for: only autotune's built-in probe has them."""
    return tuple(r.knob for r in ROUTES if not r.reads)


def ignored_keys(values: dict[str, Any]) -> dict[str, str]:
    """Of an override file's keys, those V1 sync accepts but does not read, with why; {} for a file that
    asks for the legacy trainer (trainer.use_v1=false) or another V1 mode, which read them otherwise."""
    if values.get("trainer.use_v1") is False or values.get("trainer.v1.trainer_mode", "sync") != "sync":
        return {}
    return {key: why for key, why in IGNORED_BY_V1.items() if key in values}


assert {r.knob for r in ROUTES} == set(KNOB_NAMES), "every ProbeConfig knob has a route"
