"""Sharding: per-rank peak memory and samples/sec of replicate / full_shard / shard_grad_op, with and without
gradient checkpointing, on 2 gloo ranks, against the memory model; and the model's predictions for GPU jobs.

    .venv/bin/python -m bench.sharding [--model small-llama] [--iterations 1] [--out FILE.jsonl]
    .venv/bin/python -m bench.sharding --from bench/results/sharding.jsonl     # the tables again, no probes

Measured (CPU, `--model`, 2 ranks; GRPO n=2 without KL: the actor alone, and PPO with KL: actor, critic and
reference), each configuration once (its warm-up, then `--iterations`):

- the peak RSS of the larger rank, and the training states that rank holds, counted tensor by tensor at the
  end of the iteration (weights, gradients, Adam's states: `state_bytes` in a probe's rank_peaks);
- samples/sec;
- the memory model's prediction: its CPU prior, and calibrated leave-one-out (constant and factor fitted on
  the other measured configurations of the same recipe, then this one predicted).

Aims: the calibrated model within 10% of every measured peak; full_shard's states within 10% of 1/W of
replicate's. Offload runs on CUDA only: its figures here are the model's predictions for GPU jobs, with the
seed article's own figures beside them and the settings assumed for each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd

from autotune.config.knobs import ProbeConfig
from autotune.memory.architecture import Architecture
from autotune.memory.calibration import MemoryModel
from autotune.models.catalog import resolve_model, resolve_reward_model
from autotune.probe.contract import ProbeSettings
from autotune.probe.launcher import run_probe
from autotune.units import GIB
from bench import common

DEFAULT_OUT = common.RESULTS / "sharding.jsonl"
SHARDINGS = ("replicate", "full_shard", "shard_grad_op")
GPUS = 2
RECIPES = {  # the shapes of a probe: what trains and what is held
    "grpo": ProbeConfig(algorithm="grpo", rollout_n=2, kl_coef=0.0),
    "ppo+kl": ProbeConfig(algorithm="ppo", kl_coef=0.05),
}
PEAK_AIM, STATES_AIM = 0.10, 0.10


def measured_configs() -> list[tuple[str, ProbeConfig]]:
    return [
        (recipe, dataclasses.replace(base, sharding=sharding, gradient_checkpointing=checkpointing))
        for recipe, base in RECIPES.items()
        for sharding in SHARDINGS
        for checkpointing in (True, False)
    ]


def measure(model: str, iterations: int, out: Path) -> list[dict[str, Any]]:
    rows = []
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as sink:
        sink.write(json.dumps({"run": common.machine(), "model": model, "gpus": GPUS}) + "\n")
        for recipe, config in measured_configs():
            settings = ProbeSettings(
                model=model, device="cpu", world_size=GPUS, iterations=iterations, timeout_seconds=900
            )
            result = run_probe(config, settings)
            largest = max(result.rank_peaks, key=lambda peak: peak["bytes"]) if result.rank_peaks else {}
            row = {
                "recipe": recipe,
                "sharding": config.sharding,
                "checkpointing": config.gradient_checkpointing,
                "status": result.status,
                "peak_bytes": result.peak_memory_bytes,
                "state_bytes": largest.get("state_bytes", {}),
                "samples_per_sec": result.samples_per_sec,
                "config": config.to_dict(),
            }
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            print(f"{recipe:7} {config.sharding:13} ckpt={config.gradient_checkpointing!s:5} {result.status}")
            rows.append(row)
    return rows


def load(path: Path) -> tuple[str, list[dict[str, Any]]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines[0]["model"], [line for line in lines[1:] if "recipe" in line]


def predictions(model: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    arch = Architecture.from_specs(resolve_model(model))
    ok = [r for r in rows if r["status"] == "ok"]
    table = []
    for row in ok:
        config = ProbeConfig(**row["config"])
        prior = MemoryModel(arch, GPUS, "cpu")
        others = [
            (ProbeConfig(**o["config"]), o["peak_bytes"])
            for o in ok
            if o["recipe"] == row["recipe"] and o is not row
        ]
        fitted = MemoryModel(arch, GPUS, "cpu").calibrate(others)
        states = sum(row["state_bytes"].values())
        table.append(
            {
                "recipe": row["recipe"],
                "sharding": row["sharding"],
                "ckpt": row["checkpointing"],
                "peak GiB": row["peak_bytes"] / GIB,
                "prior GiB": prior.predict(config) / GIB,
                "calibrated GiB": fitted.predict(config) / GIB,
                "error": (fitted.predict(config) - row["peak_bytes"]) / row["peak_bytes"],
                "states GiB": states / GIB,
                "model states GiB": _model_states(arch, config) / GIB,
                "samples/s": row["samples_per_sec"],
            }
        )
    return pd.DataFrame(table)


def _model_states(arch: Architecture, config: ProbeConfig) -> int:
    b = MemoryModel(arch, GPUS, "cpu").breakdown(config)
    return b.weights + b.gradients + b.optimizer


def states_ratio(table: pd.DataFrame) -> pd.DataFrame:
    """full_shard's measured states over replicate's / W, per recipe and checkpointing."""
    rows = []
    for (recipe, ckpt), group in table.groupby(["recipe", "ckpt"]):
        by = group.set_index("sharding")["states GiB"]
        if {"replicate", "full_shard"} <= set(by.index):
            rows.append(
                {
                    "recipe": recipe,
                    "ckpt": ckpt,
                    "ratio": by["full_shard"] / (by["replicate"] / GPUS),
                }
            )
    return pd.DataFrame(rows)


# --- GPU jobs: the model's predictions, beside the article's figures -------------------------------------

GPU_JOBS: list[tuple[str, str, str, int, ProbeConfig, str]] = [
    # (label, model, reward model, GPUs, config, the article's figure)
    *[
        (
            f"§4.3 7B FSDP micro {m}",
            "llama-2-7b",
            "function",
            8,
            ProbeConfig(
                rollout_batch_size=128,
                train_batch_size=512,
                micro_batch_size=m,
                gradient_accumulation_steps=4 if m == 16 else 2,
                max_prompt_length=200,
                max_response_length=256,
                sharding="full_shard",
            ),
            figure,
        )
        for m, figure in ((32, "≈ 38 GiB"), (16, "≈ 29 GiB"))
    ],
    (
        "§5.1 7B LoRA r64, 2× A100 80G",
        "llama-2-7b",
        "deberta-v3-large",
        2,
        ProbeConfig(
            rollout_batch_size=128,
            train_batch_size=512,
            micro_batch_size=32,
            gradient_accumulation_steps=4,
            num_rollout_workers=4,
            max_prompt_length=200,
            max_response_length=256,
            use_lora=True,
            lora_r=64,
            lora_alpha=128,
        ),
        "≈ 42 GiB",
    ),
    *[
        (
            f"§5.2 13B full, 4× A100 40G, {label}",
            "llama-2-13b",
            "deberta-v3-large",
            4,
            ProbeConfig(
                rollout_batch_size=64,
                train_batch_size=1024,
                micro_batch_size=16,
                gradient_accumulation_steps=4,
                num_rollout_workers=6,
                max_prompt_length=128,
                max_response_length=192,
                **holding,
            ),
            "(runs in the article)",
        )
        for label, holding in (
            ("full_shard", {"sharding": "full_shard"}),
            (
                "+ param/optimizer offload",
                {"sharding": "full_shard", "param_offload": True, "optimizer_offload": True},
            ),
            ("+ offload_policy", {"sharding": "full_shard", "offload_policy": True}),
        )
    ],
]


def gpu_predictions() -> pd.DataFrame:
    rows = []
    for label, model, reward, gpus, config, figure in GPU_JOBS:
        spec = resolve_model(model)
        reward_spec = resolve_reward_model(reward)
        arch = Architecture.from_specs(spec, reward_spec)
        b = MemoryModel(arch, gpus, "cuda").breakdown(config)
        rows.append(
            {
                "job": label,
                "predicted GiB": MemoryModel(arch, gpus, "cuda").predict(config) / GIB,
                "states GiB": (b.weights + b.gradients + b.optimizer) / GIB,
                "peak phase": b.peak_phase,
                "the article": figure,
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="small-llama")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--from", dest="source", type=Path, help="print the tables of an earlier run")
    args = parser.parse_args(argv)
    if args.source:
        model, rows = load(args.source)
    else:
        model, rows = args.model, measure(args.model, args.iterations, args.out)
    table = predictions(model, rows)
    pd.set_option("display.width", 200)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    worst = table["error"].abs().max()
    verdict = "met" if worst <= PEAK_AIM else "not met"
    print(f"\nworst calibrated error {worst:.1%} (aim ≤ {PEAK_AIM:.0%}): {verdict}")
    ratios = states_ratio(table)
    print(ratios.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    off = (ratios["ratio"] - 1).abs().max()
    print(f"full_shard states vs replicate/W: worst {off:.1%} off (aim ≤ {STATES_AIM:.0%})")
    print("\nGPU jobs (the memory model with CUDA priors; offload is not measured on this machine):")
    print(gpu_predictions().to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
