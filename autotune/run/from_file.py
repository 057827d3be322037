"""`autotune run --from FILE`: the user's own job as the study's space.

    job = read_job_file(Path("run_qwen2-7b.sh"), call=None)  # a verl launch script or override file, or a
                                                              # TRL config; read as its trainer reads it
    plan = job_space(job, options, device="cpu")              # the space YAML, and what the flags overrode

The recipe is the file's and is held: model, algorithm, rollout.n, train and mini batch, lengths, LoRA, KL.
The system knobs are searched around it: the micro batches, gradient checkpointing and (verl) dynamic batch
size with its token budgets. The file's own system values are the first trial, the hand-made configuration
the gain is measured against. How the file holds the states (sharding, offload) is kept, not searched.

Flags override the file, so one file serves a scaled-down rehearsal on CPU and the real study on its GPUs:
--model, --gpus, --train-batch-size, --mini-batch-size. Each override is said in one line.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.config.knobs import ProbeConfig, physical_cores
from autotune.errors import UserError
from autotune.formats.launch_script import looks_like_launch_script
from autotune.formats.read import read_target
from autotune.formats.target import Target
from autotune.formats.verl import MINI_KEY
from autotune.space.specs import (
    BUDGET,
    CHECKPOINTING,
    CRITIC_BUDGET,
    DYNAMIC,
    LOG_PROB_BUDGET,
    LOGPROB,
    MICRO,
    MINI,
    OFFLOAD_KNOBS,
    PROMPT,
    RESPONSE,
    ROLLOUT,
    SHARDING,
    TRAIN,
    WORKERS,
)
from autotune.trainers.registry import Trainer, trainer_of_file

__all__ = [
    "FileSpace",
    "JobFile",
    "check_baseline",
    "device_guess",
    "file_space",
    "job_space",
    "read_job_file",
]

CPU_STEP_TOKENS = 16_384  # a step's tokens a CPU probe measures in minutes (cpu-tiny's: 1,152 in 20 s)


@dataclass(frozen=True)
class JobFile:
    """The user's file, read as its trainer reads it."""

    path: Path
    target: Target
    trainer: Trainer  # whose file it is: the export's target
    call: int | None = None  # the launch script's trainer call (--call)

    @property
    def config(self) -> ProbeConfig:
        assert self.target.config is not None  # read_job_file refuses a file without one
        return self.target.config

    @property
    def gpus(self) -> int:
        return self.target.gpus or 1

    @property
    def mini_batch(self) -> int:
        return self.trainer.mini_batch(self.target)


@dataclass
class FileSpace:
    """The space a file makes, and what the run's flags changed of the file's job."""

    data: dict[str, Any]
    overridden: list[str] = field(default_factory=list)  # "--gpus 1 (the file: 8)", one per flag
    notes: list[str] = field(default_factory=list)  # what was adapted to run here (offload on CPU, ...)


def read_job_file(path: Path, call: int | None = None) -> JobFile:
    """`path` read as its trainer reads it (bash runs a launch script); UserError, one line, when it is not a
    trainer's file or lacks the batch sizes a study needs."""
    if not Path(path).is_file():
        raise UserError(f"--from {path}: no such file; pass your launch script, override file or TRL config")
    if _is_space(Path(path)):
        raise UserError(f"--from {path}: this is a search space; run it with --space {path}")
    target = read_target(path, call=call)
    trainer = trainer_of_file(target)
    if trainer is None:
        raise UserError(
            f"--from {path}: this is autotune's own config schema ({target.kind}), not a trainer's file: "
            f"--from takes a verl launch script, a verl override file or a TRL config; for a search space "
            f"use --space"
        )
    if call is not None and not looks_like_launch_script(Path(path).read_text(errors="replace")):
        raise UserError(
            f"--call {call}: {path} is not a launch script; --call picks one of a script's trainer calls"
        )
    if target.config is None:
        raise UserError(
            f"--from {path}: the file does not give the batch sizes a study holds (data.train_batch_size, "
            f"{MINI_KEY}, actor_rollout_ref.rollout.n and a micro batch or use_dynamic_bsz): set them in it"
        )
    return JobFile(Path(path), target, trainer, call)


