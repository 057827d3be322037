"""The TRL export against TRL 1.16's own GRPOConfig: every export passes its checks and carries the recipe."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import yaml
from trl import GRPOConfig

from autotune.config.knobs import ProbeConfig
from autotune.errors import UserError
from autotune.formats.read import read_target
from autotune.formats.trl import ROUTES, not_trl_knobs, trl_config_text, trl_fields, trl_findings

BASE = ProbeConfig(
    algorithm="grpo",
    rollout_n=4,
    train_batch_size=16,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    max_prompt_length=32,
    max_response_length=16,
)


def exports() -> list[ProbeConfig]:
    """Micro batches with the accumulation that keeps the mini batch, train batches of 1-2 rounds of steps,
    group sizes, LoRA or not, checkpointing, KL on or off."""
    configs = []
    for micro, train, n, lora, checkpointing, kl in itertools.product(
        (1, 2, 8), (8, 16), (2, 4), (False, True), (False, True), (0.0, 0.05)
    ):
        configs.append(
            dataclasses.replace(
                BASE,
                micro_batch_size=micro,
                gradient_accumulation_steps=max(1, 8 // micro),
                train_batch_size=train,
                rollout_n=n,
                use_lora=lora,
                gradient_checkpointing=checkpointing,
                kl_coef=kl,
            )
        )
    return [c for c in configs if not trl_findings(c, 1)]


def grpo_config(config: ProbeConfig, tmp_path) -> GRPOConfig:
    return GRPOConfig(**trl_fields(config).grpo, output_dir=str(tmp_path), use_cpu=True, bf16=False)


def test_the_export_names_checkpointing_as_trl_reads_it_without_a_deprecation_warning(tmp_path):
    """TRL 1.16's GRPOConfig keeps `gradient_checkpointing` (default true), which transformers 5.24+ reads as
    a deprecated alias with a FutureWarning; the export's field is the current one, and it decides."""
    import warnings

    for on in (True, False):
        fields = trl_fields(dataclasses.replace(BASE, gradient_checkpointing=on)).grpo
        assert "gradient_checkpointing" not in fields
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            args = grpo_config(dataclasses.replace(BASE, gradient_checkpointing=on), tmp_path)
        assert args.activation_checkpointing is on and args.gradient_checkpointing is on
    with pytest.warns(FutureWarning, match="gradient_checkpointing"):  # TRL's own default still warns
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)


def test_vllm_colocation_is_written_only_with_a_share_and_grpo_config_takes_it(tmp_path):
    assert not {"use_vllm", "vllm_mode", "vllm_gpu_memory_utilization"} & set(trl_fields(BASE).grpo)
    args = grpo_config(dataclasses.replace(BASE, gpu_memory_utilization=0.45), tmp_path)
    assert (args.use_vllm, args.vllm_mode, args.vllm_gpu_memory_utilization) == (True, "colocate", 0.45)
    assert not grpo_config(BASE, tmp_path).use_vllm  # TRL's default: transformers' generate


def test_trl_has_no_liger_grpo_loss_and_deprecates_its_kernel_flag():
    """Why the Liger knob is not searched (formats/trl.py NOT_SEARCHED): TRL 1.16's GRPOConfig has no Liger
    loss field, and GRPOTrainer warns that use_liger_kernel is deprecated."""
    import inspect

    from trl import GRPOTrainer

    from autotune.formats.trl import NOT_SEARCHED

    assert "use_liger_loss" not in {f.name for f in dataclasses.fields(GRPOConfig)}
    assert "use_liger_kernel" in {f.name for f in dataclasses.fields(GRPOConfig)}
    assert "`use_liger_kernel=True` is deprecated" in inspect.getsource(GRPOTrainer.__init__)
    assert set(NOT_SEARCHED) == {"use_liger_kernel", "steps_per_generation"}


def test_grpo_config_accepts_every_export_and_derives_the_recipe(tmp_path):
    configs = exports()
    assert len(configs) >= 40
    for config in configs:
        args = grpo_config(config, tmp_path)  # __post_init__ runs TRL's checks
        mini = config.micro_batch_size * config.gradient_accumulation_steps
        assert args.generation_batch_size == config.train_batch_size
        # one generation round feeds train/mini optimizer steps, each of `mini` completions
        assert args.steps_per_generation * config.micro_batch_size == config.train_batch_size
        assert args.per_device_train_batch_size * args.gradient_accumulation_steps == mini
        assert args.num_generations == config.rollout_n
        assert args.max_completion_length == config.max_response_length
        assert args.beta == config.kl_coef


