"""Search efficiency on the cpu-tiny space: exhaustive grid vs Optuna's RandomSampler vs autotune.

    python -m bench.search_efficiency [--space cpu-tiny] [--seeds 3] [--table PATH.jsonl]

Step 1 probes every configuration of the space once, with the same probe `autotune run` uses, and keeps the
results in a table (JSON lines; resumable: an interrupted run continues where it stopped). Step 2 replays
each method against that table (a tabular benchmark: every method sees the same measurement of a config, so
the comparison is free of run-to-run noise) and prints the best feasible samples/sec found after 6, 12 and 20
probes as a fraction of the grid optimum, and the probes spent on OOM. Trials that autotune decides without a
probe (predicted_oom, inferred_oom, already measured) cost no probe.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import optuna

from autotune.config.knobs import ProbeConfig
from autotune.probe.contract import ProbeResult
from autotune.probe.launcher import run_probe
from autotune.search.space import load_space
from autotune.search.study import Budget, config_key, enqueue_seed_configs, make_sampler
from autotune.search.tuner import Tuner
from autotune.units import GIB
from bench import common

CHECKPOINTS = (6, 12, 20)
METHODS = ("random", "autotune")


def measure_grid(space, table_path: Path) -> dict[str, dict]:
    """Probe every configuration once (skipping those already in the table)."""
    table = common.grid_table(table_path)
    grid = space.grid()
    settings = common.probe_settings(space)
    table_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with table_path.open("a") as sink:
        for index, config in enumerate(grid):
            key = config_key(config)
            if key in table:
                continue
            result = run_probe(config, settings)
            table[key] = asdict(result)
            sink.write(json.dumps({"key": key, "result": table[key]}) + "\n")
            sink.flush()
            print(
                f"grid {index + 1}/{len(grid)}: {result.status} {result.samples_per_sec:.2f} samples/s "
                f"{result.peak_memory_gib:.3f} GiB ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    return table


def grid_optimum(table: dict[str, dict], budget: Budget) -> float:
    return max(
        r["samples_per_sec"]
        for r in table.values()
        if r["status"] == "ok" and r["peak_memory_bytes"] <= budget.limit
    )


def replay(method: str, seed: int, space, table: dict[str, dict], budget: Budget, max_probes: int) -> dict:
    """One search against the table: best feasible samples/sec after each probe count, and OOM probes."""
    launched: list[dict] = []

    def tabular_probe(config: ProbeConfig, settings, cancel=None) -> ProbeResult:
        row = table[config_key(config)]
        launched.append(row)
        return ProbeResult(**row)

    sampler = optuna.samplers.RandomSampler(seed=seed) if method == "random" else make_sampler(seed)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    model = common.prior_memory_model(space)
    settings = common.probe_settings(space)
    tuner = Tuner(study, space, settings, budget, model, probe=tabular_probe, prune=method == "autotune")
    if method == "autotune":
        enqueue_seed_configs(study, space)
    best_after: dict[int, float] = {}
    best = 0.0
    for _ in range(50 * max_probes):  # bounded even if the sampler keeps proposing known configs
        before = len(launched)
        tuner.step()
        if len(launched) > before:
            row = launched[-1]
            if row["status"] == "ok" and row["peak_memory_bytes"] <= budget.limit:
                best = max(best, row["samples_per_sec"])
            best_after[len(launched)] = best
        if len(launched) >= max_probes:
            break
    ooms = sum(1 for row in launched if row["status"] == "oom")
    return {
        "best_after": best_after,
        "oom_probes": ooms,
        "probes": len(launched),
        "trials": len(study.trials),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--space", default="cpu-tiny")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--table", type=Path, default=Path("bench/results/cpu-tiny-grid.jsonl"))
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(args.space)
    budget = common.space_budget(space)
    print(
        f"space {args.space}: {space.size()} configurations; budget {space.memory_budget_gib} GiB, "
        f"feasible <= {budget.limit / GIB:.3f} GiB"
    )
    table = measure_grid(space, args.table)
    optimum = grid_optimum(table, budget)
    statuses = [r["status"] for r in table.values()]
    over = sum(1 for r in table.values() if r["status"] == "ok" and r["peak_memory_bytes"] > budget.limit)
    print(
        f"grid: {len(table)} probes, optimum {optimum:.3f} samples/s; oom {statuses.count('oom')}, "
        f"ok over the headroom {over}, feasible {len(table) - statuses.count('oom') - over}"
    )
    print(f"\n{'method':10} {'seed':>4} " + " ".join(f"{f'@{n}':>7}" for n in CHECKPOINTS) + "  oom probes")
    summary: dict[str, dict[int, list[float]]] = {m: {n: [] for n in CHECKPOINTS} for m in METHODS}
    for method in METHODS:
        for seed in range(args.seeds):
            run = replay(method, seed, space, table, budget, max(CHECKPOINTS))
            fractions = [
                run["best_after"].get(n, max(run["best_after"].values(), default=0)) / optimum
                for n in CHECKPOINTS
            ]
            for n, fraction in zip(CHECKPOINTS, fractions, strict=True):
                summary[method][n].append(fraction)
            print(
                f"{method:10} {seed:4d} "
                + " ".join(f"{f:7.1%}" for f in fractions)
                + f"  {run['oom_probes']:10d}  ({run['trials']} trials for {run['probes']} probes)"
            )
    print("\nmedian over seeds (fraction of the grid optimum):")
    for method in METHODS:
        print(
            f"{method:10}      "
            + " ".join(f"{statistics.median(summary[method][n]):7.1%}" for n in CHECKPOINTS)
        )


if __name__ == "__main__":
    main()
