"""The analytic memory model against the traced one at real sizes, and the trace against a real CPU run.

    python -m bench.trace collect                   # ~30 traces of 7B/13B models, 20-90 s each (resumable)
    python -m bench.trace table                     # median and worst relative error per term (Markdown)
    python -m bench.trace collect --verl-python .venv-verl/bin/python --only seed-5.1 -7b/ \
        --out bench/results/trace-verl.jsonl        # the 7B cases, their per-token math by verl 0.9.1's
    python -m bench.trace table --out bench/results/trace-verl.jsonl
    python -m bench.trace peaks --out bench/results/trace-verl.jsonl  # per config, each phase's peak
    python -m bench.trace measured                  # tiny models: trace vs a real CPU run, state and peak

`collect` appends one line per configuration to bench/results/trace.jsonl: the config, the trace
(`autotune.probe.rank.trace`, GPU layout) and the analytic terms (`predict_components`, CUDA). With
`--verl-python` each trace runs in verl's environment, its log-probs, entropy and losses by verl's own
functions (`autotune.probe.rank.verl_math`; the trace records which); `--only` keeps the cases whose name
holds one of the given strings.

The grid: the seed article's three scenarios; and for llama-2-7b, llama-2-13b and qwen2.5-7b, one knob at a
time around a base (GRPO with KL, full_shard over 2 ranks, micro batch 4, 512 + 512 tokens, checkpointing on,
full fine-tuning): micro batch 1 and 16, lengths 256 + 256 and 2048 + 2048, checkpointing off, W 1, 4 and 8,
LoRA, replicate and shard_grad_op.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from autotune.config.knobs import ProbeConfig
from autotune.memory.breakdown import MemoryBreakdown
from bench.common import RESULTS

OUT = RESULTS / "trace.jsonl"
SEED = Path(__file__).resolve().parents[1] / "tests" / "data"
BASE = {
    "algorithm": "grpo",
    "rollout_n": 4,
    "kl_coef": 0.001,
    "sharding": "full_shard",
    "train_batch_size": 64,
    "rollout_batch_size": 64,
    "micro_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "max_prompt_length": 512,
    "max_response_length": 512,
    "gradient_checkpointing": True,
}
VARIATIONS: list[tuple[str, dict[str, Any], int]] = [  # (name, knobs over BASE, ranks)
    ("base", {}, 2),
    ("m1", {"micro_batch_size": 1}, 2),
    ("m16", {"micro_batch_size": 16, "gradient_accumulation_steps": 1}, 2),
    ("len512", {"max_prompt_length": 256, "max_response_length": 256}, 2),
    ("len4096", {"max_prompt_length": 2048, "max_response_length": 2048}, 2),
    ("no-ckpt", {"gradient_checkpointing": False}, 2),
    ("w1", {}, 1),
    ("w4", {}, 4),
    ("w8", {}, 8),
    ("lora", {"use_lora": True, "lora_r": 64}, 2),
    ("replicate", {"sharding": "replicate"}, 2),
    ("shard-grad-op", {"sharding": "shard_grad_op"}, 2),
]
MODELS = ("llama-2-7b", "llama-2-13b", "qwen2.5-7b")
SCENARIOS = (
    ("seed-5.1", "seed_scenario_1.yaml", 2),
    ("seed-5.2", "seed_scenario_2.yaml", 4),
    ("seed-5.3", "seed_scenario_3.yaml", 1),
)


# The scale grid (`--grid scale`): 32B and 72B full-parameter GRPO as verl's large tuning scripts run them
# (n=5 with KL, full_shard, checkpointing, dynamic batch size; 1024 + 2048 tokens), over 8 and 32 GPUs, with
# param and optimizer offload and without, at token budgets of 16k and 24k per GPU.
SCALE_BASE = {
    "algorithm": "grpo",
    "rollout_n": 5,
    "kl_coef": 0.001,
    "sharding": "full_shard",
    "train_batch_size": 1280,
    "rollout_batch_size": 1280,
    "micro_batch_size": 8,
    "gradient_accumulation_steps": 4,
    "max_prompt_length": 1024,
    "max_response_length": 2048,
    "gradient_checkpointing": True,
    "use_dynamic_bsz": True,
}
SCALE_MODELS = (("qwen2.5-32b", 8), ("qwen2.5-72b", 32))
SCALE_VARIATIONS: list[tuple[str, dict[str, Any]]] = [
    (
        "dyn16k-offload",
        {"ppo_max_token_len_per_gpu": 16384, "param_offload": True, "optimizer_offload": True},
    ),
    (
        "dyn24k-offload",
        {"ppo_max_token_len_per_gpu": 24576, "param_offload": True, "optimizer_offload": True},
    ),
    ("dyn24k", {"ppo_max_token_len_per_gpu": 24576}),
]


def _scale_cases() -> list[dict[str, Any]]:
    cases = []
    for model, gpus in SCALE_MODELS:
        for name, knobs in SCALE_VARIATIONS:
            config = dataclasses.replace(ProbeConfig(), **{**SCALE_BASE, **knobs})
            config = dataclasses.replace(
                config, log_prob_max_token_len_per_gpu=config.ppo_max_token_len_per_gpu
            )
            cases.append(
                {
                    "name": f"scale/{model}/{name}",
                    "model": model,
                    "reward": None,
                    "gpus": gpus,
                    "config": config.to_dict(),
                }
            )
    return cases


def _cases(grid: str = "main") -> list[dict[str, Any]]:
    if grid == "scale":
        return _scale_cases()
    from autotune.formats.read import read_target
    from autotune.models.names import registry_name

    cases = []
    for name, file, gpus in SCENARIOS:
        target = read_target(SEED / file, gpus)
        reward = registry_name(target.reward_model) if target.reward_model else None
        assert target.config is not None
        cases.append(
            {
                "name": name,
                "model": registry_name(target.model),
                "reward": reward,
                "gpus": gpus,
                "config": target.config.to_dict(),
            }
        )
    for model in MODELS:
        for name, knobs, gpus in VARIATIONS:
            config = dataclasses.replace(ProbeConfig(), **{**BASE, **knobs})
            cases.append(
                {
                    "name": f"{model}/{name}",
                    "model": model,
                    "reward": None,
                    "gpus": gpus,
                    "config": config.to_dict(),
                }
            )
    return cases


def _config(case: dict[str, Any]) -> ProbeConfig:
    names = {f.name for f in dataclasses.fields(ProbeConfig)}
    return ProbeConfig(**{k: v for k, v in case["config"].items() if k in names})


def _trace(spec: Any, reward: Any, config: ProbeConfig, gpus: int, verl_python: str | None) -> Any:
    """In this process with autotune's functions; in verl's python (a process of its own) with verl's."""
    from autotune.probe.rank.trace import trace_memory
    from autotune.probe.traced import TraceJob, run_trace

    if verl_python:
        return run_trace(TraceJob(spec, reward, config, gpus, "cuda", verl_python))
    return trace_memory(spec, reward, config, gpus)


