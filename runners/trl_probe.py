"""Probe program for `--engine trl`: one rank of TRL's own GRPOTrainer, run for a few steps on one config.

Launched by path by `autotune.probe.trl_backend` with the TRL environment's python (`--trl-python`), once per
rank,
with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT in the environment (accelerate builds its process group from
them: gloo on CPU, NCCL on CUDA). Reads `--job JOB.json` ({"config", "settings", "trl"}; "trl" holds the
GRPOConfig and ModelConfig fields exactly as the export writes them) and writes
`--out DIR/result.rank<R>.json` in the built-in probe's contract (autotune.probe.contract).

What it runs: GRPOTrainer on prompts of about max_prompt_length tokens, completions forced to
max_completion_length (`min_new_tokens`, as the other engines force full-length responses), and a reward of
the completions' text. The figures: seconds per generation round (a train batch of completions and the T/M
optimizer steps it feeds), summed from TRL's own `step_time` of each optimizer step of the timed rounds;
the CUDA allocator's peak from when the trainer was built, or on CPU the peak resident set of the rounds
before the timed ones (below).

On CPU the peak and the speed are taken in different rounds (`Rounds`). The resident set stands in for a card
only while freed blocks leave it (`return_freed_memory`: blocks from 64 KiB get their own mappings), and
those mappings' page faults slow TRL's rounds by about a fifth (micro batch 4 on small-llama: 6.2-7.4 s a
round, against 5.0-5.9 s on the heap). So the warm-up and one more round (Adam's states exist only after the
first optimizer step) run on mappings and set the peak; glibc's heap then serves the timed rounds, as under
`trl grpo`, whose samples/sec they match. A first round on the heap measured no slower than the next ones
(5.3-5.5 s against 5.0-5.9 s), so the heap needs no warm-up of its own.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from autotune.config.knobs import ProbeConfig, mini_batch_size
from autotune.probe.conditions import CpuWindow
from autotune.probe.rank.process import return_freed_memory, run_rank, serve_from_heap
from autotune.probe.trl_backend import Rounds
from autotune.status import Status

# Nothing is fetched from a model hub: the model is a local folder, and TRL's start-up telemetry would wait on
# a network a probe machine may not have.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

MODEL_READY = "model.ready"  # rank 0 writes the random-weight model folder, the others wait for this file
MODEL_WAIT_SECONDS = 600.0


def setup_device(settings: dict[str, Any]) -> str:
    import torch

    if settings["device"] != "cuda":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        return_freed_memory()
        return "cpu"
    index = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(index)
    budget = settings.get("memory_budget_gib")
    if budget:  # emulate a smaller card: the caching allocator raises a real OOM beyond this fraction
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget * 1024**3 / total), index)
    return "cuda"


def model_folder(settings: dict[str, Any], out_dir: Path, rank: int) -> tuple[str, Any]:
    """(the folder TRL loads the policy and its reference from, the tokenizer). A local model with weights
    is used as it is; otherwise rank 0 writes the random-weight model and its tokenizer into the probe's
    folder."""
    from autotune.models.catalog import build_causal_lm, resolve_model
    from autotune.models.tokenizer import load_tokenizer

    spec = resolve_model(settings["model"], settings["weights"], settings["trust_remote_code"])
    tokenizer = load_tokenizer(spec)
    if spec.weights == "pretrained":
        return str(spec.path), tokenizer
    folder = out_dir / "model"
    if rank == 0:
        model = build_causal_lm(spec, dtype="float32" if settings["device"] != "cuda" else "bfloat16")
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (out_dir / MODEL_READY).touch()
        del model
    deadline = time.monotonic() + MODEL_WAIT_SECONDS
    while not (out_dir / MODEL_READY).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank {rank}: rank 0 never wrote the model folder {folder}")
        time.sleep(0.1)
    return str(folder), tokenizer


def prompt_dataset(tokenizer: Any, config: ProbeConfig, seed: int, rounds: int):
    """Prompts of about max_prompt_length tokens (TRL 1.16 does not truncate prompts: their length is the
    data's), enough for every round's generation batch."""
    from datasets import Dataset

    from autotune.probe.rank.prompts import SyntheticPrompts

    texts = SyntheticPrompts(tokenizer, config.max_prompt_length, seed=seed)
    count = rounds * config.train_batch_size // config.rollout_n + 1
    prompts = [tokenizer.decode(texts[i][: config.max_prompt_length]) for i in range(count)]
    return Dataset.from_dict({"prompt": prompts})


def text_reward(completions: list[str], **_: Any) -> list[float]:
    """A reward that differs between a prompt's completions (so the advantages are not all zero)."""
    return [float(sum(map(ord, text)) % 97) / 97.0 for text in completions]


def step_recorder(rounds: Rounds):
    """A TrainerCallback that keeps TRL's `step_time` of every optimizer step and this rank's CPU window over
    the timed steps. On CPU, after the untimed rounds, it takes the peak, ends the budget's watch (`watch`:
    the event `watch_budget` returned) and hands the allocations to the heap."""
    from transformers import TrainerCallback

    from autotune.probe.rank.measure import peak_memory

    timed_from = rounds.untimed * rounds.steps_per_round

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.tokens: list[float] = []
            self.window: CpuWindow | None = None
            self.cpu: dict[str, Any] | None = None
            self.peak: dict[str, Any] | None = None
            self.watch: Any = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step != timed_from:
                return
            if rounds.cpu:
                self.peak = peak_memory("cpu", None)
                if self.watch is not None:
                    self.watch.set()
                serve_from_heap()
            self.window = CpuWindow()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "step_time" in logs:
                self.seconds.append(float(logs["step_time"]))
                self.tokens.append(float(logs.get("num_tokens", 0.0)))

        def on_train_begin(self, args, state, control, **kwargs):
            if timed_from == 0:  # no untimed round (CUDA without a warm-up): every step is timed
                self.window = CpuWindow()

        def on_train_end(self, args, state, control, **kwargs):
            self.cpu = self.window.stop() if self.window is not None else None

    return StepTimes()


def grpo_args(job: dict[str, Any], out_dir: Path, steps: int, device: str):
    """The export's GRPOConfig fields, plus what a probe needs: a fixed number of steps, a log every step,
    nothing saved or reported, full-length completions."""
    from trl import GRPOConfig

    config, settings = ProbeConfig(**job["config"]), job["settings"]
    return GRPOConfig(
        **job["trl"]["grpo"],
        output_dir=str(out_dir / "trl"),
        max_steps=steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=settings["seed"],
        use_cpu=device == "cpu",
        bf16=device == "cuda",
        generation_kwargs={"min_new_tokens": config.max_response_length},
    )


def measure(job: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    import torch
    import trl
    from trl import GRPOTrainer

    from autotune.probe.rank.measure import peak_memory, reset_peak
    from autotune.probe.rank.memory_wall import watch_budget

    config, settings, out_dir = ProbeConfig(**job["config"]), job["settings"], Path(job["out"])
    device = setup_device(settings)
    steps_per_round = config.train_batch_size // mini_batch_size(config, world_size)
    rounds = Rounds(settings["warmup_iterations"], settings["iterations"], steps_per_round, device == "cpu")
    steps = rounds.total * steps_per_round
    path, tokenizer = model_folder(settings, out_dir, rank)
    recorder = step_recorder(rounds)
    trainer = GRPOTrainer(
        model=path,
        reward_funcs=text_reward,
        args=grpo_args(job, out_dir, steps, device),
        train_dataset=prompt_dataset(tokenizer, config, settings["seed"], rounds.total),
        processing_class=tokenizer,
        peft_config=peft_config(job["trl"]["peft"]),
        callbacks=[recorder],
    )
    reset_peak(device)
    recorder.watch = watch_budget(job, rank)
    trainer.train()
    seconds = recorder.seconds
    if len(seconds) != steps:
        raise RuntimeError(f"TRL logged {len(seconds)} step times, not {steps}")
    untimed, timed = rounds.per_round(seconds)
    return {
        "status": Status.OK,
        "timing": {"warmup": untimed, "iterations": timed, "phases": {}},
        "peak": recorder.peak or peak_memory(device, None),
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "trl": trl.__version__,
            "platform": platform.platform(),
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "processes": trainer.accelerator.num_processes,  # TRL's own world size: the ranks trained as one
            "step_seconds": seconds,
            "tokens_per_step": _tokens_per_step(recorder.tokens),
        },
        "cpu": recorder.cpu,
    }


def peft_config(fields: dict[str, Any]):
    """TRL's own LoRA config from the export's ModelConfig fields (what `trl grpo` builds), or None."""
    if not fields.get("use_peft"):
        return None
    from trl import ModelConfig, get_peft_config

    return get_peft_config(ModelConfig(**fields))


def _tokens_per_step(cumulative: list[float]) -> float | None:
    """Prompt and completion tokens per optimizer step, all ranks (from TRL's cumulative `num_tokens`)."""
    if len(cumulative) < 2:
        return None
    return (cumulative[-1] - cumulative[0]) / (len(cumulative) - 1)


if __name__ == "__main__":
    sys.exit(run_rank(measure))
