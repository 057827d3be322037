"""The trainer registry is the one place trainer names are compared: every other module asks a `Trainer` or
a `ProbeEngine` what it does (docs/design.md, "Trainers and engines")."""

from __future__ import annotations

import re

import pytest

from autotune.config.passes import Passes
from autotune.trainers.base import ProbeEngine, Trainer
from autotune.trainers.registry import (
    DEFAULT_TRAINER,
    ENGINES,
    TRAINERS,
    engine_named,
    trainer_named,
)
from tests.test_architecture import PACKAGE

NAME_COMPARISON = re.compile(r"""[=!]= *["'](verl|trl|builtin)["']|["'](verl|trl|builtin)["'] *[=!]=""")


def test_no_module_compares_trainer_or_engine_names_outside_the_registry():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "registry.py" or path.parent.name != "trainers"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if NAME_COMPARISON.search(line)
    ]
    assert found == [], "ask the trainer or engine object instead:\n" + "\n".join(found)


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_each_trainer_is_found_by_its_name_and_names_its_own_files(name):
    trainer = trainer_named(name)
    assert isinstance(trainer, Trainer) and trainer.name == name
    assert trainer.export_file and trainer.file_kind and isinstance(trainer.passes, Passes)
    assert set(trainer.unread_knobs()) and set(trainer.defaults())


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_each_engine_is_found_by_its_name_and_runs_its_own_trainer(name):
    engine = engine_named(name)
    assert isinstance(engine, ProbeEngine) and engine.name == name
    if engine.trainer is not None:  # a trainer's own probe prices the trainer's own passes
        assert engine.trainer.name == name
        assert engine.model_passes(engine.trainer.passes) == engine.trainer.file_passes


def test_no_name_is_the_default_trainer_and_the_built_in_probe():
    assert trainer_named(None) is DEFAULT_TRAINER and engine_named(None).trainer is None
    with pytest.raises(KeyError):
        trainer_named("openrlhf")


def test_the_command_line_offers_what_the_registry_holds():
    from tests.test_cli_names import _commands

    run = _commands()["run"]
    choices = {action.dest: action.choices for action in run._actions if action.choices}
    assert set(choices["target"]) == set(TRAINERS) and set(choices["engine"]) == set(ENGINES)


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_each_trainers_export_reads_back_as_its_own_file_with_the_pick(name, tmp_path):
    """`Trainer.export`: its file, read back, is the trainer's kind with the pick's sizes; best_config.yaml
    keeps the figures last and says the same sizes."""
    from autotune.config.knobs import ProbeConfig
    from autotune.formats.read import read_target
    from autotune.trainers.export import ExportJob

    trainer = trainer_named(name)
    config = ProbeConfig(
        train_batch_size=16, rollout_batch_size=16, micro_batch_size=2, algorithm="grpo", rollout_n=4
    )
    measured = {"samples_per_sec": 1.5, "peak_memory_bytes": 2**30, "device": "cuda", "gpus": 2}
    job = ExportJob(config, "llama-2-7b", "function", gpus=2, measured=measured, device="cuda")
    export = trainer.export(job)
    assert list(export.document)[-1] == "measured" and export.document["measured"] == measured
    assert export.document["micro_batch_size"] == 2
    path = tmp_path / trainer.export_file
    path.write_text(export.text)
    target = read_target(path, gpus=2)
    assert target.kind == trainer.file_kind and target.config is not None
    assert target.config.micro_batch_size == 2
    assert trainer.mini_batch(target) == export.document["mini_batch_size"]
    assert all(knob.key in export.text for knob in export.knobs)