def collect(
    out: Path, verl_python: str | None = None, only: list[str] | None = None, grid: str = "main"
) -> None:
    from autotune.memory.architecture import Architecture
    from autotune.memory.breakdown import predict_components
    from autotune.models.catalog import resolve_model
    from autotune.probe.traced import TraceUnavailable

    done = {json.loads(line)["name"] for line in out.read_text().splitlines()} if out.exists() else set()
    for case in _cases(grid):
        if case["name"] in done or (only and not any(part in case["name"] for part in only)):
            continue
        spec = resolve_model(case["model"])
        reward = resolve_model(case["reward"]) if case["reward"] else None
        config = _config(case)
        record = dict(case)
        try:
            trace = _trace(spec, reward, config, case["gpus"], verl_python)
            record["trace"] = trace.to_dict()
        except TraceUnavailable as error:
            record["trace_error"] = str(error)
        arch = Architecture.from_specs(spec, reward)
        record["analytic"] = predict_components(arch, config, case["gpus"], "cuda").to_dict()
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        seconds = record.get("trace", {}).get("seconds", 0)
        print(f"{case['name']}: {seconds:.0f} s {record.get('trace_error', '')}", flush=True)


def rows_of(record: dict[str, Any]) -> list:
    """The comparison rows (`autotune.probe.traced.compare`) of one collected record: its trace against the
    analytic terms by today's model."""
    from autotune.probe.traced import MemoryTrace, compare

    trace = MemoryTrace.from_dict(record["trace"])
    return compare(trace, _analytic(record))


