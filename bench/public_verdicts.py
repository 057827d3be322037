"""`autotune check` on the public verl launch files the tests read: the verdict, its peak and the phase that
decides it, beside what its source says of the job (ran on its stated hardware, or nothing).

    python -m bench.public_verdicts          # a Markdown table, about 10 s (bash reads each script)

Each file names its source in its first line (tests/data/verl_examples) or in
tests/fixtures/launch/SOURCES.md. Each is checked on the card it ran on (80 GiB where its source says no
more), on GSM8K-shaped data (tests/data/gsm8k_like.jsonl). Left out: the launch fixtures whose model the
registry does not ship (Qwen3, gpt-oss), that start another trainer (the DAPO recipe's main_dapo), that
name a config folder inside verl's own checkout (the sglang multi-turn example) or an NPU.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from autotune.check import CheckOptions, check
from autotune.errors import UserError

TESTS = Path(__file__).resolve().parents[1] / "tests"
GSM8K_LIKE = TESTS / "data" / "gsm8k_like.jsonl"


@dataclass(frozen=True)
class PublicJob:
    path: Path
    source: str  # repository and path
    known: str  # what its source says of the job on that card
    gpu: str = "a100-80g"


EXAMPLES = TESTS / "data" / "verl_examples"
LAUNCH = TESTS / "fixtures" / "launch"
RAN = "ran on 80 GiB cards (verl's example)"
JOBS = [
    *(
        PublicJob(EXAMPLES / name, f"verl examples/{name}", RAN)
        for name in (
            "grpo_trainer/run_qwen2-7b.sh",
            "grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh",
            "ppo_trainer/run_deepseek7b_llm.sh",
            "ppo_trainer/run_qwen2-7b_seq_balance.sh",
        )
    ),
    *(
        PublicJob(
            EXAMPLES / "tuning" / name,
            f"verl examples/tuning/{size}/{name}",
            "ran (verl docs/perf/device_tuning.rst)",
            gpu=card,
        )
        for size, name, card in (
            ("7b", "qwen2-7b_grpo_2_h800_fsdp_vllm.sh", "h800-80g"),
            ("32b", "qwen2-32b_grpo-lora_4_h100_fsdp_vllm.sh", "h100-80g"),
            ("70b", "qwen2-72b_grpo-lora_8_h100_fsdp_vllm.sh", "h100-80g"),
            ("70b", "qwen2-70b_grpo_32_h800_fsdp_vllm.sh", "h800-80g"),
        )
    ),
    PublicJob(
        LAUNCH / "tee_log_and_arith_vars_lora_tuning.sh",
        "verl examples/tuning/7b/qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh",
        "ran on one H100 (the script's comment marks its batch √, the next ×)",
        gpu="h100-80g",
    ),
    *(
        PublicJob(LAUNCH / fixture, source, "not stated")
        for fixture, source in (
            ("plain_grpo_vars_qwen2-7b_math.sh", "verl examples/grpo_trainer/run_qwen2-7b_math.sh"),
            (
                "if_sets_var_positional_args_trtllm.sh",
                "verl examples/grpo_trainer/run_qwen2-7b_math_trtllm.sh",
            ),
            ("issue_4104_quickstart_ppo_tee.sh", "verl issue #4104 (the quick start's PPO command)"),
        )
    ),
]


def verdict_row(job: PublicJob) -> str:
    name = job.path.relative_to(TESTS).as_posix()
    try:
        result = check(CheckOptions(path=job.path, gpu=job.gpu, data=GSM8K_LIKE, cores=64))
    except UserError as error:
        return f"| `{name}` | {job.source} | {job.gpu} | {str(error)[:80]} | — | — | — | {job.known} |"
    memory = result.memory or {}
    if not memory:
        said = next((f.problem for f in result.problems), "no memory verdict")
        return f"| `{name}` | {job.source} | {job.gpu} | {said[:80]} | — | — | — | {job.known} |"
    step = memory.get("step_peak_gib", memory.get("predicted_peak_gib"))
    phase = memory.get("decided_by_phase", "training")
    limits = memory.get("at_max_lengths") or {}
    at_limits = f"{limits['verdict']} {limits.get('predicted_peak_gib')}" if limits else "—"
    gpus = f"{result.gpus}×{job.gpu}"
    cells = [f"`{name}`", job.source, gpus, memory["verdict"], step, phase, at_limits, job.known]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main() -> int:
    print(
        "| file | source | GPUs | verdict on the data | step peak GiB | decided by | at the limits | known |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for job in JOBS:
        print(verdict_row(job), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
