"""A study knows what it measured: resuming or joining it with another model, device, budget or probe is
refused in one line; its name is a name, not a path; one `autotune run` at a time on an SQLite study.

All refusals come before the first probe: these tests start no process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from autotune.cli import main
from autotune.files import hold_lock
from autotune.models.catalog import CONFIG_DIR
from autotune.run.prepare import RunOptions, default_study_name, prepare
from autotune.study.plan import StudyPlan
from autotune.study.trials import open_study


def started_study(out: Path, name: str, **options) -> str:
    """A study as `autotune run --space cpu-tiny` left it after one trial; returns its storage URL."""
    job = prepare(RunOptions(space="cpu-tiny", device="cpu", **options), Console(quiet=True))
    (out / name).mkdir(parents=True)
    storage = f"sqlite:///{out / name / 'study.db'}"
    study = open_study(storage, name, seed=0)
    StudyPlan.of(job.space, job.settings, job.budget, 12, job.identity).save(study)
    study.ask()
    return storage


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (["--model", "{other_model}"], "model"),
        (["--reward-model", "tiny-deberta"], "reward_model"),
        (["--memory-budget", "0.9"], "budget_bytes"),
    ],
)
def test_resuming_with_another_job_is_refused_in_one_line(tmp_path, capsys, change, named):
    started_study(tmp_path, "mine")
    args = ["run", "--space", "cpu-tiny", "--device", "cpu", "--study", "mine", "--out", str(tmp_path)]
    other_model = str(model_folder(tmp_path / "other", layers=3))
    assert main([*args, *(arg.format(other_model=other_model) for arg in change)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"measured {named}" in err and "--study NEW" in err, err


def model_folder(parent: Path, layers: int) -> Path:
    """A local model folder `hf`: tiny-llama's architecture with `layers` layers."""
    model = parent / "hf"
    model.mkdir(parents=True)
    base = json.loads((CONFIG_DIR / "tiny-llama.json").read_text())
    (model / "config.json").write_text(json.dumps({**base, "num_hidden_layers": layers}))
    return model


def test_a_model_is_known_by_its_configuration_not_its_folder(tmp_path):
    """Two model folders of the same basename but different architectures: different studies by default."""
    names = []
    for folder, layers in (("a", 2), ("b", 4)):
        model = model_folder(tmp_path / folder, layers)
        job = prepare(RunOptions(space="cpu-tiny", device="cpu", model=str(model)), Console(quiet=True))
        names.append(default_study_name(job.space.name, job.space.model, job.space.gpus, job.fingerprint))
    assert names[0] != names[1] and all(name.startswith("cpu-tiny-hf-1gpu-") for name in names)


@pytest.mark.parametrize("name", ["../../etc", "/abs/path", "a/b", "..", ".hidden", "x" * 200, "a b"])
def test_a_study_name_is_a_name_not_a_path(tmp_path, capsys, name):
    out = tmp_path / "out"
    for command in (["run", "--space", "cpu-tiny", "--device", "cpu"], ["report"]):
        assert main([*command, "--study", name, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "a study name is" in err
    assert list(tmp_path.iterdir()) == []  # nothing written, inside --out or outside it


def test_a_second_run_of_an_sqlite_study_is_refused_while_the_first_lives(tmp_path, capsys):
    storage = started_study(tmp_path, "busy")
    database = Path(storage.removeprefix("sqlite:///"))
    with hold_lock(database.with_name(database.name + ".lock"), "held by this test"):
        args = ["run", "--space", "cpu-tiny", "--device", "cpu", "--study", "busy", "--out", str(tmp_path)]
        assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "being tuned by another `autotune run`" in err and "(pid " in err
