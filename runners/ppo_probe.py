"""Probe program: one rank of a short PPO/GRPO run that measures one batch configuration.

Launched by path by `autotune.probe.launcher` (never imported by the tuner), once per rank, with RANK/
WORLD_SIZE/MASTER_ADDR/MASTER_PORT in the environment. Reads `--job JOB.json` ({"config", "settings"}), writes
`--out DIR/result.rank<R>.json`. Exit codes (autotune.probe.contract): 0 measured, OOM_EXIT_CODE out of
memory (result written), anything else a crash.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from autotune.probe.conditions import CpuWindow
from autotune.probe.rank.process import return_freed_memory, run_rank
from autotune.status import Status


def environment(device) -> dict[str, Any]:
    import peft
    import torch
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "gpu": None,
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
    return env


def setup_device(settings: dict[str, Any], rank: int, world_size: int, sharded: bool):
    import torch
    import torch.distributed as dist

    if settings["device"] == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
        budget = settings.get("memory_budget_gib")
        if budget:
            # Emulate a smaller card: the caching allocator raises a real OOM beyond this fraction.
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget * 1024**3 / total), device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        return_freed_memory()
    if world_size > 1 or sharded:  # FSDP needs a process group even on one rank
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, device_id=device if device.type == "cuda" else None
        )
    return device


def measure(job: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    import torch

    from autotune.config.job_lengths import JobLengths
    from autotune.config.knobs import ProbeConfig
    from autotune.config.passes import Passes
    from autotune.models.catalog import resolve_model, resolve_reward_model
    from autotune.models.tokenizer import load_tokenizer
    from autotune.probe.rank.measure import NvmlSampler, peak_memory, reset_peak, state_bytes
    from autotune.probe.rank.memory_wall import watch_budget
    from autotune.probe.rank.model_build import build_models
    from autotune.probe.rank.packing import PassPacking
    from autotune.probe.rank.ppo import StepContext, iteration, warmup_config
    from autotune.probe.rank.prompts import prompt_batches

    config = ProbeConfig(**job["config"])
    settings = job["settings"]
    device = setup_device(settings, rank, world_size, config.sharded)
    torch.manual_seed(settings["seed"] + rank)
    actor_spec = resolve_model(settings["model"], settings["weights"], settings["trust_remote_code"])
    reward_spec = resolve_reward_model(settings["reward_model"])
    tokenizer = load_tokenizer(actor_spec)
    # Start the DataLoader workers before the models exist, so the forked workers stay small.
    prompts_per_call = config.rollout_batch_size // (world_size * config.rollout_n)
    texts = json.loads(Path(settings["prompts_file"]).read_text()) if settings.get("prompts_file") else None
    batches = prompt_batches(
        tokenizer,
        prompts_per_call,
        config.max_prompt_length,
        config.num_rollout_workers,
        rank,
        settings["seed"],
        texts=texts,
    )
    models = build_models(actor_spec, reward_spec, config, device, world_size)
    reset_peak(device.type)
    watch = watch_budget(job, rank)
    sampler = NvmlSampler(device.index or 0) if device.type == "cuda" else None
    ctx = StepContext(
        config=config,
        device=device,
        world_size=world_size,
        pad_token_id=tokenizer.pad_token_id,
        compute_dtype=torch.bfloat16 if device.type == "cuda" else None,
        passes=settings.get("passes", Passes.VERL),  # StepContext makes it a Passes
        lengths=JobLengths.from_dict(settings.get("lengths")),
        vocab=actor_spec.config.vocab_size,
        generator=torch.Generator().manual_seed(settings["seed"] * 7919 + rank),
    )
    generator = torch.Generator().manual_seed(settings["seed"])

    warm_ctx = dataclasses.replace(
        ctx, config=warmup_config(config, world_size), packing=defaultdict(PassPacking)
    )
    warmup = [
        iteration(models, warm_ctx, batches, generator)["seconds"]
        for _ in range(settings["warmup_iterations"])
    ]
    if sampler:
        sampler.measuring(True)
    window = CpuWindow()  # what other work took of the machine while these iterations were measured
    measured = [iteration(models, ctx, batches, generator) for _ in range(settings["iterations"])]
    if watch is not None:  # done: a peak past the budget in the watch's last 50 ms is the parent's to judge
        watch.set()
    packing = {name: _per_iteration(p, len(measured)) for name, p in ctx.packing.items()}
    cpu = window.stop()
    utilization = sampler.stop() if sampler else None
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return {
        "status": Status.OK,
        "timing": {
            "warmup": warmup,
            "iterations": [m["seconds"] for m in measured],
            "phases": {phase: [m["phases"].get(phase, 0.0) for m in measured] for phase in ctx.phases},
        },
        "peak": {**peak_memory(device.type, sampler), "state_bytes": state_bytes(models, device.type)},
        "gpu_utilization": utilization,
        "packing": packing,
        "environment": environment(device),
        "cpu": cpu,
    }


def _per_iteration(packing, iterations: int) -> dict[str, int]:
    """A pass's packing over the measured iterations, as one iteration's micro batches and tokens."""
    return {
        "micro_batches": packing.micro_batches // max(1, iterations),
        "tokens": packing.tokens // max(1, iterations),
        "max_tokens": packing.max_tokens,
    }


if __name__ == "__main__":
    sys.exit(run_rank(measure))