def test_what_grpo_config_refuses_is_refused_first(tmp_path):
    """A train batch that is not whole micro batches: TRL's own check raises, and autotune's finding first."""
    bad = dataclasses.replace(BASE, train_batch_size=6, micro_batch_size=4)
    assert any(f.key == "train_batch_size" for f in trl_findings(bad, 1))
    with pytest.raises(ValueError):
        grpo_config(bad, tmp_path)
    assert [f.key for f in trl_findings(dataclasses.replace(BASE, algorithm="ppo"), 1)] == ["algorithm"]
    assert [f.key for f in trl_findings(dataclasses.replace(BASE, rollout_n=1), 1)] == ["rollout_n"]


def test_a_knob_trl_does_not_read_changes_nothing_in_the_export():
    changes = {
        "rollout_batch_size": 4,
        "log_prob_micro_batch_size": 16,
        "max_prompt_length": 512,
    }
    assert set(changes) <= set(not_trl_knobs())
    for knob, value in changes.items():
        assert trl_fields(dataclasses.replace(BASE, **{knob: value})) == trl_fields(BASE), knob


def test_every_written_field_has_a_route_and_every_route_that_reads_is_written():
    everything = dataclasses.replace(BASE, use_lora=True, gpu_memory_utilization=0.4)
    written = {**trl_fields(everything).grpo, **trl_fields(everything).peft}
    routed = {name for route in ROUTES for name in route.fields}
    assert set(written) == routed


def test_trl_config_reads_back_as_the_same_configuration(tmp_path):
    config = dataclasses.replace(BASE, use_lora=True, lora_r=8, lora_alpha=16, num_rollout_workers=2)
    path = tmp_path / "trl_config.yaml"
    path.write_text(trl_config_text(config, 2, "/models/qwen", "cuda"))
    data = yaml.safe_load(path.read_text())
    assert data["model_name_or_path"] == "/models/qwen" and "use_cpu" not in data
    target = read_target(path)
    assert target.kind == "TRL config" and target.gpus == 2 and target.model == "/models/qwen"
    for route in ROUTES:
        if route.reads:
            assert getattr(target.config, route.knob) == getattr(config, route.knob), route.knob
    assert not [f for f in target.findings if f.severity == "problem"]


def test_a_trl_config_without_its_generation_batch_gets_the_one_grpo_config_derives(tmp_path):
    path = tmp_path / "trl_config.yaml"  # GRPOConfig: micro x processes x steps (= accumulation steps)
    path.write_text("per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\nnum_generations: 4\n")
    assert read_target(path).config.train_batch_size == 8
    assert read_target(path, gpus=2).config.train_batch_size == 16


VARIANTS = {  # one change of each knob TRL reads, from BASE
    "train_batch_size": 32,
    "micro_batch_size": 2,
    "gradient_accumulation_steps": 1,
    "rollout_n": 2,
    "max_response_length": 8,
    "kl_coef": 0.0,
    "gradient_checkpointing": False,
    "num_rollout_workers": 2,
    "use_lora": True,
}


