"""The verl export: prompt/sample arithmetic, verl 0.9.1's rules, and verl's own config accepting the keys.

The composition test needs verl 0.9.1's config files and hydra-core. verl's wheel also installs a top-level
`tests` package that shadows this folder's `tests.conftest` imports, so do NOT `pip install verl` into the
test environment: `./setup.sh test` installs it with its dependencies into its own environment, .venv-verl
(or point VERL_CONFIG_DIR at another copy's `verl/trainer/config`); tests/test_verl_validate.py runs verl's
own validate_config there.
"""

from __future__ import annotations

import dataclasses
import itertools
import runpy

import pytest

from autotune.config.knobs import ProbeConfig
from autotune.config.rules import config_findings
from autotune.formats.verl import (
    AR,
    format_overrides,
    format_value,
    parse_overrides,
    verl_keys,
    verl_overrides,
    verl_rule_violations,
)
from autotune.space.loading import load_space, with_settings
from tests.conftest import REPO

SEED_51 = ProbeConfig(
    rollout_batch_size=128,
    train_batch_size=512,
    micro_batch_size=32,
    gradient_accumulation_steps=4,
    num_rollout_workers=4,
    max_prompt_length=200,
    max_response_length=256,
    use_lora=True,
    lora_r=64,
    lora_alpha=128,
)
# Every key the export writes, as verl 0.9.1 spells it.
EXPORTED_KEYS = (
    "data.train_batch_size",
    "data.gen_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "data.dataloader_num_workers",
    f"{AR}.actor.ppo_mini_batch_size",
    f"{AR}.actor.ppo_micro_batch_size_per_gpu",
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu",
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size_per_gpu",
    f"{AR}.rollout.n",
    f"{AR}.rollout.agent.num_workers",
    f"{AR}.rollout.gpu_memory_utilization",
    f"{AR}.rollout.max_num_seqs",
    f"{AR}.model.enable_gradient_checkpointing",
    f"{AR}.model.lora_rank",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
    "algorithm.adv_estimator",
)


def overrides_for(config: ProbeConfig, gpus: int, path: str | None = None) -> dict:
    return verl_overrides(config, gpus, path).values


# --- the mapping ------------------------------------------------------------------------------------------


def test_seed_51_maps_to_prompts_and_a_global_mini_batch():
    values = overrides_for(SEED_51, 2, "meta-llama/Llama-2-7b-hf")
    # 32 micro × 4 accumulation × 2 GPUs = 256 samples per optimizer step = 256 prompts at n=1
    assert values["data.train_batch_size"] == 512
    assert "data.gen_batch_size" not in values  # verl has no rollout batch: only the dataloader's fetch size
    assert values[f"{AR}.actor.ppo_mini_batch_size"] == 256
    assert values[f"{AR}.actor.ppo_micro_batch_size_per_gpu"] == 32
    assert values["data.dataloader_num_workers"] == 4
    assert values[f"{AR}.model.lora_rank"] == 64
    assert values["algorithm.adv_estimator"] == "gae"
    assert values["critic.ppo_micro_batch_size_per_gpu"] == 32
    assert values["trainer.n_gpus_per_node"] == 2 and values["trainer.nnodes"] == 1
    assert verl_rule_violations(values, 2) == []


def test_rollout_n_divides_the_global_sizes_and_verl_multiplies_back():
    config = dataclasses.replace(
        SEED_51, algorithm="grpo", rollout_n=4, use_lora=False, log_prob_micro_batch_size=64
    )
    values = overrides_for(config, 2)
    n = values[f"{AR}.rollout.n"]
    assert n == 4
    assert values["data.train_batch_size"] * n == config.train_batch_size
    # verl's ray_trainer: mini batch in samples = ppo_mini_batch_size × n; per GPU it is split by the GPUs,
    # then into micro batches: exactly the probe's g micro-batches of m per GPU.
    mini_samples = values[f"{AR}.actor.ppo_mini_batch_size"] * n
    assert mini_samples == config.micro_batch_size * config.gradient_accumulation_steps * 2
    assert mini_samples // 2 // values[f"{AR}.actor.ppo_micro_batch_size_per_gpu"] == 4
    assert values[f"{AR}.rollout.log_prob_micro_batch_size_per_gpu"] == 64
    assert values["algorithm.adv_estimator"] == "grpo"
    assert not any(key.startswith("critic.") for key in values)  # GRPO has no critic
    assert f"{AR}.model.lora_rank" not in values
    assert verl_rule_violations(values, 2) == []


