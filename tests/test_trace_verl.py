"""The trace with verl's own per-token functions (`check --trace --verl-python`): the table autotune fills by
default, verl's filling in verl's environment against autotune's, and the refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.check import CheckOptions, check
from autotune.config.job_lengths import JobLengths, pass_tokens
from autotune.config.knobs import ProbeConfig
from autotune.errors import UserError
from autotune.models.catalog import resolve_model
from autotune.probe.rank.pass_math import AUTOTUNE
from autotune.probe.traced import TraceJob, TraceUnavailable, run_trace
from tests.conftest import VERL_PYTHON

GRPO = ProbeConfig(  # GRPO with KL: log-probs, entropy, the policy loss and the KL loss all run
    train_batch_size=4,
    rollout_batch_size=4,
    rollout_n=2,
    micro_batch_size=2,
    gradient_accumulation_steps=1,
    max_prompt_length=8,
    max_response_length=8,
    sharding="replicate",
    algorithm="grpo",
    kl_coef=0.05,
)
CONFIG = (
    "rollout_batch_size: 8\ntrain_batch_size: 8\nmicro_batch_size: 2\ngradient_accumulation_steps: 2\n"
    "max_prompt_length: 16\nmax_response_length: 16\nactor_model_config:\n  model_name_or_path: tiny-llama\n"
)


def test_autotunes_table_computes_what_rl_math_does():
    logits, labels = torch.randn(5, 11), torch.randint(0, 11, (5,))
    log_probs = AUTOTUNE.log_probs(logits, labels)
    assert torch.allclose(log_probs, torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1))
    probabilities = torch.softmax(logits, -1)
    entropy = -(probabilities * probabilities.log()).sum(-1)
    assert torch.allclose(AUTOTUNE.entropy(logits), entropy, atol=1e-5)
    same, mask = torch.zeros(2, 3), torch.ones(2, 3)
    assert AUTOTUNE.kl_loss(same, same, mask).item() == 0.0
    assert set(AUTOTUNE.functions) == {"log_probs", "entropy", "policy_loss", "kl_loss", "value_loss"}


def test_verls_table_outside_verls_environment_is_unavailable_in_one_line():
    from autotune.probe.rank.verl_math import verl_math

    with pytest.raises(TraceUnavailable, match="verl cannot be imported here"):
        verl_math()


def test_a_fake_tensors_metric_reads_zero_only_inside_the_loss():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.probe.rank.verl_math import _metrics_read_as_zero

    with FakeTensorMode():
        fake = torch.ones(3).sum()
        with _metrics_read_as_zero():
            assert fake.item() == 0.0
        with pytest.raises(Exception):  # noqa: B017 (torch's data-dependent error: no value)
            fake.item()
    assert torch.ones(3).sum().item() == 3.0


def test_verl_python_without_trace_or_not_a_file_is_one_line(tmp_path: Path):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    with pytest.raises(UserError, match="add --trace"):
        check(CheckOptions(path=config, verl_python=str(VERL_PYTHON)))
    with pytest.raises(UserError, match="not an executable file"):
        check(CheckOptions(path=config, trace=True, verl_python=str(tmp_path / "nope")))


@pytest.mark.e2e
@pytest.mark.parametrize("python", ["old", "no-verl"])
def test_a_python_without_verl_0_9_1_is_one_line_and_exit_2(tmp_path: Path, python: str):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    if python == "old":
        fake = tmp_path / "python"
        fake.write_text("#!/bin/sh\necho 0.9.0\n")
        fake.chmod(0o755)
        given = str(fake)
    else:
        given = sys.executable  # autotune's own environment: no verl
    run = [sys.executable, "-m", "autotune", "check", str(config), "--trace", "--verl-python", given]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--verl-python" in lines[0] and "Traceback" not in done.stderr
    assert ("verl 0.9.0 there" if python == "old" else "`import verl` fails there") in lines[0]


@pytest.mark.e2e
def test_verls_functions_trace_what_autotunes_do_to_one_vocabulary_row():
    """Per pass, verl's functions and autotune's peak within one bf16 vocabulary row of each other: verl's
    logprobs_from_logits_v2 keeps the previous row's log-softmax alive in its loop variable while it computes
    the next, autotune's comprehension does not (seen in the reference pass, whose peak is that loop)."""
    if not VERL_PYTHON.exists():
        pytest.skip(f"verl's environment is missing ({VERL_PYTHON}): ./setup.sh test makes it")
    spec = resolve_model("tiny-llama")
    ours = run_trace(TraceJob(spec, None, GRPO, 1, "cuda"))
    verls = run_trace(TraceJob(spec, None, GRPO, 1, "cuda", str(VERL_PYTHON)))
    assert ours.functions["log_probs"].startswith("autotune.")
    assert verls.functions["log_probs"].startswith("verl.utils.torch_functional.logprobs_from_logits")
    assert verls.functions["kl_loss"].startswith("verl.trainer.ppo.core_algos.kl_penalty(low_var_kl)")
    assert any("logprobs_from_logits_v2" in note for note in verls.notes)
    assert verls.states == ours.states
    row = 2 * spec.config.vocab_size
    assert [p.name for p in verls.phases] == [p.name for p in ours.phases]
    for mine, theirs in zip(ours.phases, verls.phases, strict=True):
        assert 0 <= theirs.peak - mine.peak <= row, mine.name


@pytest.mark.e2e
def test_verls_environment_traces_on_the_jobs_lengths():
    """The job's lengths travel into verl's environment: its trace packs the data's micro batches too."""
    if not VERL_PYTHON.exists():
        pytest.skip(f"verl's environment is missing ({VERL_PYTHON}): ./setup.sh test makes it")
    lengths = JobLengths.from_counts([2, 3, 4], [1, 2, 3])  # under GRPO's limits of 8 + 8
    verls = run_trace(TraceJob(resolve_model("tiny-llama"), None, GRPO, 1, "cuda", str(VERL_PYTHON), lengths))
    priced = {kind: tokens for kind, tokens in pass_tokens(GRPO, lengths, 1).to_dict().items() if tokens}
    assert verls.lengths == "data" and verls.tokens == priced
    assert verls.tokens["update"] < 2 * GRPO.sequence_length  # the limits' micro batch of 2


@pytest.mark.e2e
def test_verls_transformers_builds_every_model_in_the_dtype_asked(tmp_path: Path):
    """transformers 5.10 (verl's environment) built a critic's body in Llama-2's config dtype (fp16) and its
    head in the one asked: FSDP refused the mix, and the trace of seed §5.2 (PPO, FSDP) failed."""
    if not VERL_PYTHON.exists():
        pytest.skip(f"verl's environment is missing ({VERL_PYTHON}): ./setup.sh test makes it")
    (tmp_path / "autotune").symlink_to(Path(__file__).resolve().parents[1] / "autotune", True)
    code = (
        "import torch\n"
        "from autotune.models.catalog import build_causal_lm, build_critic, resolve_model\n"
        "spec = resolve_model('llama-2-7b')\n"
        "for build in (build_causal_lm, build_critic):\n"
        "    model = build(spec, torch.float32, 'meta')\n"
        "    print(build.__name__, sorted({str(p.dtype) for p in model.parameters()}))\n"
    )
    done = subprocess.run(
        [str(VERL_PYTHON), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "build_causal_lm ['torch.float32']",
        "build_critic ['torch.float32']",
    ]
