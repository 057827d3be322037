"""`--verl-python`'s check (autotune/probe/verl/install.py): verl's V1 trainer needs transfer_queue, vLLM
>= 0.18 and orjson beside verl, and an environment that lacks one is told so in one line, exit 2. The e2e
tests make environments of their own from the stand-in verl (tests/fake_verl) without one piece: a python
that is autotune's own with a PYTHONPATH of links."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.probe.verl.install import check_verl_python, missing_pieces
from tests.conftest import REPO, run_cli

STAND_IN = REPO / "tests" / "fake_verl"
PIECES = (
    "transfer_queue",
    "TransferQueue-0.1.10.dist-info",
    "vllm-0.24.0.dist-info",
    "orjson.py",
    "cachetools.py",
    "fastapi.py",
    "uvicorn.py",
)
ALL_THERE = {
    "transfer_queue": {"error": None, "version": "0.1.10"},
    "vLLM": {"error": None, "version": "0.24.0"},
    "orjson": {"error": None, "version": "3.11.5"},
}


def test_a_complete_environment_lacks_nothing():
    assert missing_pieces(ALL_THERE) == []
    assert missing_pieces({**ALL_THERE, "vLLM": {"error": None, "version": "0.18.0rc1.dev3"}}) == []


TQ = "transfer_queue (TransferQueue >= 0.1.10)"


@pytest.mark.parametrize(
    ("piece", "found", "said"),
    [
        ("transfer_queue", {"error": "ModuleNotFoundError: No module named 'transfer_queue'"}, TQ),
        ("transfer_queue", {"error": None, "version": "0.1.9"}, f"{TQ}, not 0.1.9"),
        ("vLLM", {"error": None, "version": None}, "vLLM (vllm >= 0.18)"),
        ("vLLM", {"error": None, "version": "0.10.1"}, "vLLM (vllm >= 0.18), not 0.10.1"),
        ("orjson", {"error": "ModuleNotFoundError: No module named 'orjson'", "version": None}, "orjson"),
    ],
)
def test_each_missing_or_old_piece_is_named(piece, found, said):
    assert missing_pieces({**ALL_THERE, piece: found}) == [said]


def environment(tmp_path: Path, without: str | None = None, vllm: str = "0.24.0") -> Path:
    """A python whose path holds the stand-in verl and its runtime pieces but `without`, vLLM at `vllm`."""
    site, pieces = tmp_path / "site", tmp_path / "site" / "runtime_pieces"
    pieces.mkdir(parents=True)
    (site / "verl").symlink_to(STAND_IN / "verl")
    for piece in PIECES:
        if piece != without and not piece.startswith("vllm-"):
            (pieces / piece).symlink_to(STAND_IN / "runtime_pieces" / piece)
    if without != "vllm-0.24.0.dist-info":
        record = pieces / f"vllm-{vllm}.dist-info"
        record.mkdir()
        (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {vllm}\n")
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return python


@pytest.mark.e2e
def test_the_stand_in_environment_passes(tmp_path):
    assert check_verl_python(str(environment(tmp_path))) == "0.9.1"


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("without", "vllm", "said"),
    [
        ("transfer_queue", "0.24.0", "needs transfer_queue (TransferQueue >= 0.1.10), which"),
        ("vllm-0.24.0.dist-info", "0.24.0", "needs vLLM (vllm >= 0.18), which"),
        (None, "0.10.1", "needs vLLM (vllm >= 0.18), not 0.10.1, which"),
        ("orjson.py", "0.24.0", "needs orjson, which that environment lacks"),
    ],
)
def test_an_environment_without_a_piece_is_one_line(tmp_path, without, vllm, said):
    python = environment(tmp_path, without, vllm)
    with pytest.raises(UserError, match="install with") as refused:
        check_verl_python(str(python))
    assert said in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.e2e
def test_on_cpu_verl_needs_what_its_cpu_rollout_imports_and_no_vllm(tmp_path):
    """On CPU verl generates with autotune's hf_cpu rollout: vLLM is not needed, the router's imports are."""
    without_vllm = environment(tmp_path / "a", "vllm-0.24.0.dist-info")
    assert check_verl_python(str(without_vllm), "cpu") == "0.9.1"
    with pytest.raises(UserError, match="on CPU needs cachetools, which") as refused:
        check_verl_python(str(environment(tmp_path / "b", "cachetools.py")), "cpu")
    assert "cachetools fastapi uvicorn" in str(refused.value)  # how to install them


@pytest.mark.e2e
def test_the_command_line_says_it_in_one_line_and_exits_2(tmp_path):
    python = environment(tmp_path, "transfer_queue")
    proc = run_cli("probe", "--engine", "verl", "--verl-python", str(python), "--device", "cpu")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "transfer_queue" in proc.stderr
