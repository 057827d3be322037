"""Launch scripts are read as bash reads them: for every fixture (real files from verl's repositories and from
public issues, sources in tests/fixtures/launch/SOURCES.md) and every shape the reader must get right, the
arguments autotune finds equal those plain bash hands a stub `python3`. The referee is bash itself: it runs
the script in a scratch folder with a PATH that holds only the stubs, so any other command is not found and
prints nothing, as a command the sandbox skips prints nothing."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.formats.launch_script import read_launch_script, trainer_calls
from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # bash runs every script here

FIXTURES = REPO / "tests" / "fixtures" / "launch"
SCRIPTS = sorted(FIXTURES.glob("*.sh"))
STUBS = ("python", "python3", "srun", "ray", "torchrun", "sudo", "!sudo")  # what starts a trainer
# commands the fixtures call that succeed silently here, as a command the sandbox skips does (with `set -e`,
# a missing one would stop bash where a real machine goes on)
SILENT = ("mkdir", "tee", "date", "nvidia-smi", "sleep", "cat", "hostname", "nproc", "wc", "awk", "env")
MODULE = "verl.trainer.main_ppo"
MARKER = re.compile(r"@autotune-skipped-\d+-\d+@")


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """A folder both readers run in, with the same HOME and no variable a fixture reads set."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("NNODES", "BATCH", "RESP", "DEVICE", "MODEL_PATH", "VARIANT", "TP"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def bash_calls(script: Path, folder: Path) -> list[list[str]]:
    """The argument vectors plain bash hands the stubs that start verl's trainer."""
    stubs, log = folder / "stubs", folder / "argv.jsonl"
    stubs.mkdir(exist_ok=True)
    for name in STUBS:
        stub = stubs / name
        stub.write_text(
            f"#!{os.environ.get('PYTHON', '/usr/bin/python3')}\n"
            "import json, os, sys\n"
            "argv = [os.path.basename(sys.argv[0])] + sys.argv[1:]\n"
            f"open({str(log)!r}, 'a').write(json.dumps(argv) + '\\n')\n"
        )
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    for name in SILENT:
        (stubs / name).write_text("#!/bin/sh\nexit 0\n")
        (stubs / name).chmod(0o755)
    env = {**os.environ, "PATH": str(stubs)}
    subprocess.run(
        ["/bin/bash", str(script)],
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )
    argvs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    log.unlink(missing_ok=True)
    return [argv for argv in argvs if MODULE in argv]


def autotune_calls(script: Path) -> list[list[str]]:
    """The same, as autotune reads them; a skipped command's output is empty, as a missing one's is."""
    calls, _ = trainer_calls(script, str(script))
    return [[Path(c.command.argv[0]).name] + [MARKER.sub("", w) for w in c.command.argv[1:]] for c in calls]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_fixture_is_read_as_bash_runs_it(scratch, script):
    assert autotune_calls(script) == bash_calls(script, scratch)


def test_every_fixture_names_its_source():
    listed = (FIXTURES / "SOURCES.md").read_text()
    assert all(f"`{script.name}`" in listed for script in SCRIPTS)