def test_a_mini_batch_of_a_fraction_of_a_prompt_is_rounded_up_with_a_note():
    # n=3: 1 micro × 1 step × 1 GPU = 1 sample = 1/3 prompt; verl needs whole prompts: lcm(1, 3) = 3 samples
    config = ProbeConfig(
        rollout_batch_size=6,
        train_batch_size=12,
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        algorithm="grpo",
        rollout_n=3,
    )
    assert config_findings(config, 1, cores=8) == []
    export = verl_overrides(config, 1)
    assert export.values[f"{AR}.actor.ppo_mini_batch_size"] == 1
    assert any("not a whole number of prompts" in note for note in export.notes)
    assert verl_rule_violations(export.values, 1) == []


def test_agent_workers_divide_the_step():
    config = ProbeConfig(rollout_batch_size=8, train_batch_size=16, num_rollout_workers=3)
    export = verl_overrides(config, 1)
    assert export.values["data.dataloader_num_workers"] == 3
    assert export.values[f"{AR}.rollout.agent.num_workers"] == 2
    assert any("agent.num_workers=2" in note for note in export.notes)


@pytest.mark.parametrize("gpus,rollout_n", [(1, 1), (2, 1), (2, 2), (3, 2), (4, 4), (8, 1), (8, 5)])
def test_every_config_of_a_space_exports_within_verls_rules(gpus, rollout_n):
    algorithm = "grpo" if rollout_n > 1 else "ppo"
    base = load_space("seed-2xa100-80g-7b-lora")
    batches = {"train_batch_size": {"min": 128, "max": 2048}, "mini_batch_size": {"min": 16, "max": 1024}}
    space = with_settings(
        base,
        gpus=gpus,
        rollout_n=rollout_n,
        algorithm=algorithm,
        tune=list(batches),  # the recipe's batches too: every train and mini batch the space allows
        knobs={**base.raw["knobs"], **batches},
    )
    configs = list(itertools.islice(space.iter_grid(), 3000))
    assert configs
    for config in configs:
        assert config_findings(config, gpus, cores=64) == []
        assert verl_rule_violations(overrides_for(config, gpus), gpus) == [], config


def test_an_invalid_config_is_refused():
    with pytest.raises(ValueError, match="train_batch_size=512 is not a multiple"):
        verl_overrides(SEED_51, 8)  # 32 × 4 × 8 GPUs = 1024 samples per optimizer step > 512


def test_overrides_round_trip_through_the_text_file():
    values = overrides_for(SEED_51, 2, "/data/my models/llama 7b")
    text = format_overrides(values)
    assert text.count("\n") == len(values)
    assert "actor_rollout_ref.model.path='/data/my models/llama 7b'" in text
    assert parse_overrides(text) == values
    assert format_value(True) == "true" and format_value(None) == "null" and format_value(8) == "8"


# --- verl's rules, broken one at a time ------------------------------------------------------------------


GOOD = overrides_for(
    ProbeConfig(
        rollout_batch_size=16,
        train_batch_size=64,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        num_rollout_workers=2,
        log_prob_micro_batch_size=8,
        algorithm="grpo",
        rollout_n=2,
    ),
    4,
)


def test_the_good_case_passes():
    assert GOOD[f"{AR}.actor.ppo_mini_batch_size"] == 16  # 4 × 2 × 4 GPUs = 32 samples = 16 prompts
    assert verl_rule_violations(GOOD, 4) == []


@pytest.mark.parametrize(
    "changes,gpus,expected",
    [
        (
            {"data.train_batch_size": 31},
            4,
            "data.train_batch_size×rollout.n=31×2=62: must be divisible by the 4",
        ),
        ({"data.train_batch_size": 8}, 4, "ppo_mini_batch_size=16: must be <= data.train_batch_size=8"),
        (
            {f"{AR}.actor.ppo_mini_batch_size": 12},
            4,
            "ppo_mini_batch_size=12: must divide data.train_batch_size=32",
        ),
        (
            {f"{AR}.actor.ppo_mini_batch_size": 1},
            4,
            "ppo_mini_batch_size×rollout.n=1×2=2: must be divisible by",
        ),
        (
            {f"{AR}.actor.ppo_micro_batch_size_per_gpu": 3},
            4,
            "ppo_micro_batch_size_per_gpu=3: must divide the per-GPU mini batch",
        ),
        (
            {f"{AR}.ref.log_prob_micro_batch_size_per_gpu": 32},
            4,
            "log_prob_micro_batch_size_per_gpu=32: must divide the per-GPU share",
        ),
        (
            {f"{AR}.rollout.log_prob_micro_batch_size_per_gpu": None},
            4,
            "log_prob_micro_batch_size_per_gpu: not set",
        ),
        ({f"{AR}.rollout.agent.num_workers": 5}, 4, "agent.num_workers=5: must divide B×n=64"),
        ({"data.gen_batch_size": 12}, 4, "data.gen_batch_size=12: must divide data.train_batch_size=32"),
        (
            {f"{AR}.rollout.tensor_model_parallel_size": 3},
            4,
            "tensor_model_parallel_size=3: must divide the 4 GPUs",
        ),
        ({f"{AR}.model.lora_rank": 1024}, 4, "lora_rank=1024: vLLM allows at most 512"),
        ({f"{AR}.rollout.n": 1, "data.train_batch_size": 64}, 4, "GRPO needs >= 2 samples per prompt"),
        ({}, 8, "trainer.n_gpus_per_node×trainer.nnodes=4×1: must equal the 8 GPUs"),
        (
            {f"{AR}.actor.ppo_micro_batch_size_per_gpu": 0},
            4,
            "ppo_micro_batch_size_per_gpu=0: must be a whole number",
        ),
        ({"algorithm.adv_estimator": "gae"}, 4, "critic.ppo_micro_batch_size_per_gpu: not set"),
    ],
)
def test_each_broken_rule_is_named(changes, gpus, expected):
    problems = verl_rule_violations({**GOOD, **changes}, gpus)
    assert any(expected in problem for problem in problems), problems