def _is_space(path: Path) -> bool:
    if path.suffix not in (".yaml", ".yml"):
        return False
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and "knobs" in data


def job_space(job: JobFile, options: Any, device: str) -> FileSpace:
    """The space YAML of the file's job with the run's flags (`options`: RunOptions) applied, on `device`."""
    config = job.config
    result = FileSpace({})
    gpus = _gpus(job, options, result)  # on each node
    ranks = gpus * max(1, options.nodes)
    train = _flag(options.train_batch_size, config.train_batch_size, "--train-batch-size", result)
    mini = _flag(options.mini_batch_size, job.mini_batch, "--mini-batch-size", result)
    if not (options.model or job.target.model):
        raise UserError(f"--from {job.path}: the file names no model: pass --model")
    model = _flag(options.model, job.target.model, "--model", result)
    if options.model is None:
        _check_model(job, model)
    if options.memory_budget_gib:
        result.overridden.append(f"--memory-budget {options.memory_budget_gib:g} GiB (the file has none)")
    if options.data is not None:
        result.overridden.append(f"--data {options.data} (the prompts and lengths of the probes)")
    if device == "cpu":
        _check_cpu_size(job, train, config.sequence_length)
    knobs = _recipe_knobs(config, train, mini) | _system_knobs(job, ranks, train, mini, device, result)
    seed = _seed(job, knobs, ranks, mini, result)
    result.data = {
        "description": f"{job.path.name}: its recipe held, its system searched",
        "model": model,
        "reward_model": job.target.reward_model or "function",
        "gpus": gpus,
        "algorithm": config.algorithm,
        "rollout_n": config.rollout_n,
        "kl_coef": config.kl_coef,
        "lora": {"enabled": config.use_lora, "r": config.lora_r, "alpha": config.lora_alpha},
        "knobs": knobs,
        "seed_configs": [seed],
    }
    return result


def _check_model(job: JobFile, model: str) -> None:
    """The file's model must be here (nothing is downloaded): else one line naming --model, with the
    registry's architecture of the same name when there is one (Qwen/Qwen2-7B-Instruct: qwen2-7b)."""
    from autotune.models.catalog import MODELS

    if model in MODELS or model.lower() in MODELS or Path(model).expanduser().exists():
        return
    stem = re.sub(r"-(instruct|chat|base|it)$", "", Path(model).name.lower())
    close = difflib.get_close_matches(stem, list(MODELS), n=1, cutoff=0.8)
    same = f"--model {close[0]} (its architecture, random weights) or " if close else ""
    raise UserError(
        f"--from {job.path}: its model {model!r} is not on this machine (nothing is downloaded from a model "
        f"hub): pass {same}--model DIR (a local copy); a CPU rehearsal: --model small-llama --gpus 1"
    )


def _check_cpu_size(job: JobFile, train: int, length: int) -> None:
    """A step of the file's size is hours of a CPU's time: refused in one line with the rehearsal's flags."""
    tokens = train * length
    if tokens <= CPU_STEP_TOKENS:
        return
    raise UserError(
        f"--from {job.path}: a step of this recipe is {train} samples × {length} tokens = {tokens:,} "
        f"tokens, hours a probe on CPU (at most {CPU_STEP_TOKENS:,} here): run it on the job's GPUs, or "
        f"rehearse with a smaller batch (--train-batch-size, --mini-batch-size) and, for shorter lengths, a "
        f"copy of the file with smaller data.max_prompt_length/max_response_length"
    )


