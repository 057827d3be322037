"""Probe fidelity: does the short probe rank configurations the way a long run does? (tiny-llama, CPU)

    .venv/bin/python -m bench.fidelity [--space cpu-tiny] [--configs 12] [--repeats 3] \
        [--long-iterations 10] [--out bench/results/fidelity.jsonl]

Picks `--configs` configurations from the space's grid, deterministically and spread over every searched
knob (a Latin hypercube over the knobs' values, each point snapped to the nearest valid configuration; the
memory budget is ignored: configurations that would not fit are measured too, flagged in the `fits` column,
and the rank correlation is also given over those that fit). For each it runs the short probe `autotune run`
launches (the space's warm-up and iterations; no emulated budget) `--repeats` times and one long probe (same
warm-up, `--long-iterations` measured iterations), and prints:

- per configuration: samples/sec of the short probes (median) and of the long run, their relative gap, the
  short probes' repeat-to-repeat spread, and the spread of iterations inside the long run;
- Spearman rank correlations: short vs long (the fidelity), and short vs short between repeats (the
  ceiling: no probe can rank configurations more consistently than it agrees with itself);
- from the long runs' per-iteration times: how well the mean of the first k iterations ranks configurations
  against the mean of the later ones (what more measured iterations per probe would buy) and how much slower
  the first measured iteration is than the rest (an incomplete warm-up);
- the noise of one short probe, of one iteration, and between probe processes (what is left).

`--probe-iterations K` / `--probe-warmup K` measure what another probe default would give instead.

Each probe is one JSON line in `--out` (after a `run` header line; a `summary` line closes the file) with the
load average at its end, so that a run taken on a busy machine is recognisable; the probe itself keeps one
or two cores busy. `python -m bench.memory_model --from` reads the same file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import time
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import pandas as pd

from autotune.config.knobs import ProbeConfig
from autotune.probe import forkserver, launcher
from autotune.probe.contract import ProbeSettings
from autotune.probe.launcher import run_probe
from autotune.space.loading import load_space, with_settings
from autotune.space.model import SearchSpace, knob_value
from autotune.space.specs import KNOBS
from autotune.units import GIB
from bench import common

DEFAULT_OUT = common.RESULTS / "fidelity.jsonl"
SHORT, LONG = "short", "long"
LABELS = {
    "rollout_batch_size": "R",
    "micro_batch_size": "m",
    "mini_batch_size": "M",
    "gradient_accumulation_steps": "g",
    "num_rollout_workers": "w",
    "max_response_length": "Lr",
    "max_prompt_length": "Lp",
    "train_batch_size": "T",
    "log_prob_micro_batch_size": "lm",
    "gradient_checkpointing": "ckpt",
    "sharding": "",
    "param_offload": "param_offload=",
    "optimizer_offload": "optimizer_offload=",
    "offload_policy": "offload_policy=",
}


# ------------------------------------------------------------------------------------ choosing configs


def searched_knobs(space: SearchSpace) -> list[str]:
    """The knobs whose value varies over the grid (fixed ones cannot be spread)."""
    return [k.name for k in space.knobs if k.searched]


def coordinates(config: ProbeConfig, knobs: list[str], values: dict[str, list], gpus: int) -> list[float]:
    """Each knob's value as its rank among the knob's values in the grid, scaled to [0, 1]."""
    out = []
    for name in knobs:
        choices = values[name]
        out.append(choices.index(knob_value(config, name, gpus)) / max(len(choices) - 1, 1))
    return out


def pick_configs(space: SearchSpace, count: int, seed: int = 0) -> list[ProbeConfig]:
    """`count` grid configurations spread over the searched knobs, the same ones on every machine.

    A Latin hypercube (each knob's [0, 1] range cut into `count` strata, shuffled per knob with a fixed seed)
    gives every knob's low, middle and high values about equal shares; each point is snapped to the nearest
    grid configuration not yet chosen (ties: grid order), since some combinations are invalid (the micro
    batch must divide the mini batch, the mini batch the train batch).
    """
    grid = space.grid()
    knobs = searched_knobs(space)
    # an unset budget (None: the rule, or dynamic batch size off) sorts below every value
    values = {
        name: sorted({knob_value(c, name, space.gpus) for c in grid}, key=lambda v: (v is not None, v))
        for name in knobs
    }
    points = [coordinates(c, knobs, values, space.gpus) for c in grid]
    rng = random.Random(seed)
    strata = [rng.sample(range(count), count) for _ in knobs]
    chosen: list[int] = []
    for i in range(min(count, len(grid))):
        target = [(strata[k][i] + 0.5) / count for k in range(len(knobs))]
        free = (j for j in range(len(grid)) if j not in chosen)
        chosen.append(
            min(free, key=lambda j: sum((a - b) ** 2 for a, b in zip(points[j], target, strict=True)))
        )
    return [grid[j] for j in chosen]


def label(config: ProbeConfig, space: SearchSpace) -> str:
    """Short name from the searched knobs, e.g. `R8 m4 lm8 w1 ckptFalse`."""
    knobs = set(searched_knobs(space))
    return " ".join(
        f"{LABELS.get(name, name)}{knob_value(config, name, space.gpus)}" for name in KNOBS if name in knobs
    )


def limit_gib(space: SearchSpace) -> float:
    """The study's feasibility limit: budget less headroom."""
    return common.space_budget(space).limit / GIB


# ---------------------------------------------------------------------------------------------- probing


def probe_settings(space: SearchSpace, iterations: int | None = None) -> ProbeSettings:
    """The probe `autotune run` launches (common.probe_settings) but with no emulated budget: every
    configuration, fitting or not, is measured in full and judged against the limit afterwards (`fits`).
    `iterations` replaces the measured iterations (the long run)."""
    return common.probe_settings(space, iterations=iterations, memory_budget_gib=None)


@contextlib.contextmanager
def keep_timing() -> Iterator[dict[str, Any]]:
    """Keep rank 0's per-iteration times, which the launcher averages away (ProbeResult has only the mean).

    The launcher looks `summarize` up at call time, so wrapping the module attribute sees every probe.
    """
    captured: dict[str, Any] = {}
    original = launcher.summarize

    def summarize(config, settings, rank_results, *rest):
        lead = rank_results[0] if rank_results and rank_results[0] else {}
        captured["timing"] = lead.get("timing", {})
        return original(config, settings, rank_results, *rest)

    launcher.summarize = summarize
    try:
        yield captured
    finally:
        launcher.summarize = original


def probe_row(
    config: ProbeConfig, settings: ProbeSettings, timing: dict[str, Any], **fields: Any
) -> dict[str, Any]:
    """Run one probe and return its JSON line."""
    timing.clear()
    result = run_probe(config, settings)
    times = timing.get("timing", {})
    return {
        "kind": "probe",
        **fields,
        "config": config.to_dict(),
        "status": result.status,
        "samples_per_sec": result.samples_per_sec,
        "iteration_seconds": times.get("iterations", []),
        "warmup_seconds": times.get("warmup", []),
        "peak_memory_bytes": result.peak_memory_bytes,
        "wall_seconds": result.wall_seconds,
        "loadavg": list(os.getloadavg()),
        "message": result.message,
    }


def measure(
    space: SearchSpace, configs: list[ProbeConfig], repeats: int, long_iterations: int, sink
) -> list[dict[str, Any]]:
    """Per configuration: a short probe, the long run, then the other short repeats (interleaved, so that
    a change of machine load does not fall on one kind of probe only)."""
    short, long = probe_settings(space), probe_settings(space, long_iterations)
    plan = [(SHORT, 0, short), (LONG, 0, long), *((SHORT, r, short) for r in range(1, repeats))]
    rows = []
    started = time.monotonic()
    with keep_timing() as timing:
        for index, config in enumerate(configs):
            name = label(config, space)
            for mode, repeat, settings in plan:
                row = probe_row(config, settings, timing, index=index, label=name, mode=mode, repeat=repeat)
                rows.append(row)
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                print(
                    f"[{time.monotonic() - started:5.0f} s] {index + 1}/{len(configs)} {name:22s} {mode:5s} "
                    f"#{repeat}: {row['status']} {row['samples_per_sec']:6.2f} samples/s "
                    f"{row['peak_memory_bytes'] / 2**30:.3f} GiB (load {row['loadavg'][0]:.2f})",
                    flush=True,
                )
    return rows


# --------------------------------------------------------------------------------------------- analysis


def spearman(a: pd.Series, b: pd.Series) -> float:
    """Spearman's rho as Pearson's r of the ranks (Series.corr(method="spearman") needs scipy)."""
    return float(a.rank().corr(b.rank()))


def load_rows(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == "probe"]


def space_name(path: Path) -> str | None:
    """The space named in a results file's `run` header line, if it has one."""
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "run":
            return row.get("space")
    return None


def short_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """samples/sec of the ok short probes: one row per configuration, one column per repeat."""
    short = [r for r in rows if r["mode"] == SHORT and r["status"] == "ok"]
    frame = pd.DataFrame(
        [{"label": r["label"], "repeat": r["repeat"], "sps": r["samples_per_sec"]} for r in short]
    )
    return frame.pivot(index="label", columns="repeat", values="sps")


def long_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Per configuration: the long run's samples/sec, per-iteration spread and first-iteration slowdown."""
    out = []
    for r in rows:
        if r["mode"] != LONG or r["status"] != "ok":
            continue
        times = r["iteration_seconds"]
        rest = times[1:] or times
        out.append(
            {
                "label": r["label"],
                "index": r["index"],
                "long": r["samples_per_sec"],
                "iter_cv_%": 100 * statistics.pstdev(times) / statistics.mean(times),
                "first_vs_rest_%": 100 * (times[0] / statistics.median(rest) - 1),
                "peak_gib": r["peak_memory_bytes"] / 2**30,
            }
        )
    return pd.DataFrame(out).set_index("label")


def per_config(rows: list[dict[str, Any]], limit: float) -> pd.DataFrame:
    shorts = short_table(rows)
    table = long_table(rows).join(shorts.median(axis=1).rename("short"), how="inner")
    table["gap_%"] = 100 * (table["short"] / table["long"] - 1)
    spread = (shorts.max(axis=1) - shorts.min(axis=1)) / shorts.median(axis=1)
    table["short_spread_%"] = 100 * spread
    table["fits"] = table["peak_gib"] <= limit  # the long run's peak against the space's limit
    columns = [
        "index",
        "short",
        "long",
        "gap_%",
        "short_spread_%",
        "iter_cv_%",
        "first_vs_rest_%",
        "peak_gib",
        "fits",
    ]
    return table.sort_values("index")[columns]


def repeat_correlations(rows: list[dict[str, Any]], fitting: list[str]) -> dict[str, Any]:
    """Short vs long per repeat (also over the `fitting` configurations only), and short vs short between
    every pair of repeats (the noise ceiling)."""
    shorts = short_table(rows)
    long = long_table(rows)["long"].reindex(shorts.index)
    vs_long = [spearman(shorts[c], long) for c in shorts.columns]
    pairs = [spearman(shorts[a], shorts[b]) for a, b in combinations(shorts.columns, 2)]
    fit = [name for name in shorts.index if name in fitting]
    return {
        "short_vs_long": vs_long,
        "median_short_vs_long": spearman(shorts.median(axis=1), long),
        "fitting_short_vs_long": [spearman(shorts.loc[fit, c], long[fit]) for c in shorts.columns]
        if len(fit) >= 4
        else [],
        "short_vs_short": pairs,
    }


def iteration_ranks(rows: list[dict[str, Any]], max_k: int = 3) -> dict[int, float]:
    """Spearman of T / mean(first k iterations) of each long run against T / mean(its last half): what a
    short probe of k measured iterations would have ranked, judged on iterations it did not see."""
    longs = [r for r in rows if r["mode"] == LONG and r["status"] == "ok"]
    out = {}
    for k in range(1, max_k + 1):
        first, last = {}, {}
        for r in longs:
            times = r["iteration_seconds"]
            if len(times) < 2 * k:
                continue
            first[r["label"]] = 1 / statistics.mean(times[:k])
            last[r["label"]] = 1 / statistics.mean(times[len(times) // 2 :])
        if len(first) >= 3:
            out[k] = spearman(pd.Series(first), pd.Series(last))
    return out


def typical_sd(groups: list[list[float]]) -> float | None:
    """Median over groups of the sd of log values (≈ relative sd): the noise of one figure. A median, not a
    pooled sd, so that one configuration hit by a burst of machine load does not set the figure."""
    sds = [statistics.stdev(math.log(v) for v in g) for g in groups if len(g) > 1 and min(g) > 0]
    return statistics.median(sds) if sds else None


def noise(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Relative sd of one short probe's figure (between repeats) and of one iteration inside a long run; the
    difference is noise between processes, which more measured iterations per probe cannot average away."""
    shorts: dict[str, list[float]] = {}
    for r in rows:
        if r["mode"] == SHORT and r["status"] == "ok":
            shorts.setdefault(r["label"], []).append(r["samples_per_sec"])
    iterations = [
        [1 / s for s in r["iteration_seconds"]] for r in rows if r["mode"] == LONG and r["status"] == "ok"
    ]
    probe, iteration = typical_sd(list(shorts.values())), typical_sd(iterations)
    between = None
    if probe is not None and iteration is not None:
        between = math.sqrt(max(probe**2 - iteration**2 / max(1, short_iterations(rows)), 0.0))
    return {"short_probe_sd_%": probe, "iteration_sd_%": iteration, "between_processes_sd_%": between}


def short_iterations(rows: list[dict[str, Any]]) -> int:
    counts = [len(r["iteration_seconds"]) for r in rows if r["mode"] == SHORT and r["iteration_seconds"]]
    return statistics.median_low(counts) if counts else 1


def summarize_rows(rows: list[dict[str, Any]], limit: float) -> dict[str, Any]:
    table = per_config(rows, limit)
    corr = repeat_correlations(rows, list(table.index[table["fits"]]))
    loads = [r["loadavg"][0] for r in rows]
    # what one more measured iteration would add to a short probe's wall time
    shorts = [r for r in rows if r["mode"] == SHORT and r["status"] == "ok" and r["iteration_seconds"]]
    extra = [statistics.mean(r["iteration_seconds"]) / r["wall_seconds"] for r in shorts]
    return {
        "configs": len(table),
        "spearman_short_vs_long": corr["short_vs_long"],
        "spearman_median_short_vs_long": corr["median_short_vs_long"],
        "fitting_configs": int(table["fits"].sum()),
        "limit_gib": limit,
        "spearman_fitting_short_vs_long": corr["fitting_short_vs_long"],
        "spearman_short_vs_short": corr["short_vs_short"],
        "spearman_first_k_vs_last_half": iteration_ranks(rows),
        "median_abs_gap_%": float(table["gap_%"].abs().median()),
        "worst_gap_%": float(table["gap_%"].abs().max()),
        "median_short_spread_%": float(table["short_spread_%"].median()),
        "median_iter_cv_%": float(table["iter_cv_%"].median()),
        "median_first_vs_rest_%": float(table["first_vs_rest_%"].median()),
        "extra_iteration_cost_%": 100 * statistics.median(extra) if extra else None,
        **{k: None if v is None else 100 * v for k, v in noise(rows).items()},
        "loadavg_1min_during": [min(loads), statistics.median(loads), max(loads)],
    }


def report(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    with pd.option_context(
        "display.width", 160, "display.max_columns", 20, "display.float_format", "{:.2f}".format
    ):
        print(per_config(rows, summary["limit_gib"]))
    s = summary
    fmt = ", ".join
    print(
        f"\nSpearman short vs long over {s['configs']} configs: per repeat "
        f"{fmt(f'{v:.3f}' for v in s['spearman_short_vs_long'])}; median of repeats "
        f"{s['spearman_median_short_vs_long']:.3f} (aim >= 0.9)"
    )
    if s["spearman_fitting_short_vs_long"]:
        print(
            f"over the {s['fitting_configs']} that fit (peak <= {s['limit_gib']:.3f} GiB): per repeat "
            + fmt(f"{v:.3f}" for v in s["spearman_fitting_short_vs_long"])
        )
    pairs = fmt(f"{v:.3f}" for v in s["spearman_short_vs_short"])
    print(f"Spearman short vs short (repeat pairs, the ceiling): {pairs}")
    print(
        "Spearman of the long runs' first k iterations vs their last half: "
        + fmt(f"k={k}: {v:.3f}" for k, v in s["spearman_first_k_vs_last_half"].items())
    )
    print(
        f"|gap| median {s['median_abs_gap_%']:.1f}%, worst {s['worst_gap_%']:.1f}%; "
        f"short-probe repeat spread (max-min)/median: median {s['median_short_spread_%']:.1f}%; "
        f"iteration CV in the long run: median "
        f"{s['median_iter_cv_%']:.1f}%; first measured iteration vs the rest: median "
        f"{s['median_first_vs_rest_%']:+.1f}%"
    )
    if s["short_probe_sd_%"] is not None and s["between_processes_sd_%"] is not None:
        print(
            f"noise (median relative sd): one short probe {s['short_probe_sd_%']:.1f}%, "
            f"one iteration inside a long run {s['iteration_sd_%']:.1f}%, so between processes about "
            f"{s['between_processes_sd_%']:.1f}% (more iterations per probe cannot average that away)"
        )
    if s["extra_iteration_cost_%"] is not None:
        print(
            f"one more measured iteration would add {s['extra_iteration_cost_%']:.0f}% "
            "to a short probe's wall time"
        )
    low, mid, high = s["loadavg_1min_during"]
    print(f"1-min load average at the probes' ends: min {low:.2f}, median {mid:.2f}, max {high:.2f}")


# ------------------------------------------------------------------------------------------------- main


def with_probe(space: SearchSpace, iterations: int | None, warmup: int | None) -> SearchSpace:
    """The space with its probe section changed, to measure what another probe default would give."""
    probe = {
        "iterations": iterations or space.probe.iterations,
        "warmup": space.probe.warmup if warmup is None else warmup,
        "timeout_seconds": space.probe.timeout_seconds,
    }
    return with_settings(space, probe=probe)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--space", default="cpu-tiny")
    parser.add_argument("--configs", type=int, default=12, help="configurations to measure (default 12)")
    parser.add_argument("--repeats", type=int, default=3, help="short probes per configuration (default 3)")
    parser.add_argument("--long-iterations", type=int, default=10, help="measured iterations of the long run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the configuration choice")
    parser.add_argument("--probe-iterations", type=int, help="try another short probe: measured iterations")
    parser.add_argument("--probe-warmup", type=int, help="try another short probe: warm-up iterations")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines (overwritten)")
    parser.add_argument("--from", dest="source", type=Path, help="analyse this file instead of probing")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.source:
        rows = load_rows(args.source)
        report(rows, summarize_rows(rows, limit_gib(load_space(space_name(args.source) or args.space))))
        return
    space = with_probe(load_space(args.space), args.probe_iterations, args.probe_warmup)
    configs = pick_configs(space, args.configs, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as sink:
        here = common.machine()
        header = {
            "kind": "run",
            "space": args.space,
            "model": space.model,
            "configs": args.configs,
            "repeats": args.repeats,
            "long_iterations": args.long_iterations,
            "seed": args.seed,
            "probe": {"warmup": space.probe.warmup, "iterations": space.probe.iterations},
            "cpu_count": here["cpu_count"],
            "fork_server": forkserver.enabled(),
            "loadavg_start": here["loadavg"],
            "time": here["time"],
        }
        sink.write(json.dumps(header) + "\n")
        print(f"{len(configs)} configs of {args.space}; load average at start {header['loadavg_start']}")
        rows = measure(space, configs, args.repeats, args.long_iterations, sink)
        summary = summarize_rows(rows, limit_gib(space))
        sink.write(json.dumps({"kind": "summary", **summary, "loadavg_end": list(os.getloadavg())}) + "\n")
    print()
    report(rows, summary)
    print(f"raw results: {args.out}")


if __name__ == "__main__":
    main()
