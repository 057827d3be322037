"""Each file format's reader gives back what its writer wrote: the same config, field by field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.config.knobs import ProbeConfig
from autotune.errors import UserError
from autotune.formats.read import read_target
from autotune.formats.seed_yaml import seed_document, seed_yaml
from autotune.formats.verl import format_overrides, read_overrides, verl_overrides

PPO = ProbeConfig(
    rollout_batch_size=64,
    train_batch_size=256,
    micro_batch_size=8,
    gradient_accumulation_steps=4,
    num_rollout_workers=3,
    max_prompt_length=96,
    max_response_length=128,
)
CONFIGS = {
    "ppo": PPO,
    "ppo, forward micro 16, checkpointing": dataclasses.replace(
        PPO, log_prob_micro_batch_size=16, gradient_checkpointing=True
    ),
    "ppo lora r32": dataclasses.replace(PPO, use_lora=True, lora_r=32, lora_alpha=64),
    "grpo n4 lora": dataclasses.replace(
        PPO,
        algorithm="grpo",
        rollout_n=4,
        rollout_batch_size=128,
        train_batch_size=512,
        use_lora=True,
        lora_r=16,
        lora_alpha=32,
        log_prob_micro_batch_size=4,
    ),
}


def assert_same_fields(read: ProbeConfig | None, written: ProbeConfig) -> None:
    assert read is not None
    differ = {
        f.name: (getattr(read, f.name), getattr(written, f.name))
        for f in dataclasses.fields(ProbeConfig)
        if getattr(read, f.name) != getattr(written, f.name)
    }
    assert differ == {}, f"read back differently (read, written): {differ}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_best_config_yaml_reads_back_as_the_same_config(name: str, tmp_path: Path):
    config = CONFIGS[name]
    measured = {"samples_per_sec": 3.25, "gpus": 2, "budget_gib": 40.0}
    path = tmp_path / "best_config.yaml"
    path.write_text(
        seed_yaml(seed_document(config, "llama-2-7b", "deberta-v3-large", measured, gpus=2), "# header\n")
    )
    target = read_target(path)
    assert target.kind == "seed schema" and target.findings == []
    assert_same_fields(target.config, config)
    assert (target.model, target.reward_model) == (
        "meta-llama/Llama-2-7b-hf",
        "OpenAssistant/reward-model-deberta-v3-large",
    )
    assert (target.gpus, target.memory_gib) == (2, 40.0)


def _seed_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "rollout_batch_size: 64\ntrain_batch_size: 256\nmicro_batch_size: 8\nmax_prompt_length: 96\n"
        "max_response_length: 128\n" + text
    )
    return path


def test_best_config_yaml_names_the_mini_batch_as_the_spaces_do(tmp_path: Path):
    document = seed_document(PPO, "llama-2-7b", "function", {"gpus": 2}, gpus=2)
    assert (document["mini_batch_size"], document["gradient_accumulation_steps"]) == (64, 4)  # 8 × 4 × 2


def test_a_seed_file_may_give_the_mini_batch_instead_of_the_steps(tmp_path: Path):
    target = read_target(_seed_file(tmp_path, "mini_batch_size: 64\n"), gpus=2)
    assert target.config is not None and target.config.gradient_accumulation_steps == 4
    assert target.findings == []
    with pytest.raises(UserError, match="mini_batch_size=60: not whole micro-batches"):
        read_target(_seed_file(tmp_path, "mini_batch_size: 60\n"), gpus=2)
    with pytest.raises(UserError, match="mini_batch_size \\(or gradient_accumulation_steps\\): missing"):
        read_target(_seed_file(tmp_path, ""))


def test_steps_that_disagree_with_the_mini_batch_are_a_problem_on_the_files_gpus(tmp_path: Path):
    text = "mini_batch_size: 64\ngradient_accumulation_steps: 4\nmeasured: {gpus: 2}\n"
    assert read_target(_seed_file(tmp_path, text)).findings == []  # 8 × 4 × 2
    (mismatch,) = read_target(_seed_file(tmp_path, text), gpus=4).findings  # another GPU count
    assert mismatch.severity == "note" and "checked as 2" in mismatch.problem
    (wrong,) = read_target(_seed_file(tmp_path, text.replace("steps: 4", "steps: 3"))).findings
    assert wrong.severity == "problem" and wrong.fix.startswith("gradient_accumulation_steps: 4")


@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_verl_overrides_read_back_as_the_same_config(name: str, gpus: int, tmp_path: Path):
    """verl counts prompts and holds the mini batch (m·g·W/n), not g: the reader turns both back. verl has
    no rollout batch (a step's prompts generate together): it reads back as the train batch."""
    config = CONFIGS[name]
    path = tmp_path / "verl_overrides.txt"
    path.write_text(format_overrides(verl_overrides(config, gpus, model_path="Qwen/Qwen2.5-7B").values))
    target = read_target(path)
    assert (target.kind, target.gpus, target.model) == ("verl overrides", gpus, "Qwen/Qwen2.5-7B")
    assert_same_fields(target.config, dataclasses.replace(config, rollout_batch_size=config.train_batch_size))


def test_a_forward_micro_batch_equal_to_the_micro_batch_reads_back_as_unset():
    """verl always names the forward micro batch; autotune's `None` means "the same as micro"."""
    config = dataclasses.replace(PPO, log_prob_micro_batch_size=PPO.micro_batch_size)
    read = read_overrides(format_overrides(verl_overrides(config, 1).values)).config
    assert read is not None and read.log_prob_micro_batch_size is None
    assert read.forward_micro_batch_size == config.forward_micro_batch_size