SHAPES = {
    "pipe to tee": "python3 -m verl.trainer.main_ppo data.train_batch_size=8 2>&1 | tee log.txt\n",
    "arithmetic on variables": (
        "nproc_per_gpu=2\nnnodes=1\nngpu_per_node=4\n"
        "total=$(( nproc_per_gpu * nnodes * ngpu_per_node ))\n"
        "python3 -m verl.trainer.main_ppo data.train_batch_size=$total \\\n"
        "  data.max_response_length=$((1024 * 3))\n"
    ),
    "array and function": (
        'ARGS=(data.train_batch_size=8 "trainer.project_name=a b")\n'
        'run() { python3 -m verl.trainer.main_ppo "${ARGS[@]}" "$@"; }\nrun data.max_prompt_length=64\n'
    ),
    "untaken case branch": (
        "n_devices_per_node=8\ncase ${DEVICE:-gpu} in npu) n_devices_per_node=16 ;; esac\n"
        "python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$n_devices_per_node\n"
    ),
    "untaken if branch": (
        'if [ "${DEVICE:-gpu}" = npu ]; then G=16; else G=8; fi\n'
        "python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$G\n"
    ),
    "assignment in a heredoc is data": (
        "G=8\ncat > notes.txt <<EOF\nG=99\nEOF\npython3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$G\n"
    ),
    "source is followed": (
        "source ./env.sh\npython3 -m verl.trainer.main_ppo data.max_response_length=${RESP:-2048}\n"
    ),
    "redirection to a file": (
        "mkdir -p logs\npython3 -m verl.trainer.main_ppo data.train_batch_size=8 > logs/run.log 2>&1\n"
    ),
    "two calls": (
        "python3 -m verl.trainer.main_ppo data.train_batch_size=8\n"
        "python3 -m verl.trainer.main_ppo data.train_batch_size=16\n"
    ),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_is_read_as_bash_reads_it(scratch, shape):
    (scratch / "env.sh").write_text("RESP=4096\n")
    script = scratch / "run.sh"
    script.write_text(SHAPES[shape])
    read = autotune_calls(script)
    assert not (scratch / "logs").exists() and not (scratch / "notes.txt").exists()  # the sandbox wrote none
    (scratch / "logs").mkdir()  # bash's own mkdir is not on the referee's PATH
    expected = bash_calls(script, scratch)
    assert expected, "bash itself starts the trainer"
    assert read == expected


def test_the_chosen_call_is_read_and_two_without_a_choice_are_refused(scratch):
    script = scratch / "run.sh"
    script.write_text(SHAPES["two calls"])
    said = r"starts verl.trainer.main_ppo 2 times: calls 1 \(line 1\), 2 \(line 2\)"
    with pytest.raises(UserError, match=said):
        read_launch_script(script, "run.sh")
    assert read_launch_script(script, "run.sh", call=2).lines[0].text == "data.train_batch_size=16"
    with pytest.raises(UserError, match=r"--call 3: run\.sh starts"):
        read_launch_script(script, "run.sh", call=3)


def test_crlf_is_refused_as_bash_fails_on_it(scratch):
    script = scratch / "run.sh"
    script.write_bytes(b"G=8\r\npython3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$G\r\n")
    assert bash_calls(script, scratch) != [["python3", "-m", MODULE, "trainer.n_gpus_per_node=8"]]
    with pytest.raises(UserError, match=r"run.sh:1: Windows line endings \(CRLF\)"):
        read_launch_script(script, "run.sh")


def test_a_value_from_a_command_not_run_is_refused_where_autotune_reads_it(scratch):
    script = scratch / "run.sh"
    script.write_text(
        "G=$(nvidia-smi -L | wc -l)\nNOW=$(date +%s)\n"
        "python3 -m verl.trainer.main_ppo trainer.experiment_name=run_$NOW \\\n  trainer.n_gpus_per_node=$G\n"
    )
    with pytest.raises(UserError, match=r"run.sh:4: trainer.n_gpus_per_node: its value comes from .*`wc -l`"):
        read_launch_script(script, "run.sh")
    script.write_text(script.read_text().replace("$G", "8"))
    read = read_launch_script(script, "run.sh")
    assert read.lines[0].text == "trainer.experiment_name='run_$(date +%s)'"
    assert any("trainer.experiment_name: its value comes from `date +%s`" in note for note in read.notes)


def test_nothing_outside_the_shell_runs(scratch):
    target = scratch / "victim.txt"
    target.write_text("keep")
    script = scratch / "run.sh"
    script.write_text(
        f"rm -f {target}\n/bin/rm -f {target}\necho gone > {target}\nexec 3>{target}.new\n"
        f"X=$(/bin/sh -c 'echo x > {target}')\ntrap 'rm {target}' EXIT\n"
        "python3 -m verl.trainer.main_ppo data.train_batch_size=8\n"
    )
    read = read_launch_script(script, "run.sh")
    assert read.lines[0].text == "data.train_batch_size=8"
    assert target.read_text() == "keep" and not Path(f"{target}.new").exists()


def test_a_script_without_the_trainer_says_what_it_runs(scratch):
    script = scratch / "run.sh"
    script.write_text("python3 -m recipe.dapo.main_dapo data.train_batch_size=8\n")
    with pytest.raises(UserError, match=r"it runs recipe\.dapo\.main_dapo; autotune reads verl\.trainer"):
        read_launch_script(script, "run.sh")
