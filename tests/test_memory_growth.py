"""Measured peak memory grows with the memory-monotone knobs: what dominance pruning relies on."""

import pytest

from tests.conftest import probe_json

pytestmark = pytest.mark.e2e
BASE = [
    "--model",
    "tiny-llama",
    "--iterations",
    "1",
    "--set",
    "train_batch_size=16",
    "--set",
    "rollout_batch_size=16",
    "--set",
    "gradient_accumulation_steps=1",
    "--set",
    "max_prompt_length=16",
]


def _peak(*sets: str) -> int:
    code, result = probe_json(*BASE, *[arg for item in sets for arg in ("--set", item)])
    assert code == 0, result
    return result["peak_memory_bytes"]


def test_peak_grows_with_micro_batch_size():
    # logits alone: micro × (Lr+1) × 32000 vocab × 4 B = 2 × 65 × 128 KB ≈ 17 MB vs 16 × ... ≈ 133 MB
    assert _peak("micro_batch_size=16", "max_response_length=64") > _peak(
        "micro_batch_size=2", "max_response_length=64"
    )


def test_peak_grows_with_max_response_length():
    assert _peak("micro_batch_size=8", "max_response_length=128") > _peak(
        "micro_batch_size=8", "max_response_length=8"
    )
