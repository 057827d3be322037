"""The memory model of TRL 1.16's own passes (`Passes.TRL_FUSED`: --engine trl, a TRL file checked), its
first aid in TRL's fields, and vLLM colocated in the training process."""

from __future__ import annotations

import pytest

from autotune.config.knobs import ProbeConfig
from autotune.config.passes import Passes
from autotune.memory.advice import trl_first_aid
from autotune.memory.architecture import Architecture
from autotune.memory.calibration import MemoryModel
from autotune.models.catalog import resolve_model
from autotune.units import GIB

# Peak RSS of TRL 1.16 probes of tiny-llama on CPU (GRPO, 4 completions, beta 0.05), measured for issue 33:
# (train batch, mini batch, prompt, completion, micro batch, checkpointing) -> GiB
MEASURED = {
    (32, 16, 128, 16, 8, True): 1.7269,
    (32, 16, 128, 16, 4, True): 1.159,
    (32, 16, 128, 16, 2, True): 0.8754,
    (32, 16, 128, 16, 8, False): 1.7326,
    (16, 8, 32, 16, 8, True): 0.9526,
    (24, 24, 64, 16, 8, True): 1.2216,
    (24, 24, 64, 16, 6, True): 1.064,
    (24, 24, 64, 16, 4, True): 0.9065,
    (24, 24, 64, 16, 12, False): 1.5398,
}


def config_of(train, mini, prompt, completion, micro, checkpointing, **more) -> ProbeConfig:
    return ProbeConfig(
        algorithm="grpo",
        rollout_n=4,
        kl_coef=0.05,
        train_batch_size=train,
        rollout_batch_size=train,
        micro_batch_size=micro,
        gradient_accumulation_steps=mini // micro,
        max_prompt_length=prompt,
        max_response_length=completion,
        gradient_checkpointing=checkpointing,
        **more,
    )


@pytest.fixture(scope="module")
def arch() -> Architecture:
    return Architecture.from_specs(resolve_model("tiny-llama"))


def test_the_priors_predict_trls_measured_cpu_peaks(arch):
    """Uncalibrated, as `check` judges a TRL file: within 5% of every measured TRL probe."""
    model = MemoryModel(arch, 1, "cpu", passes=Passes.TRL_FUSED)
    for key, peak in MEASURED.items():
        predicted = model.predict(config_of(*key)) / GIB
        assert abs(predicted - peak) / peak < 0.05, (key, predicted, peak)


def test_trls_fused_head_grows_with_every_token_of_the_micro_batch_on_cpu_and_completions_on_cuda(arch):
    cpu = MemoryModel(arch, 1, "cpu", passes=Passes.TRL_FUSED)
    cuda = MemoryModel(arch, 1, "cuda", passes=Passes.TRL_FUSED)
    short, long = config_of(16, 16, 32, 16, 8, True), config_of(16, 16, 256, 16, 8, True)
    assert cpu.breakdown(long).logits > 4 * cpu.breakdown(short).logits  # every position scored
    assert cuda.breakdown(long).logits == cuda.breakdown(short).logits  # Triton: the completions only


def test_vllm_colocated_in_trl_adds_its_share_of_the_card_to_the_peak(arch):
    card = 80 * GIB
    model = MemoryModel(arch, 1, "cuda", rollout_card_bytes=card, passes=Passes.TRL_FUSED)
    plain = config_of(16, 16, 64, 16, 4, True)
    colocated = config_of(16, 16, 64, 16, 4, True, gpu_memory_utilization=0.3)
    assert model.colocated_pool(plain) is None and model.colocated_pool(colocated) == int(0.3 * card)
    assert model.predict(colocated) >= 0.3 * card
    assert model.breakdown(colocated).phases.keys() == {"scoring", "update"}  # no transformers generate


def test_trl_first_aid_keeps_the_mini_batch_with_the_largest_micro_batch_that_fits(arch):
    model = MemoryModel(arch, 1, "cpu", passes=Passes.TRL_FUSED)
    defaults = config_of(24, 24, 64, 16, 8, True)
    limit = 0.9 * 1.2 * GIB
    assert model.predict(defaults) > limit
    said = trl_first_aid(model, defaults, limit)
    assert said.startswith("in TRL's fields, fits with any one of: 1) per_device_train_batch_size 8→6 with ")
    assert "gradient_accumulation_steps 3→4 (the mini batch kept): " in said
