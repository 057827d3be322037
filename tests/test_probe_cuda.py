"""The same probe on a GPU: bf16, allocator and NVML peaks, a real CUDA OOM. Skips cleanly without one."""

import json

import pytest
import torch

from tests.conftest import ISSUE_EXAMPLE, run_cli

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.e2e,  # the probe's processes: the fast tier leaves these out even on a GPU machine
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible here)"),
]
SETS = ISSUE_EXAMPLE


def _probe(*args: str) -> tuple[int, dict]:
    proc = run_cli("probe", "--device", "cuda", "--json", *args, timeout=600)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_probe_on_gpu_reports_allocator_and_nvml_peaks():
    code, result = _probe("--model", "tiny-llama", *SETS)
    assert code == 0 and result["status"] == "ok", result
    peak = result["rank_peaks"][0]
    assert peak["torch_reserved_bytes"] >= peak["torch_allocated_bytes"] > 0
    assert result["environment"]["gpu"]
    assert result["peak_memory_bytes"] >= peak["torch_reserved_bytes"]


def test_emulated_small_card_gives_a_real_cuda_oom():
    code, result = _probe("--model", "qwen2.5-0.5b", "--memory-budget", "1", *SETS)
    assert code == 1 and result["status"] == "oom" and result["oom_kind"] == "cuda", result


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpus_nccl():
    code, result = _probe("--model", "tiny-llama", "--gpus", "2", *SETS)
    assert code == 0 and len(result["rank_peaks"]) == 2