def test_dynamic_batch_size_lifts_the_micro_batch_requirement():
    values = {k: v for k, v in GOOD.items() if "micro_batch_size_per_gpu" not in k}
    assert any("not set" in p for p in verl_rule_violations(values, 4))
    values[f"{AR}.actor.use_dynamic_bsz"] = True
    assert verl_rule_violations(values, 4) == []


def test_verls_default_agent_workers_count_when_not_overridden():
    values = {k: v for k, v in GOOD.items() if k != f"{AR}.rollout.agent.num_workers"}
    values["data.train_batch_size"] = 4  # 4 prompts × 2 = 8 samples: verl's default 8 workers divide it
    values[f"{AR}.actor.ppo_mini_batch_size"] = 4
    values["data.gen_batch_size"] = 4
    assert not any("agent.num_workers" in p for p in verl_rule_violations(values, 4))
    values["data.train_batch_size"] = values[f"{AR}.actor.ppo_mini_batch_size"] = 2
    values["data.gen_batch_size"] = 2
    assert any("agent.num_workers=8" in p for p in verl_rule_violations(values, 4))


# --- verl's own configuration ------------------------------------------------------------------------------


@pytest.fixture
def compose(verl_compose):
    return verl_compose


def test_the_shipped_key_list_is_verls_own_config(compose):
    """`autotune check` flags override keys verl lacks, from a list shipped with autotune (verl is never
    imported): the list must be exactly the keys of verl 0.9.1's composed config."""
    tool = runpy.run_path(str(REPO / "tools" / "verl_keys.py"))
    assert sorted(verl_keys()) == tool["keys_of"](compose([]))


def test_verls_struct_config_rejects_an_unknown_key(compose):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpux=4"])


def test_every_design_key_exists_in_verls_config(compose):
    from omegaconf import OmegaConf

    config = compose([])
    for key in EXPORTED_KEYS:
        parent, leaf = key.rsplit(".", 1)
        assert leaf in OmegaConf.select(config, parent), key


@pytest.mark.parametrize(
    "config,gpus,path",
    [
        (SEED_51, 2, "meta-llama/Llama-2-7b-hf"),
        (
            dataclasses.replace(
                SEED_51,
                algorithm="grpo",
                rollout_n=4,
                use_lora=False,
                gradient_checkpointing=True,
                log_prob_micro_batch_size=64,
                num_rollout_workers=3,
                gradient_accumulation_steps=1,  # 32 × 1 × 8 GPUs = 256 samples = 64 prompts
            ),
            8,
            "/models/my qwen",
        ),
        (
            ProbeConfig(
                rollout_batch_size=6,
                train_batch_size=12,
                micro_batch_size=1,
                gradient_accumulation_steps=1,
                algorithm="grpo",
                rollout_n=3,
            ),
            1,
            None,
        ),
    ],
)
def test_overrides_compose_with_verls_config(compose, config, gpus, path):
    from omegaconf import OmegaConf

    values = overrides_for(config, gpus, path)
    lines = format_overrides(values).splitlines()
    composed = compose(lines)
    for key, value in values.items():
        assert OmegaConf.select(composed, key.removeprefix("+")) == value, key
    assert verl_rule_violations(values, gpus) == []
    # verl's validate_config reads these exactly as written (n_gpus = n_gpus_per_node × nnodes)
    assert composed.trainer.n_gpus_per_node * composed.trainer.nnodes == gpus
    assert composed.actor_rollout_ref.actor.use_dynamic_bsz is False