def _gpus(job: JobFile, options: Any, result: FileSpace) -> int:
    """--gpus (on each of --nodes), else the file's trainer.n_gpus_per_node (its trainer.nnodes are
    --nodes': a job over several machines is not probed on one without being told)."""
    nodes = job.trainer.nodes(job.target)
    if options.gpus is None and isinstance(nodes, int) and nodes > 1 and options.nodes != nodes:
        raise UserError(
            f"--from {job.path}: the job spans {nodes} nodes (trainer.nnodes): pass --ray ADDRESS --nodes "
            f"{nodes} to probe it as it runs, or --gpus N for a rehearsal on this machine"
        )
    if options.gpus is None:
        return max(1, job.gpus // max(1, options.nodes))
    if options.gpus * options.nodes != job.gpus:
        result.overridden.append(f"--gpus {options.gpus * options.nodes} (the file: {job.gpus})")
    return options.gpus


def _flag(given: Any, in_file: Any, flag: str, result: FileSpace) -> Any:
    if given is None or given == in_file:
        return in_file
    result.overridden.append(f"{flag} {given} (the file: {in_file})")
    return given


def _recipe_knobs(config: ProbeConfig, train: int, mini: int) -> dict[str, Any]:
    return {
        TRAIN: train,
        MINI: mini,
        PROMPT: config.max_prompt_length,
        RESPONSE: config.max_response_length,
        ROLLOUT: train,  # verl and TRL generate a step's prompts together
    }


def _system_knobs(
    job: JobFile, gpus: int, train: int, mini: int, device: str, result: FileSpace
) -> dict[str, Any]:
    """The searched system knobs around the recipe, and the holding kept as the file has it."""
    config = job.config
    per_gpu = max(1, mini // gpus)
    knobs: dict[str, Any] = {
        MICRO: _pow2_range(per_gpu),
        CHECKPOINTING: {"choices": [True, False]},
        WORKERS: _workers(config, result),
        SHARDING: config.sharding if job.trainer.shards_states and config.sharded else "replicate",
    }
    for name in OFFLOAD_KNOBS:
        offloads = getattr(config, name) and job.trainer.offloads_states
        if offloads and device != "cuda":
            result.notes.append(
                f"{name}: held off on {device} (offload moves states off a GPU; there is none to measure "
                f"it on); the tuned file keeps yours"
            )
            offloads = False
        knobs[name] = bool(offloads)
    if job.trainer.token_budgets:
        knobs[LOGPROB] = _pow2_range(max(1, train // gpus))
        knobs |= _dynamic_knobs(config, per_gpu, max(1, train // gpus))
    return knobs


def _workers(config: ProbeConfig, result: FileSpace) -> int:
    """The file's dataloader workers, held (they change no training pass): at most this machine's cores."""
    cores = physical_cores()
    if config.num_rollout_workers <= cores:
        return config.num_rollout_workers
    result.notes.append(
        f"dataloader workers: the probes use {cores} (this machine's cores), not the job's "
        f"{config.num_rollout_workers} (they load prompts, outside the passes timed); the tuned file keeps "
        f"them"
    )
    return cores


def _dynamic_knobs(config: ProbeConfig, per_gpu_mini: int, per_gpu_batch: int) -> dict[str, Any]:
    """Dynamic batch size, and token budgets of whole sequences: 1, 2, 4 … of them per micro batch, up to the
    GPU's mini batch (the update) or its whole batch (the forward passes), with the file's own budgets."""
    length = config.sequence_length
    update = [length * 2**k for k in range(int(math.log2(per_gpu_mini)) + 1)]
    forward = [length * 2**k for k in range(int(math.log2(per_gpu_batch)) + 1)]
    own = config.token_budgets if config.use_dynamic_bsz else (None, None, None)
    knobs: dict[str, Any] = {
        DYNAMIC: {"choices": [False, True]},
        BUDGET: {"choices": _with(update, own[0])},
        LOG_PROB_BUDGET: {"choices": [None, *_with(forward, own[1])]},
    }
    if config.algorithm == "ppo":
        knobs[CRITIC_BUDGET] = {"choices": [None, *_with(forward, own[2])]}
    return knobs


def _with(values: list[int], own: int | None) -> list[int]:
    return sorted(set(values) | ({own} if own else set()))


def _pow2_range(limit: int) -> dict[str, int] | int:
    """Powers of two from 1 up to `limit` (the batch knobs' grid)."""
    high = 2 ** int(math.log2(limit))
    return 1 if high == 1 else {"min": 1, "max": high}


def _seed(job: JobFile, knobs: dict[str, Any], gpus: int, mini: int, result: FileSpace) -> dict[str, Any]:
    """The file's own settings as a hand-made config: the first trial, and the baseline of the gain. A micro
    batch off the study's grid (powers of two dividing the GPU's mini batch) is probed at the nearest value
    below it, and the config's name says so."""
    config = job.config
    per_gpu = max(1, mini // gpus)
    seed: dict[str, Any] = {name: value for name, value in knobs.items() if not isinstance(value, dict)}
    snapped = []
    for name in (MICRO, LOGPROB):
        if name not in knobs:
            continue
        own = config.micro_batch_size if name == MICRO else config.forward_micro_batch_size
        limit = per_gpu if name == MICRO else max(1, seed[TRAIN] // gpus)
        seed[name] = _on_grid(own, limit)
        if seed[name] != own:
            snapped.append(f"{'micro' if name == MICRO else 'log-prob micro'} {own}→{seed[name]}")
    seed[CHECKPOINTING] = config.gradient_checkpointing
    if DYNAMIC in knobs:
        seed[DYNAMIC] = config.use_dynamic_bsz
        if config.use_dynamic_bsz:
            seed[BUDGET], seed[LOG_PROB_BUDGET] = config.token_budget, config.log_prob_max_token_len_per_gpu
            if CRITIC_BUDGET in knobs:
                seed[CRITIC_BUDGET] = config.critic_max_token_len_per_gpu
    name = f"your settings ({job.path.name}" + (f"; {', '.join(snapped)}" if snapped else "") + ")"
    if snapped:
        result.notes.append(
            f"your settings are probed with {', '.join(snapped)}: the study's micro batches are powers of "
            f"two that divide a GPU's share of the batch"
        )
    return {"name": name, **seed}


def _on_grid(value: int, limit: int) -> int:
    """The largest power of two at most `value` that divides `limit` (a GPU's share of the batch)."""
    grid = 2 ** int(math.log2(max(1, min(value, limit))))
    while limit % grid:
        grid //= 2
    return grid


def file_space(options: Any, console: Any, job: JobFile) -> tuple[dict[str, Any], str, str, FileSpace]:
    """The space YAML of --from's file for `resolve_space`: (data, source, name, what the flags changed),
    said on the console."""
    made = job_space(job, options, device_guess(options))
    say_overrides(job, made, console)
    return made.data, str(job.path), f"from-{job.path.stem}", made


def device_guess(options: Any) -> str:
    """The probes' device before it is checked: --device, else CUDA where a GPU (or a Ray cluster) is."""
    if options.device != "auto":
        return options.device
    if options.ray:
        return "cuda"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_baseline(space: Any, job: JobFile) -> None:
    """The file's own settings must be a trial of the space: the gain is measured against them."""
    from autotune.space.model import misfits

    reasons = [why for _, why in space.unfit_seeds]
    for seed in space.seed_configs:
        reasons += misfits(space, seed.config)
    if reasons:
        raise UserError(
            f"--from {job.path}: your settings cannot be probed as the baseline: {'; '.join(reasons)}"
        )


def say_overrides(job: JobFile, space: FileSpace, console: Any) -> None:
    """What the run took from the file, what the flags changed, and what was adapted to this machine."""
    console.print(
        f"--from {job.path}: {job.target.kind}, its recipe held ({job.trainer.name} reads it so)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    for line in [f"overridden: {item}" for item in space.overridden] + [f"note: {n}" for n in space.notes]:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for finding in job.target.findings:
        prefix = "note" if finding.severity == "note" else f"{job.trainer.name} would refuse the file"
        console.print(f"{prefix}: {finding.line}", markup=False, highlight=False, soft_wrap=True)
