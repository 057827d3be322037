"""autotune reads TRL files as TRL 1.16 reads them: a corpus of trl_config.yaml files, each read by autotune
(TRL's own parser in-process, and the shipped schema's rules that stand in where TRL is not installed) and by
TRL's `trl grpo --config FILE` parser (TrlParser over GRPOScriptArguments, GRPOConfig, ModelConfig and
DatasetMixtureConfig, as trl/cli/commands/training.py calls it). For every file TRL accepts, the values that
decide memory are equal; every file TRL refuses, autotune refuses too, in one line naming the file, the field
and the value. A few files TRL's parser lets through with a value of the wrong type are refused by autotune on
purpose: those are marked."""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import warnings
from unittest import mock

import pytest
import yaml

from autotune.errors import UserError
from autotune.formats.read import read_target
from autotune.formats.trl_read import fields, launch_options, parse_trl
from tests.conftest import REPO

trl = pytest.importorskip("trl")

BASE = {"per_device_train_batch_size": 4, "generation_batch_size": 16, "num_generations": 4}
# (fields over BASE, autotune refuses although TRL's parser accepts)
CORPUS: dict[str, tuple[dict, bool]] = {
    "the export's own fields": (
        {
            "model_name_or_path": "/m",
            "gradient_accumulation_steps": 2,
            "max_completion_length": 16,
            "beta": 0.05,
            "gradient_checkpointing": False,
            "dataloader_num_workers": 1,
            "use_cpu": True,
            "bf16": False,
        },
        False,
    ),
    "quoted int": ({"per_device_train_batch_size": "4"}, False),
    "quoted float": ({"beta": "0.1"}, False),
    "quoted bool yes": ({"gradient_checkpointing": "yes"}, False),
    "quoted bool False": ({"bf16": "False"}, False),
    "bool as 0": ({"use_vllm": "0"}, False),
    "underscored int text": ({"max_completion_length": "1_024"}, False),
    "none text for an optional int": ({"max_completion_length": "none"}, False),
    "null for an optional int": ({"max_completion_length": None}, False),
    "the new checkpointing name": ({"activation_checkpointing": False}, False),
    "both checkpointing names": ({"activation_checkpointing": True, "gradient_checkpointing": False}, False),
    "steps, not the generation batch": ({"generation_batch_size": None, "steps_per_generation": 4}, False),
    "neither generation field": ({"generation_batch_size": None, "gradient_accumulation_steps": 4}, False),
    "vllm colocate": ({"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3}, False),
    "peft": ({"use_peft": "true", "lora_r": "8", "lora_alpha": 16}, False),
    "fp16 turns bf16 off": ({"fp16": True}, False),
    "an accelerate launch option": ({"num_processes": 1}, False),
    "an enum's value": ({"lr_scheduler_type": "cosine"}, False),
    "a list field": ({"report_to": ["none"]}, False),
    "a field TRL lacks": ({"per_device_train_batch_sizex": 4}, False),
    "a field TRL 1.16 removed": ({"max_prompt_length": 512}, False),
    "non-numeric int": ({"per_device_train_batch_size": "four"}, False),
    "float text for an int": ({"gradient_accumulation_steps": "2.0"}, False),
    "not a bool": ({"gradient_checkpointing": "maybe"}, False),
    "both generation fields": ({"steps_per_generation": 2}, False),
    "generation batch not whole micro batches": ({"generation_batch_size": 18}, False),
    "generation batch not whole groups": ({"generation_batch_size": 12, "num_generations": 8}, False),
    "one generation": ({"num_generations": 1, "generation_batch_size": 16}, False),
    "auto_find_batch_size": ({"auto_find_batch_size": True}, False),
    "a bad enum value": ({"lr_scheduler_type": "bogus"}, False),
    "a float for an int": ({"num_generations": 4.0}, True),
    "an int for a bool": ({"bf16": 1}, True),
}
DECIDING = [
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "generation_batch_size",
    "steps_per_generation",
    "max_completion_length",
    "activation_checkpointing",
    "gradient_checkpointing",
    "bf16",
    "fp16",
    "use_cpu",
    "use_vllm",
    "vllm_mode",
    "vllm_gpu_memory_utilization",
    "beta",
    "dataloader_num_workers",
    "use_peft",
    "lora_r",
    "lora_alpha",
    "model_name_or_path",
    "auto_find_batch_size",
]


def file_of(name: str) -> dict:
    data = {**BASE, **CORPUS[name][0]}
    return {key: value for key, value in data.items() if value is not None or key == "max_completion_length"}


def trls_view(path) -> dict | None:
    """What `trl grpo --config path` sets (None: TRL refuses it, or accelerate launch would: a key TRL hands
    it that is not one of its options). bf16 is judged as on a GPU, which this machine may lack."""
    from trl.scripts.grpo import make_parser

    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        parser = make_parser(prog="trl grpo")
        try:
            with mock.patch("transformers.training_args.is_torch_bf16_gpu_available", return_value=True):
                *objects, config_rest, _ = parser.parse_args_and_config(
                    ["--config", str(path)], return_remaining_strings=True, separate_remaining_strings=True
                )
        except (Exception, SystemExit):
            return None
    if any(word.startswith("--") and word[2:] not in launch_options() for word in config_rest):
        return None
    view = {}
    for obj in objects:
        for name in DECIDING:
            if hasattr(obj, name):
                view[name] = getattr(obj, name)
    return view


@pytest.mark.parametrize("use_trl", [True, False], ids=["trl-parser", "schema"])
@pytest.mark.parametrize("name", CORPUS)
def test_trl_configs_read_as_trl_reads_them(tmp_path, name, use_trl):
    data, refused_on_purpose = file_of(name), CORPUS[name][1]
    path = tmp_path / "trl_config.yaml"
    path.write_text(yaml.safe_dump(data))
    trl_view = trls_view(path)
    try:
        values = parse_trl(data, where=str(path), use_trl=use_trl)
    except UserError as exc:
        said = str(exc)
        assert "\n" not in said and str(path) in said
        assert any(f"{key}=" in said for key in data), said  # names a field and its value
        assert trl_view is None or refused_on_purpose, f"TRL accepts {CORPUS[name][0]}: {said}"
        return
    assert trl_view is not None, f"TRL refuses {CORPUS[name][0]}, autotune read it"
    assert not refused_on_purpose
    assert {key: values[key] for key in trl_view} == trl_view


ACCEPTED = [n for n in CORPUS if not n.startswith(("a ", "an ", "non", "not", "both g"))]


@pytest.mark.parametrize("name", ACCEPTED)
def test_what_autotune_checks_is_what_trl_reads(tmp_path, name):
    """The configuration `check` judges carries TRL's values (for the files TRL accepts)."""
    path = tmp_path / "trl_config.yaml"
    path.write_text(yaml.safe_dump(file_of(name)))
    view = trls_view(path)
    if view is None or view["max_completion_length"] is None:
        return
    config = read_target(path).config
    assert config.micro_batch_size == view["per_device_train_batch_size"]
    assert config.gradient_accumulation_steps == view["gradient_accumulation_steps"]
    assert config.rollout_n == view["num_generations"]
    assert config.train_batch_size == view["generation_batch_size"]
    assert config.max_response_length == view["max_completion_length"]
    assert config.kl_coef == view["beta"]
    assert config.gradient_checkpointing == view["activation_checkpointing"]
    assert config.use_lora == view["use_peft"]


def test_the_shipped_schema_is_trls_own_parser():
    tool = runpy.run_path(str(REPO / "tools" / "trl_schema.py"))
    shipped = json.loads((REPO / "autotune" / "formats" / "trl_schema.json").read_text())
    assert shipped == tool["schema"]()
    assert set(DECIDING) <= set(fields())


@pytest.mark.parametrize(
    "text,said",
    [
        ("num_generations: 4\nper_device_train_batch_sizex: 4\n", "per_device_train_batch_sizex=4: Some"),
        (
            "num_generations: 4\nper_device_train_batch_size: four\n",
            "per_device_train_batch_size='four': TRL refuses it: argument --per_device_train_batch_size",
        ),
        (
            "num_generations: 4\ngeneration_batch_size: 16\nsteps_per_generation: 2\n",
            "generation_batch_size=16, steps_per_generation=2: TRL refuses it: 'generation_batch_size' and",
        ),
        (
            "generation_batch_size: 12\nnum_generations: 8\nper_device_train_batch_size: 4\n",
            "generation_batch_size=12, num_generations=8: TRL refuses it: generation_batch_size (12) must be",
        ),
        ("num_generations: 4\nmax_completion_length: null\n", "max_completion_length=None"),
    ],
)
@pytest.mark.parametrize("use_trl", [True, False], ids=["trl-parser", "schema"])
def test_bad_trl_files_are_one_line_naming_the_file_field_and_value(tmp_path, text, said, use_trl):
    path = tmp_path / "trl_config.yaml"
    path.write_text(text)
    parse = mock.patch("autotune.formats.trl_read.trl_importable", return_value=use_trl)
    with parse, pytest.raises(UserError) as caught:
        read_target(path)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"config '{path}': {said}")


@pytest.mark.e2e
def test_check_refuses_a_field_trl_lacks_in_one_line(tmp_path, cli):
    path = tmp_path / "trl_config.yaml"
    path.write_text("per_device_train_batch_size: 4\nnum_generations: 4\nmax_prompt_lenght: 128\n")
    proc = cli("check", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "max_prompt_lenght=128" in lines[0] and str(path) in lines[0]
    assert "Some keys are not used by the HfArgumentParser" in lines[0]


def test_every_problem_trl_refuses_is_named_at_once_in_one_line(tmp_path, capsys):
    """TRL's parser stops at its first refusal; check names them all (fields TRL lacks, values it cannot
    convert), exit 2, no traceback."""
    from autotune.cli import main

    path = tmp_path / "trl_config.yaml"
    path.write_text(
        "num_generations: 4\nper_device_train_batch_sizes: 4\ngradient_accumulation_steps: '2.0'\n"
        "gradient_checkpointing: maybe\n"
    )
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: config '{path}': ")
    for said in (
        "per_device_train_batch_sizes=4: Some keys are not used by the HfArgumentParser",
        "fix: per_device_train_batch_size for per_device_train_batch_sizes?",
        "gradient_accumulation_steps='2.0': TRL refuses it: argument --gradient_accumulation_steps",
        "gradient_checkpointing='maybe': TRL refuses it: argument --gradient_checkpointing",
    ):
        assert said in err, err


def test_a_ppo_study_for_trl_is_one_line_before_anything_runs(tmp_path, capsys):
    from autotune.cli import main

    space = yaml.safe_load((REPO / "search_spaces" / "trl-cpu-tiny.yaml").read_text())
    space.update(algorithm="ppo", rollout_n=1)
    space.pop("seed_configs")
    path = tmp_path / "ppo.yaml"
    path.write_text(yaml.safe_dump(space))
    code = main(["run", "--target", "trl", "--space", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "algorithm=ppo: TRL's GRPOTrainer trains GRPO only (it has no critic" in err
    assert not (tmp_path / "out").exists()
