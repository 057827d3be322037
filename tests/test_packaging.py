"""A wheel carries what the tool launches and loads, and installs no generic top-level names."""

import subprocess
import sys
import zipfile

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # starts processes


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (wheel,) = out.glob("autotune_rl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_wheel_ships_runner_spaces_configs_and_tokenizer(wheel_names):
    names = set(wheel_names)
    assert "autotune/runners/ppo_probe.py" in names
    assert "autotune/search_spaces/cpu-tiny.yaml" in names and "autotune/search_spaces/default.yaml" in names
    assert "autotune/models/configs/llama-2-7b.json" in names
    assert any(
        name.startswith("autotune/models/tokenizer_files/") and name.endswith(".json") for name in names
    )


def test_wheel_installs_only_the_autotune_package(wheel_names):
    top_level = {name.split("/")[0] for name in wheel_names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"autotune"}
