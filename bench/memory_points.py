"""Collect measured peak memory of CPU probes, and check the memory model against them.

    python -m bench.memory_points collect --out /tmp/points.jsonl     # ~20 probes, 10-30 s each
    python -m bench.memory_points check --points /tmp/points.jsonl    # calibrate on 3, predict the rest

Each line of the points file is one probe: {"name", "model", "reward_model", "gpus", "config",
"status", "peak_memory_bytes"}. Only `ok` probes' peaks are used.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

# (name, model, reward model, ranks, knob overrides). Defaults: T=16, R=8, g=2, Lp=32, Lr=16 (ProbeConfig).
POINTS: list[tuple[str, str, str, int, dict]] = [
    ("m1-r8", "tiny-llama", "function", 1, {"micro_batch_size": 1, "max_response_length": 8}),
    ("m4-r8", "tiny-llama", "function", 1, {"micro_batch_size": 4, "max_response_length": 8}),
    (
        "m16-r8",
        "tiny-llama",
        "function",
        1,
        {"micro_batch_size": 16, "gradient_accumulation_steps": 1, "max_response_length": 8},
    ),
    ("m1-r32", "tiny-llama", "function", 1, {"micro_batch_size": 1, "max_response_length": 32}),
    ("m4-r32", "tiny-llama", "function", 1, {"micro_batch_size": 4, "max_response_length": 32}),
    (
        "m16-r32",
        "tiny-llama",
        "function",
        1,
        {"micro_batch_size": 16, "gradient_accumulation_steps": 1, "max_response_length": 32},
    ),
    ("m4-r64", "tiny-llama", "function", 1, {"micro_batch_size": 4, "max_response_length": 64}),
    (
        "m16-r64",
        "tiny-llama",
        "function",
        1,
        {"micro_batch_size": 16, "gradient_accumulation_steps": 1, "max_response_length": 64},
    ),
    (
        "m16-r64-ckpt",
        "tiny-llama",
        "function",
        1,
        {
            "micro_batch_size": 16,
            "gradient_accumulation_steps": 1,
            "max_response_length": 64,
            "gradient_checkpointing": True,
        },
    ),
    (
        "m4-r64-R16",
        "tiny-llama",
        "function",
        1,
        {"micro_batch_size": 4, "max_response_length": 64, "rollout_batch_size": 16},
    ),
    (
        "m4-r64-lp16",
        "tiny-llama",
        "function",
        1,
        {"micro_batch_size": 4, "max_response_length": 64, "log_prob_micro_batch_size": 16},
    ),
    (
        "m16-r64-grpo",
        "tiny-llama",
        "function",
        1,
        {
            "micro_batch_size": 16,
            "gradient_accumulation_steps": 1,
            "max_response_length": 64,
            "algorithm": "grpo",
            "rollout_n": 2,
        },
    ),
    (
        "m16-r64-lora",
        "tiny-llama",
        "function",
        1,
        {
            "micro_batch_size": 16,
            "gradient_accumulation_steps": 1,
            "max_response_length": 64,
            "use_lora": True,
        },
    ),
    (
        "m16-r128",
        "tiny-llama",
        "function",
        1,
        {"micro_batch_size": 16, "gradient_accumulation_steps": 1, "max_response_length": 128},
    ),
    (
        "m32-r64-T32",
        "tiny-llama",
        "function",
        1,
        {
            "micro_batch_size": 32,
            "gradient_accumulation_steps": 1,
            "max_response_length": 64,
            "train_batch_size": 32,
            "rollout_batch_size": 32,
        },
    ),
    ("m4-r64-W2", "tiny-llama", "function", 2, {"micro_batch_size": 4, "max_response_length": 64}),
    ("m4-r32-deberta", "tiny-llama", "tiny-deberta", 1, {"micro_batch_size": 4, "max_response_length": 32}),
    ("qwen-m4-r32", "tiny-qwen2", "function", 1, {"micro_batch_size": 4, "max_response_length": 32}),
    (
        "qwen-m16-r64",
        "tiny-qwen2",
        "function",
        1,
        {"micro_batch_size": 16, "gradient_accumulation_steps": 1, "max_response_length": 64},
    ),
    # verl's dynamic batch size: micro batches cut by token budgets (packed whole sequences at the limits)
    ("dyn-b96", "tiny-llama", "function", 1, {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 96}),
    (
        "dyn-b384-lp768",
        "tiny-llama",
        "function",
        1,
        {
            "micro_batch_size": 4,
            "use_dynamic_bsz": True,
            "ppo_max_token_len_per_gpu": 384,
            "log_prob_max_token_len_per_gpu": 768,
        },
    ),
    (
        "dyn-r64-b1024-lora",
        "tiny-llama",
        "function",
        1,
        {
            "micro_batch_size": 16,
            "gradient_accumulation_steps": 1,
            "max_response_length": 64,
            "use_lora": True,
            "use_dynamic_bsz": True,
            "ppo_max_token_len_per_gpu": 1024,
        },
    ),
    (
        "qwen-dyn-b480",
        "tiny-qwen2",
        "function",
        1,
        {
            "micro_batch_size": 16,
            "gradient_accumulation_steps": 1,
            "use_dynamic_bsz": True,
            "ppo_max_token_len_per_gpu": 480,
        },
    ),
]


def run_probe(model: str, reward: str, gpus: int, sets: dict) -> dict:
    args = [
        sys.executable,
        "-m",
        "autotune",
        "probe",
        "--model",
        model,
        "--reward-model",
        reward,
        "--device",
        "cpu",
        "--gpus",
        str(gpus),
        "--json",
        "--iterations",
        "1",
    ]
    for key, value in sets.items():
        args += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"status": "crashed", "message": proc.stderr[-2000:]}


def collect(out: Path, names: set[str] | None) -> None:
    with out.open("a", encoding="utf-8") as f:
        for name, model, reward, gpus, sets in POINTS:
            if names and name not in names:
                continue
            result = run_probe(model, reward, gpus, sets)
            row = {
                "name": name,
                "model": model,
                "reward_model": reward,
                "gpus": gpus,
                "config": result.get("config", sets),
                "status": result.get("status"),
                "peak_memory_bytes": result.get("peak_memory_bytes"),
                "message": result.get("message", ""),
            }
            print(json.dumps({k: row[k] for k in ("name", "status", "peak_memory_bytes")}), flush=True)
            f.write(json.dumps(row) + "\n")
            f.flush()


def load(points: Path) -> list[dict]:
    rows = [json.loads(line) for line in points.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["status"] == "ok"]


def check(points: Path, calibrate_on: list[str]) -> None:
    from autotune.config.knobs import ProbeConfig
    from autotune.memory.calibration import MemoryModel
    from bench.common import memory_model_for

    rows = load(points)
    models: dict[tuple, MemoryModel] = {}

    def model_for(row: dict) -> MemoryModel:
        key = (row["model"], row["reward_model"], row["gpus"])
        if key not in models:
            models[key] = memory_model_for(*key, device="cpu")
        return models[key]

    def errors(label: str, shared: MemoryModel | None) -> None:
        errs = []
        for row in rows:
            config = ProbeConfig(**row["config"])
            model = model_for(row)
            if shared is not None:
                model = model.with_calibration(shared.constant, shared.factor)
            raw = model.raw_bytes(config)
            err = model.relative_error(config, row["peak_memory_bytes"])
            held = "" if row["name"] not in calibrate_on else " (calibration)"
            print(
                f"  {row['name']:16s} measured {row['peak_memory_bytes'] / 2**20:8.1f} MiB  raw "
                f"{raw / 2**20:8.1f}  predicted {model.predict(config) / 2**20:8.1f}  err {err:+.3f}{held}"
            )
            if row["name"] not in calibrate_on:
                errs.append(abs(err))
        print(
            f"{label}: held-out points {len(errs)}, median |err| {statistics.median(errs):.3f}, "
            f"worst {max(errs):.3f}"
        )

    prior = model_for(rows[0])
    errors("prior (uncalibrated)", None)
    fitted = prior.with_calibration(prior.constant, prior.factor)
    fitted.calibrate(
        [(ProbeConfig(**r["config"]), r["peak_memory_bytes"]) for r in rows if r["name"] in calibrate_on]
    )
    print(
        f"calibrated on {calibrate_on}: constant {fitted.constant / 2**20:.1f} MiB, "
        f"factor {fitted.factor:.3f}"
    )
    errors("calibrated", fitted)
    triples(rows, model_for)


def triples(rows: list[dict], model_for) -> None:
    """Every choice of 3 calibration points (tiny-llama, one rank): the spread of held-out errors."""
    import itertools

    from autotune.config.knobs import ProbeConfig
    from autotune.memory.calibration import fit_constant_and_factor

    pool = [
        r for r in rows if r["model"] == "tiny-llama" and r["gpus"] == 1 and r["reward_model"] == "function"
    ]
    raw = {r["name"]: float(model_for(r).raw_bytes(ProbeConfig(**r["config"]))) for r in rows}
    medians, worsts = [], []
    for chosen in itertools.combinations(pool, 3):
        names = {r["name"] for r in chosen}
        prior = model_for(chosen[0]).factor
        constant, factor = fit_constant_and_factor(
            [(raw[r["name"]], r["peak_memory_bytes"]) for r in chosen], prior
        )
        errs = [
            abs(constant + factor * raw[r["name"]] - r["peak_memory_bytes"]) / r["peak_memory_bytes"]
            for r in rows
            if r["name"] not in names
        ]
        medians.append(statistics.median(errs))
        worsts.append(max(errs))
    medians.sort()
    worsts.sort()
    q = len(medians)
    print(
        f"all {q} triples of {len(pool)} tiny-llama points, held-out errors over all {len(rows)} points: "
        f"median |err| p50 {medians[q // 2]:.3f} p90 {medians[9 * q // 10]:.3f} max {medians[-1]:.3f}; "
        f"worst |err| p50 {worsts[q // 2]:.3f} p90 {worsts[9 * q // 10]:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--only", nargs="*", help="point names to run (default: all)")
    k = sub.add_parser("check")
    k.add_argument("--points", type=Path, required=True)
    k.add_argument("--calibrate-on", nargs="*", default=["m1-r8", "m16-r32", "m4-r64"])
    args = parser.parse_args()
    if args.command == "collect":
        collect(args.out, set(args.only) if args.only else None)
    else:
        check(args.points, args.calibrate_on)


if __name__ == "__main__":
    main()