def _analytic(record: dict[str, Any]) -> MemoryBreakdown:
    """The analytic terms by today's model (the file keeps those of the day it was collected)."""
    from autotune.memory.architecture import Architecture
    from autotune.memory.breakdown import predict_components
    from autotune.models.catalog import resolve_model

    reward = resolve_model(record["reward"]) if record["reward"] else None
    arch = Architecture.from_specs(resolve_model(record["model"]), reward)
    return predict_components(arch, _config(record), record["gpus"], "cuda")


def table(path: Path) -> None:
    """Per term: the median and worst relative error over the configurations, and how many disagree (over
    10% and over 64 MiB: `TraceRow.disagrees`)."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    traced = [r for r in records if "trace" in r]
    by_term: dict[str, list[tuple[Any, str]]] = {}
    for record in traced:
        for row in rows_of(record):
            by_term.setdefault(row.term, []).append((row, record["name"]))
    print(f"{len(traced)} configurations traced, {len(records) - len(traced)} not traced\n")
    print("| term | median error | worst error (config: analytic vs traced GiB) | disagree |")
    print("|---|---|---|---|")
    for term, rows in by_term.items():
        finite = [(r, n) for r, n in rows if r.error is not None and r.error != float("inf")]
        if not finite:
            continue
        worst, name = max(finite, key=lambda rn: abs(rn[0].error))
        median = statistics.median(r.error for r, _ in finite)
        said = f"{worst.error:+.0%} ({name}: {worst.analytic / 2**30:.2f} vs {worst.traced / 2**30:.2f})"
        disagree = sum(r.disagrees for r, _ in rows)
        print(f"| {term} | {median:+.1%} | {said} | {disagree}/{len(rows)} |")
    for record in records:
        if "trace_error" in record:
            print(f"\nnot traced: {record['name']}: {record['trace_error']}")
    seconds = [r["trace"]["seconds"] for r in traced]
    print(f"\ntrace time: median {statistics.median(seconds):.0f} s, longest {max(seconds):.0f} s")


PEAKS = ("scoring: peak", "backward: peak", "update: peak")


def peaks(path: Path) -> None:
    """Per configuration, each phase's peak: analytic vs traced GiB and the difference (Markdown), and the
    per-token functions the trace ran."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    print("| config | " + " | ".join(PEAKS) + " |")
    print("|---|" + "---|" * len(PEAKS))
    functions = set()
    for record in (r for r in records if "trace" in r):
        rows = {row.term: row for row in rows_of(record)}
        cells = [
            f"{rows[t].analytic / 2**30:.2f} vs {rows[t].traced / 2**30:.2f} ({rows[t].error:+.1%})"
            if t in rows and rows[t].error is not None
            else "—"
            for t in PEAKS
        ]
        print(f"| {record['name']} | " + " | ".join(cells) + " |")
        functions.add(json.dumps(record["trace"].get("functions", {}), sort_keys=True))
    for found in sorted(functions):
        print(f"\nper-token functions traced: {found}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["collect", "table", "peaks", "measured"])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--verl-python", help="collect: trace in this verl 0.9.1 python, with verl's functions"
    )
    parser.add_argument("--only", nargs="+", help="collect: only the cases whose name holds one of these")
    parser.add_argument(
        "--grid", choices=["main", "scale"], default="main", help="collect: the 7B-13B grid or 32B-72B"
    )
    args = parser.parse_args(argv)
    if args.command == "collect":
        collect(args.out, args.verl_python, args.only, args.grid)
    elif args.command == "table":
        table(args.out)
    elif args.command == "peaks":
        peaks(args.out)
    else:
        from bench.trace_measured import main as measured

        return measured()
    return 0


if __name__ == "__main__":
    sys.exit(main())
