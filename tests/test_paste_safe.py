"""Every command autotune prints for the user to paste runs in bash as printed: the verl and TRL launch lines
(terminal, summary.json, report.md) and `autotune check`'s heading, with paths that hold a space, a `$` and
a `'`. Each line is run by bash with a stub program first on PATH that writes the argv it received: those
tests start processes, so they are e2e (tests/conftest.py), though they take a second; the fast tier reads
the same lines with shlex, as bash would split them."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.check import CheckResult, print_result
from autotune.formats.trl import launch_line as trl_launch_line
from autotune.formats.verl import format_overrides, format_value, parse_overrides
from autotune.report.tables import launch_line
from autotune.report.write import write_report
from autotune.study.plan import StudyPlan
from autotune.trainers.export import Export
from tests.report_studies import BASE, BUDGET, new_study, record, standard_study

AWKWARD = ["my out", "cost$HOME", "it's", "a $(b) `c` * [d]"]  # a space, a `$`, a `'`, and worse
STUB = """#!{python}
import json, os, sys
with open(os.environ["ARGV_FILE"], "w") as out:
    json.dump(sys.argv[1:], out)
"""
DATA = ["data.train_files=/path/to/train.parquet", "data.val_files=/path/to/val.parquet"]
VALUES = {  # values bash would split or glob if the file's contents were word-split: `$(cat FILE)`
    "actor_rollout_ref.model.path": "/models/my model",
    "actor_rollout_ref.rollout.name": "vllm",
    "trainer.logger": ["console", "file"],
    "trainer.experiment_name": "it's $HOME *",
    "data.train_batch_size": 16,
}


def run_pasted(line: str, tmp_path: Path, programs: tuple[str, ...], cwd: Path | None = None) -> list[str]:
    """Run `line` in bash as a user who pasted it; the argv the first of `programs` it started received."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in programs:
        stub = stubs / name
        stub.write_text(STUB.format(python=sys.executable))
        stub.chmod(0o755)
    argv_file = tmp_path / "argv.json"
    argv_file.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "ARGV_FILE": str(argv_file)}
    done = subprocess.run(
        ["bash", "-c", line], cwd=cwd or tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return json.loads(argv_file.read_text())


def exported(values: dict, plan: StudyPlan) -> SimpleNamespace:
    """A report as the launch line reads it: the plan and verl's export of `values`."""
    return SimpleNamespace(export=Export({}, format_overrides(values), launch_values=values), plan=plan)


def folder(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name / "study"
    path.mkdir(parents=True)
    return path


@pytest.mark.e2e
@pytest.mark.parametrize("name", AWKWARD)
def test_the_verl_launch_line_hands_verl_each_line_of_the_file(tmp_path, name):
    overrides = folder(tmp_path, name) / "verl_overrides.txt"
    overrides.write_text(format_overrides(VALUES))
    report = exported(dict(VALUES), StudyPlan())
    line = launch_line(report, str(overrides))
    argv = run_pasted(line, tmp_path, ("python",))
    assert argv == ["-m", "verl.trainer.main_ppo", *overrides.read_text().splitlines(), *DATA]
    assert "actor_rollout_ref.model.path='/models/my model'" in argv  # one argument, Hydra's quotes kept


@pytest.mark.e2e
def test_the_verl_launch_line_of_the_reports_runs_beside_the_file(tmp_path):
    """report.md and report.html name the file relative to their folder: run there, it reads it."""
    out = folder(tmp_path, "my out")
    (out / "verl_overrides.txt").write_text(format_overrides(VALUES))
    report = exported(dict(VALUES), StudyPlan())
    argv = run_pasted(launch_line(report), tmp_path, ("python",), cwd=out)
    assert argv[2:] == [*format_overrides(VALUES).splitlines(), *DATA]


@pytest.mark.e2e
def test_a_reward_model_directory_is_one_argument(tmp_path):
    reward = folder(tmp_path, "it's $HOME")  # a local directory: verl is given its path
    overrides = reward / "verl_overrides.txt"
    values = {"data.train_batch_size": 16}
    overrides.write_text(format_overrides(values))
    report = exported(values, StudyPlan(reward_model=str(reward)))
    argv = run_pasted(launch_line(report, str(overrides)), tmp_path, ("python",))
    assert argv[-2:] == ["reward_model.enable=true", f"reward_model.model.path={format_value(str(reward))}"]
    assert parse_overrides(argv[-1]) == {"reward_model.model.path": str(reward)}  # as Hydra reads it


@pytest.mark.e2e
def test_a_failed_read_does_not_start_verl_on_its_defaults(tmp_path):
    report = exported(dict(VALUES), StudyPlan())
    line = launch_line(report, str(tmp_path / "missing dir" / "verl_overrides.txt"))
    with pytest.raises(AssertionError):
        run_pasted(line, tmp_path, ("python",))
    assert not (tmp_path / "argv.json").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("name", AWKWARD)
@pytest.mark.parametrize("gpus", [1, 2])
def test_the_trl_launch_line_passes_the_config_path_whole(tmp_path, name, gpus):
    config = folder(tmp_path, name) / "trl_config.yaml"
    config.write_text("per_device_train_batch_size: 2\n")
    argv = run_pasted(trl_launch_line(str(config), gpus), tmp_path, ("trl", "accelerate"))
    rest = ["--config", str(config), "--dataset_name", "/path/to/dataset", "--reward_funcs"]
    start = (
        ["grpo"] if gpus == 1 else ["launch", "--multi_gpu", "--num_processes", "2", "-m", "trl.scripts.grpo"]
    )
    assert argv == [*start, *rest, "your_module.your_reward"]


@pytest.mark.e2e
def test_the_reports_verl_line_runs_from_a_folder_with_a_space_and_a_dollar(tmp_path):
    """The line summary.json stores and the terminal shows, for a report written to such a folder."""
    out = folder(tmp_path, "my $out's")
    plan = StudyPlan(model="llama-2-7b", space_name="cpu-tiny")
    result = write_report(standard_study(), out, BUDGET, plan=plan)
    launch = json.loads((out / "summary.json").read_text())["launch"]
    assert "  " + launch in result.messages
    argv = run_pasted(launch, tmp_path, ("python",))
    lines = (out / "verl_overrides.txt").read_text().splitlines()
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"] and argv[2 : 2 + len(lines)] == lines
    md = (out / "report.md").read_text()
    shown = md.split("**Start verl on it**")[1].split("```bash\n")[1].split("\n")[0]
    assert run_pasted(shown, tmp_path, ("python",), cwd=out) == argv


@pytest.mark.e2e
def test_the_reports_trl_line_runs_from_a_folder_with_a_space_and_a_dollar(tmp_path):
    out = folder(tmp_path, "my $out's")
    study = new_study("trl")
    record(
        study, "ok", dataclasses.replace(BASE, algorithm="grpo", rollout_n=4, train_batch_size=32), 10.0, 0.5
    )
    write_report(study, out, BUDGET, plan=StudyPlan(model="tiny-llama", target="trl"))
    launch = json.loads((out / "summary.json").read_text())["launch"]
    argv = run_pasted(launch, tmp_path, ("trl", "accelerate"))
    assert argv[:3] == ["grpo", "--config", str((out / "trl_config.yaml").resolve())]


@pytest.mark.e2e
@pytest.mark.parametrize("name", AWKWARD)
def test_the_check_heading_names_the_file_as_bash_reads_it(tmp_path, name, capsys):
    path = str(folder(tmp_path, name) / "verl_overrides.txt")
    target = SimpleNamespace(
        model="m", reward_model=None, kind="verl overrides", sharding_label="fsdp", layout_assumed=False
    )
    print_result(CheckResult(path, target, 1, None, []))
    heading = capsys.readouterr().out.splitlines()[0]
    command = f"autotune check {shlex.quote(path)}"
    assert heading.startswith(command + ": ")
    assert run_pasted(command, tmp_path, ("autotune",)) == ["check", path]


# --- the fast tier: the same lines, split by shlex as bash splits them -------------------------------------


@pytest.mark.parametrize("name", AWKWARD)
def test_the_verl_line_names_the_file_as_one_word(name):
    path = f"/tmp/{name}/verl_overrides.txt"
    report = exported(dict(VALUES), StudyPlan())
    words = shlex.split(launch_line(report, path))
    assert words[:6] == ["mapfile", "-t", "overrides", "<", path, "&&"]
    assert words[6:] == ["python", "-m", "verl.trainer.main_ppo", "${overrides[@]}", *DATA]
    assert "$(cat" not in launch_line(report, path)  # it would split `key='/models/my model'` in two


@pytest.mark.parametrize("name", AWKWARD)
@pytest.mark.parametrize("gpus", [1, 4])
def test_the_trl_line_names_the_config_as_one_word(name, gpus):
    path = f"/tmp/{name}/trl_config.yaml"
    words = shlex.split(trl_launch_line(path, gpus))
    assert words[words.index("--config") + 1] == path
    assert words[:2] == (["trl", "grpo"] if gpus == 1 else ["accelerate", "launch"])


def test_plain_paths_stay_unquoted_in_the_reports():
    """report.md's lines name the file beside them: nothing to quote, nothing quoted."""
    report = exported(dict(VALUES), StudyPlan())
    assert launch_line(report).startswith("mapfile -t overrides < verl_overrides.txt && python -m ")
    assert trl_launch_line("trl_config.yaml", 1).startswith(
        "trl grpo --config trl_config.yaml --dataset_name"
    )