def trainer_digest(config: ProbeConfig, model_folder, tmp_path) -> dict:
    """What TRL's GRPOTrainer is built with from the export's fields: its arguments after their checks, its
    sampler's group, the reference model, the policy's checkpointing and adapters, its prompt loader."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer, ModelConfig, get_peft_config

    fields = trl_fields(config)
    trainer = GRPOTrainer(
        model=str(model_folder),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=GRPOConfig(**fields.grpo, output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none"),
        train_dataset=Dataset.from_dict({"prompt": ["a b c"] * 64}),
        processing_class=AutoTokenizer.from_pretrained(model_folder),
        peft_config=get_peft_config(ModelConfig(**fields.peft)) if fields.peft else None,
    )
    loader = trainer.get_train_dataloader()
    peft = getattr(trainer.model, "peft_config", {}).get("default")
    return {
        "micro": trainer.args.per_device_train_batch_size,
        "accumulation": trainer.args.gradient_accumulation_steps,
        "generation_batch": trainer.args.generation_batch_size,
        "steps_per_generation": trainer.args.steps_per_generation,
        "group": trainer.num_generations,
        "completion": trainer.max_completion_length,
        "beta": trainer.beta,
        "reference": trainer.ref_model is not None,
        # transformers 5 resolves the field to activation_checkpointing, which Trainer.train applies
        "checkpointing": trainer.args.activation_checkpointing,
        "workers": loader.num_workers,
        "lora": None if peft is None else (peft.r, peft.lora_alpha),
    }


@pytest.mark.e2e  # builds a dozen GRPOTrainers (seconds each)
def test_every_knob_trl_reads_changes_the_trainer_trl_builds(tmp_path):
    """The mutation test: each written field, changed through its knob, changes what TRL built."""
    from autotune.models.catalog import build_causal_lm, resolve_model
    from autotune.models.tokenizer import load_tokenizer

    folder = tmp_path / "model"
    spec = resolve_model("tiny-llama")
    build_causal_lm(spec, dtype="float32").save_pretrained(folder)
    load_tokenizer(spec).save_pretrained(folder)
    base = trainer_digest(BASE, folder, tmp_path)
    assert base["reference"] and base["checkpointing"] and base["lora"] is None
    for knob, value in VARIANTS.items():
        changed = trainer_digest(dataclasses.replace(BASE, **{knob: value}), folder, tmp_path)
        assert changed != base, f"{knob}={value} left TRL's trainer unchanged"
    lora = trainer_digest(dataclasses.replace(BASE, use_lora=True, lora_r=4, lora_alpha=8), folder, tmp_path)
    assert lora["lora"] == (4, 8) and not lora["reference"]  # TRL's reference is the base without adapters
    # vLLM's share: proved on CUDA by the test below
    proved = {*VARIANTS, "lora_r", "lora_alpha", "gpu_memory_utilization"}
    assert proved == {r.knob for r in ROUTES if r.reads}


@pytest.mark.e2e  # vLLM colocated in GRPOTrainer: a CUDA machine with vLLM installed
def test_vllms_share_changes_the_generator_trl_builds(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("TRL's vLLM colocation needs CUDA")
    pytest.importorskip("vllm")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from autotune.models.catalog import build_causal_lm, resolve_model
    from autotune.models.tokenizer import load_tokenizer

    folder = tmp_path / "model"
    spec = resolve_model("tiny-llama")
    build_causal_lm(spec, dtype="bfloat16").save_pretrained(folder)
    load_tokenizer(spec).save_pretrained(folder)
    config = dataclasses.replace(BASE, gpu_memory_utilization=0.2)
    trainer = GRPOTrainer(
        model=str(folder),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=GRPOConfig(**trl_fields(config).grpo, output_dir=str(tmp_path), report_to="none"),
        train_dataset=Dataset.from_dict({"prompt": ["a b c"] * 64}),
        processing_class=AutoTokenizer.from_pretrained(folder),
    )
    assert trainer.use_vllm and trainer.vllm_generation.mode == "colocate"
    assert trainer.vllm_generation.gpu_memory_utilization == 0.2


def test_a_minimal_trl_config_is_checked_with_trls_defaults(tmp_path):
    """Fields a user leaves out are TRL's defaults (no loader workers: 0 is valid); no rollout-batch warning,
    which is about a knob TRL does not have."""
    from autotune.check import CheckOptions, check

    path = tmp_path / "trl_config.yaml"
    path.write_text("generation_batch_size: 16\nnum_generations: 4\nmax_completion_length: 64\n")
    result = check(CheckOptions(path, model="tiny-llama"))
    assert result.target.config.micro_batch_size == 8 and result.target.config.num_rollout_workers == 0
    assert result.target.config.rollout_batch_size == 16  # a round generates at once
    assert not result.problems, [f.line for f in result.problems]
    assert not [f for f in result.findings if f.check == "rollout"]


def test_a_trl_space_with_verls_dynamic_batch_size_is_one_line():
    """TRL pads fixed micro batches: a token budget in a TRL study would be searched and never exported."""
    import copy

    from autotune.space.loading import load_space, space_from_dict
    from autotune.trainers.trl.space_check import check_trl_space

    space = load_space("trl-cpu-tiny")
    raw = copy.deepcopy(dict(space.raw))
    raw["knobs"] |= {"use_dynamic_bsz": {"choices": [False, True]}, "ppo_max_token_len_per_gpu": 4096}
    dynamic = space_from_dict(raw, source="dynamic.yaml", cores=space.cores, name="dynamic")
    with pytest.raises(
        UserError, match=r"dynamic.yaml: knobs use_dynamic_bsz, ppo_max_token_len_per_gpu .*TRL"
    ):
        check_trl_space(dynamic)
    check_trl_space(space)  # the shipped TRL space has none


def test_a_study_export_carries_its_measurement_and_prompt_length_for_check(tmp_path):
    """trl_config.yaml's header holds the study's figures (comments TRL skips); check reads them back."""
    measured = {
        "peak_memory_bytes": 1_100_000_000,
        "device": "cpu",
        "gpus": 1,
        "gpu": None,
        "budget_gib": 1.3,
        "headroom": 0.1,
        "samples_per_sec": 2.5,
        "study_name": "s",
        "trial_number": 3,
    }
    config = dataclasses.replace(BASE, max_prompt_length=64)
    path = tmp_path / "trl_config.yaml"
    path.write_text(trl_config_text(config, 1, "/m", "cpu", measured))
    target = read_target(path)
    assert target.measured is not None and target.measured.peak_bytes == 1_100_000_000
    assert target.measured.device == "cpu" and target.device == "cpu"
    assert target.config.max_prompt_length == 64 and target.prompt_known
    assert not [f for f in target.findings if f.check == "schema"]  # gradient_accumulation_steps is TRL's
    bare = tmp_path / "bare.yaml"
    bare.write_text("per_device_train_batch_size: 4\nnum_generations: 4\ngradient_accumulation_steps: 2\n")
    target = read_target(bare)
    assert target.measured is None and not target.prompt_known and target.device is None
    assert [f.key for f in target.findings if f.check == "lengths"] == ["max_prompt_length"]


@pytest.mark.parametrize(
    "fields,share",
    [
        ({"use_vllm": True, "vllm_gpu_memory_utilization": 0.4}, 0.4),
        ({"use_vllm": True, "vllm_mode": "server"}, None),  # vLLM on other GPUs: not this process's memory
        ({"vllm_gpu_memory_utilization": 0.4}, None),  # no vLLM without use_vllm
    ],
)
def test_trls_vllm_fields_read_back_as_the_share(tmp_path, fields, share):
    path = tmp_path / "trl_config.yaml"
    path.write_text(yaml.safe_dump({"per_device_train_batch_size": 4, "num_generations": 4, **fields}))
    assert read_target(path).config.gpu_memory_utilization == share


def test_vllm_is_refused_for_trl_on_cpu_and_its_other_knobs_for_trl_anywhere():
    from autotune.trainers.registry import engine_named

    trl, builtin = engine_named("trl"), engine_named("builtin")
    share = dataclasses.replace(BASE, gpu_memory_utilization=0.4)
    assert trl.knob_findings(share, "cuda") == [] and trl.knob_findings(share) == []
    assert [f.key for f in trl.knob_findings(share, "cpu")] == ["gpu_memory_utilization"]
    assert [f.key for f in builtin.knob_findings(share, "cuda")] == ["gpu_memory_utilization"]
    seqs = dataclasses.replace(BASE, max_num_seqs=64)
    assert [f.key for f in trl.knob_findings(seqs, "cuda")] == ["max_num_seqs"]


def test_a_trl_space_may_tune_the_generation_batch_and_each_is_exported_as_trl_reads_it(tmp_path):
    """generation_batch_size is the train batch, part of the recipe: searched only when `tune:` names it."""
    import copy

    from autotune.space.loading import load_space, space_from_dict
    from autotune.trainers.trl.space_check import check_trl_space

    space = load_space("trl-cpu-budget")
    raw = copy.deepcopy(dict(space.raw))
    raw["knobs"]["train_batch_size"] = {"min": 16, "max": 32}
    raw["tune"] = ["train_batch_size"]
    tuned = space_from_dict(raw, source="tuned.yaml", cores=space.cores, name="tuned")
    check_trl_space(tuned)
    rounds = {c.train_batch_size: c for c in tuned.grid()}
    assert set(rounds) == {16, 32} and tuned.tune == ("train_batch_size",)
    for train, config in rounds.items():
        args = grpo_config(config, tmp_path)
        assert args.generation_batch_size == train
        assert args.steps_per_generation == train // config.micro_batch_size
