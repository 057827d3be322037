"""Installed as users install it: the sdist and the wheel carry every module and data file, and the wheel,
installed into a fresh environment that does not see the checkout, runs the commands from anywhere."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # builds, installs and runs processes

# where each source folder lands in the installed package (setup.py maps runners/ and search_spaces/)
SHIPPED = {"autotune": "autotune", "runners": "autotune/runners", "search_spaces": "autotune/search_spaces"}
DATA = ("*.py", "*.yaml", "*.json", "*.txt", "*.model")


def _run(command: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _source_files() -> dict[str, str]:
    """Every module and data file of the source tree: checkout path -> installed path."""
    files = {}
    for folder, installed in SHIPPED.items():
        for pattern in DATA:
            for path in (REPO / folder).rglob(pattern):
                if "__pycache__" not in path.parts:
                    relative = path.relative_to(REPO / folder).as_posix()
                    files[f"{folder}/{relative}"] = f"{installed}/{relative}"
    return files


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist, built from the checkout, and the wheel built from the unpacked sdist (as `pip install` of
    an sdist does), both with setuptools' PEP 517 hooks."""
    out = tmp_path_factory.mktemp("dist")
    hook = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
    sdist = _run([sys.executable, "-c", hook, "build_sdist", str(out)], cwd=REPO)
    assert sdist.returncode == 0, sdist.stderr[-3000:]
    archive = out / sdist.stdout.strip().splitlines()[-1]
    with tarfile.open(archive) as tar:
        tar.extractall(out / "unpacked", filter="data")
    (unpacked,) = (out / "unpacked").iterdir()
    wheel = _run([sys.executable, "-c", hook, "build_wheel", str(out)], cwd=unpacked)
    assert wheel.returncode == 0, wheel.stderr[-3000:]
    return {"sdist": archive, "wheel": out / wheel.stdout.strip().splitlines()[-1]}


def test_the_sdist_and_the_wheel_carry_every_module_and_data_file(built):
    with tarfile.open(built["sdist"]) as tar:
        in_sdist = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    with zipfile.ZipFile(built["wheel"]) as wheel:
        in_wheel = set(wheel.namelist())
    files = _source_files()
    assert "runners/ppo_probe.py" in files and "autotune/probe/verl/backend.py" in files
    assert sorted(set(files) - in_sdist) == []
    assert sorted(set(files.values()) - in_wheel) == []
    assert {"LICENSE", "README.md"} <= in_sdist
    top_level = {name.split("/")[0] for name in in_wheel if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"autotune"}  # no generic top-level names (runners, search_spaces) installed


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed; its dependencies are this environment's
    (a .pth line after its own site-packages), whose editable autotune it never imports."""
    venv = tmp_path_factory.mktemp("venv")
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=venv)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], venv
        ).stdout.strip()
    )
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q"]
    install = _run([*pip, str(built["wheel"])], cwd=venv)
    assert install.returncode == 0, install.stderr[-3000:]
    return venv


def test_the_installed_wheel_runs_from_outside_the_checkout(installed, tmp_path):
    where = tmp_path / "elsewhere"
    where.mkdir()
    shutil.copy(REPO / "tests" / "data" / "seed_scenario_1.yaml", where / "config.yaml")
    autotune, python = installed / "bin" / "autotune", installed / "bin" / "python"

    located = _run(
        [str(python), "-c", "import autotune; print(autotune.__file__, autotune.__version__)"], where
    )
    path, version = located.stdout.split()
    assert Path(path).is_relative_to(installed) and version != "unknown", located.stdout
    assert _run([str(autotune), "--version"], where).stdout.strip() == f"autotune {version}"

    helped = _run([str(autotune), "--help"], where)
    assert helped.returncode == 0 and "examples:" in helped.stdout
    spaces = _run([str(autotune), "spaces", "--json"], where)
    assert spaces.returncode == 0 and "cpu-tiny" in {space["name"] for space in json.loads(spaces.stdout)}
    assert all(Path(space["path"]).is_relative_to(installed) for space in json.loads(spaces.stdout))
    models = _run([str(autotune), "models"], where)
    assert models.returncode == 0 and "tiny-llama" in models.stdout
    checked = _run([str(autotune), "check", "config.yaml", "--cores", "8", "--json"], where)
    assert checked.returncode in (0, 1) and json.loads(checked.stdout)["path"] == "config.yaml", (
        checked.stderr
    )

    probe = [str(autotune), "probe", "--model", "tiny-llama", "--device", "cpu", "--iterations", "1"]
    probe += ["--warmup", "0", "--json"]
    sizes = ["train_batch_size=16", "mini_batch_size=8", "max_prompt_length=16", "max_response_length=8"]
    probed = _run([*probe, *(f"--set={item}" for item in sizes)], where, timeout=600)
    result = json.loads(probed.stdout)
    assert probed.returncode == 0 and result["status"] == "ok", probed.stderr[-3000:]
    assert result["config"]["gradient_accumulation_steps"] == 2  # 8 = micro 4 × 2 steps × 1 rank
