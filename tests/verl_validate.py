"""verl 0.9.1's own check of an override file, run with verl's Python (`.venv-verl/bin/python`), never with
autotune's: compose the overrides with verl's Hydra configuration and validate them exactly as
`python -m verl.trainer.main_ppo` does before it starts Ray (`trainer/main_ppo.py`: validate_config with
need_reference_policy and need_critic), then build verl's rollout config. One JSON line per case on stdout.

    .venv-verl/bin/python tests/verl_validate.py OVERRIDES_FILE [KEY=VALUE ...]     # one file, by hand
    .venv-verl/bin/python tests/verl_validate.py --cases < cases.json               # what the tests send
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from typing import Any

VLLM_LORA_STEP = (
    "validate_config's last step, vLLM's LoRA rank table (get_vllm_max_lora_rank), imports vLLM, which is "
    "not installed here (its wheels are CUDA builds of another torch); every earlier check passed"
)


def _only_vllm_is_missing(exc: BaseException) -> bool:
    """The failure is validate_config's final LoRA-rank step importing vLLM, not a refusal of the config."""
    frames = traceback.extract_tb(exc.__traceback__)
    in_lora_step = any(
        f.name == "validate_config" and "get_vllm_max_lora_rank" in (f.line or "") for f in frames
    )
    return in_lora_step and "vllm" in f"{type(exc).__name__} {exc}".lower()


def validate(compose, overrides: list[str]) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    out: dict[str, Any] = {"ok": False}
    try:
        config = compose("ppo_trainer", overrides=overrides)
        generative_reward = bool(OmegaConf.select(config, "reward.reward_model.enable"))
        out["missing"] = sorted(
            key
            for key in OmegaConf.missing_keys(config)
            if generative_reward or not key.startswith("reward.reward_model.")  # a part this run does not use
        )
        out["use_reference_policy"] = bool(need_reference_policy(config))
        out["use_critic"] = bool(need_critic(config))
        with contextlib.redirect_stdout(sys.stderr):  # verl prints its verdict; stdout carries the JSON
            try:
                validate_config(
                    config, use_reference_policy=out["use_reference_policy"], use_critic=out["use_critic"]
                )
            except Exception as exc:
                if not _only_vllm_is_missing(exc):
                    raise
                out["not_run"] = VLLM_LORA_STEP
            rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
            out["holding"] = holding(config, out["use_critic"], omega_conf_to_dataclass)
        out["rollout"] = {
            "name": rollout.name,
            "tensor_model_parallel_size": rollout.tensor_model_parallel_size,
            "gpu_memory_utilization": rollout.gpu_memory_utilization,
            "max_model_len": rollout.max_model_len,
        }
        out["short_run"] = {key: _plain(OmegaConf.select(config, key)) for key in SHORT_RUN_KEYS}
        out["verl_knobs"] = verl_knobs(config, rollout, out["use_critic"], omega_conf_to_dataclass)
        out["ok"] = not out["missing"]
    except Exception as exc:  # verl's own refusal, reported to the test
        out["error"] = f"{type(exc).__name__}: {exc}"[-3000:]
    return out


SHORT_RUN_KEYS = (  # what autotune's verl probe sets for a short run (autotune/probe/verl/verl_run.py)
    "trainer.total_training_steps",
    "trainer.total_epochs",
    "trainer.val_before_train",
    "trainer.test_freq",
    "trainer.save_freq",
    "trainer.resume_mode",
    "trainer.logger",
    "actor_rollout_ref.rollout.ignore_eos",
    "data.filter_overlong_prompts",
    "data.train_files",
    "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH",
    "ray_kwargs.ray_init.address",
    "ray_kwargs.ray_init._temp_dir",
    "trainer.v1.sampler.sync_refill_failed_groups",
    "trainer.nnodes",  # and where: one node, or a Ray cluster's (autotune run --ray --nodes)
    "trainer.n_gpus_per_node",
)


def verl_knobs(config, rollout, use_critic: bool, to_dataclass) -> dict[str, Any]:
    """verl's knobs as verl's own config classes read them: vLLM's max_num_seqs, and dynamic batch size with
    its token budgets where the workers take them (engine_workers.py:545-552 remaps the reference's; the V1
    trainer sizes the critic's engine by ppo_infer_max_token_len_per_gpu, trainer_base.py:264-268)."""
    actor = to_dataclass(config.actor_rollout_ref.actor)
    ref = config.actor_rollout_ref.ref
    knobs = {
        "max_num_seqs": rollout.max_num_seqs,
        "actor": [actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu],
        "log_prob": [rollout.log_prob_use_dynamic_bsz, rollout.log_prob_max_token_len_per_gpu],
        "ref": [ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu],
    }
    if use_critic:  # the V1 critic's engine: its own switch, both budgets from one CriticConfig field
        critic = to_dataclass(config.critic)
        knobs["critic"] = [critic.engine.use_dynamic_bsz, critic.ppo_infer_max_token_len_per_gpu]
        knobs["critic_engine"] = critic.ppo_infer_max_token_len_per_gpu
    return knobs


def _plain(value: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


HOLDING_FIELDS = (
    "strategy",
    "fsdp_size",
    "reshard_after_forward",
    "param_offload",
    "optimizer_offload",
    "offload_policy",
    "model_dtype",
    "use_no_sync_for_gradient_accumulation",
)


def holding(config, use_critic: bool, to_dataclass) -> dict[str, dict[str, Any]]:
    """How verl's own config classes (FSDPActorConfig, its critic config, the engine configs) hold each
    trained model's states, after their __post_init__ checks: the strategy reaches the engine config."""
    models = {"actor": to_dataclass(config.actor_rollout_ref.actor).fsdp_config}
    if use_critic:
        critic = to_dataclass(config.critic)
        models["critic"] = getattr(critic, "fsdp_config", None) or critic.fsdp
    return {name: {k: getattr(engine, k, None) for k in HOLDING_FIELDS} for name, engine in models.items()}


def main() -> int:
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    if sys.argv[1:2] == ["--cases"]:
        cases = json.load(sys.stdin)
    else:
        with open(sys.argv[1]) as handle:
            lines = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
        cases = [{"name": sys.argv[1], "overrides": lines + sys.argv[2:]}]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        for case in cases:
            print(json.dumps({"name": case["name"], **validate(compose, case["overrides"])}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
