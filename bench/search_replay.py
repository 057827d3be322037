"""Searches replayed on the benchmark tables: autotune against random, DeepSpeed's and Lightning's batch-size
searches and a grid, with the probe noise the tables carry.

    .venv/bin/python -m bench.search_replay [--tables ppo-1rank,sharded-2rank,grpo-lora-rm] [--seeds 20]
                                            [--methods autotune,random,...] [--json PATH]

Each table (bench/search_tables.py) holds every configuration of its space probed twice. As `autotune run`
does, the replay holds the rollout batch (not a verl knob) at the hand-made config's value and replays the
configurations with that value only (`--search-unexported`: the whole table, where it was measured; the
tables of 2026-12-04 hold only the rows a study searches). A replayed probe
of a configuration returns one of its two measurements, drawn by the seed, with the space's memory budget
applied as a real run would (a peak above the budget is an emulated OOM: 0 samples/sec). A configuration's
true figures are the means of its two measurements; it fits when its mean peak is within the budget less
the headroom. The optimum is the best true samples/sec among the configurations that fit.

Two figures per method, as the issue that set them asks. **Found**: after n probes, the best true
samples/sec among the configurations probed so far that fit (true and as measured), as a share of the
optimum: how fast the search reaches a good configuration. **Pick**: after 12 probes (or when the method
stops), the true samples/sec of the configuration the method hands over by its own rule, as a share of the
best among the table's five fastest that fit: whether noise fooled it. For autotune the pick is what its
report recommends, after re-measuring the contenders within the probe noise of the leader
(autotune.report.pick; a replayed re-probe draws again from the two measurements); random and TPE hand over
their best measurement, DeepSpeed's fast mode its fastest measured micro batch, Lightning's power mode the
largest micro batch that fit. Printed per table: found after 4, 8, 12 and 20 probes (median and worst over
the seeds), OOM probes per search (mean, max), probes until found reaches 95% (median), the pick (median,
worst), and the pick's true samples/sec over the hand-made config's (the space's seed: the seed article's
config for that scenario, scaled down), median (worst).

Methods:
  autotune        the study `autotune run` uses (SystemSampler, memory-model pruning, hand-made config first)
  tpe-2obj        the study before it: multivariate TPE on two objectives (for comparison)
  random          Optuna's RandomSampler, every proposal probed
  deepspeed-fast  DeepSpeed autotuner's fast mode: binary search for the largest micro batch that fits, then
                  the sizes between half of it and it; every other knob as the hand-made config
  lightning-power Lightning's BatchSizeFinder, mode "power": double the micro batch from the hand-made one
                  until it does not fit, keep the last that did
  grid            every configuration in the space's order (the limit: 100% after the whole grid)
A batch-size finder's "does not fit" is a probe over the budget less the headroom (the limit autotune
keeps), so the finders pick within the same safety margin.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune.config.knobs import ProbeConfig
from autotune.memory.budget import Budget
from autotune.probe.contract import ProbeResult
from autotune.report import pick
from autotune.report.selection import best_feasible
from autotune.run.tuner import Tuner
from autotune.search.sampler import SystemSampler
from autotune.space.model import SearchSpace
from autotune.status import Status
from autotune.study.trials import config_key, enqueue_seed_configs, make_sampler, trial_config_of
from bench import common
from bench.search_tables import TABLES, Table, load_rows, table_by_name

CHECKPOINTS = (4, 8, 12, 20)
PICK_AT = 12  # probes before the pick whose quality is measured
METHODS = ("autotune", "tpe-2obj", "random", "deepspeed-fast", "lightning-power", "grid")


@dataclass
class Truth:
    """A table's configurations: every measurement, and the means that count as the truth."""

    space: SearchSpace
    budget: Budget
    runs: dict[str, list[dict[str, Any]]]  # config key -> its ProbeResult dicts

    @classmethod
    def load(cls, table: Table, search_unexported: bool = False) -> Truth:
        """The table as `autotune run` searches its space: the knobs verl does not read held at one value
        (autotune.run.prepare.hold_unexported), unless `search_unexported` (the whole table)."""
        space = table.searched_space(search_unexported)
        wanted = {config_key(c) for c in space.grid()}
        runs: dict[str, list[dict[str, Any]]] = {}
        for row in load_rows(table.path):
            if row["key"] in wanted:
                runs.setdefault(row["key"], []).append(row["result"])
        missing = [c for c in space.grid() if config_key(c) not in runs]
        if missing:
            raise SystemExit(
                f"{table.path}: {len(missing)} configurations not measured; run bench.search_tables"
            )
        return cls(space, common.space_budget(space), runs)

    def speed(self, key: str) -> float:
        return statistics.mean(
            r["samples_per_sec"] if r["status"] == Status.OK else 0.0 for r in self.runs[key]
        )

    def peak(self, key: str) -> float:
        return statistics.mean(r["peak_memory_bytes"] for r in self.runs[key])

    def fits(self, key: str) -> bool:
        return all(r["status"] == Status.OK for r in self.runs[key]) and self.peak(key) <= self.budget.limit

    @property
    def optimum(self) -> float:
        return max(self.speed(k) for k in self.runs if self.fits(k))

    def share(self, key: str | None) -> float:
        return self.speed(key) / self.optimum if key is not None and self.fits(key) else 0.0

    def top(self, count: int) -> list[str]:
        return sorted((k for k in self.runs if self.fits(k)), key=self.speed, reverse=True)[:count]


@dataclass
class Search:
    """One replayed search: what each probe returned, and the method's pick after each probe."""

    truth: Truth
    rng: random.Random
    probes: list[tuple[str, ProbeResult]] = field(default_factory=list)
    pick: str | None = None  # what the method hands over when it stops (or after PICK_AT probes)

    def probe(self, config: ProbeConfig, settings: Any = None, cancel: Any = None) -> ProbeResult:
        key = config_key(config)
        row = dict(self.rng.choice(self.truth.runs[key]))
        if row["status"] == Status.OK and row["peak_memory_bytes"] > self.truth.budget.bytes:
            row.update(status=Status.OOM, oom_kind="emulated", samples_per_sec=0.0)
        result = ProbeResult(**row)
        self.probes.append((key, result))
        return result

    def fits(self, result: ProbeResult) -> bool:
        return result.status == Status.OK and result.peak_memory_bytes <= self.truth.budget.limit

    def best_measured(self) -> str | None:
        feasible = [(r.samples_per_sec, key) for key, r in self.probes if self.fits(r)]
        return max(feasible)[1] if feasible else None

    def found(self, probes: int) -> float:
        """The best true share among the first `probes` probes that fit as measured."""
        shares = [self.truth.share(key) for key, r in self.probes[:probes] if self.fits(r)]
        return max(shares, default=0.0)

    @property
    def oom_probes(self) -> int:
        return sum(r.status == Status.OOM for _, r in self.probes)


# --- the methods -------------------------------------------------------------------------------------------


def optuna_search(truth: Truth, seed: int, method: str, max_probes: int) -> Search:
    """autotune, tpe-2obj or random through the real Tuner, with the table as its probe."""
    search = Search(truth, random.Random(seed))
    space, budget = truth.space, truth.budget
    model = common.prior_memory_model(space)
    if method == "autotune":
        sampler: optuna.samplers.BaseSampler = SystemSampler(space, model, budget, seed=seed)
    elif method == "tpe-2obj":
        sampler = make_sampler(seed)
    else:
        sampler = optuna.samplers.RandomSampler(seed=seed)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    settings = common.probe_settings(space)
    tuner = Tuner(study, space, settings, budget, model, probe=search.probe, prune=method != "random")
    if method != "random":
        enqueue_seed_configs(study, space)
    for _ in range(30 * max_probes):  # bounded even if the sampler keeps proposing decided configs
        tuner.step()
        if len(search.probes) >= max_probes:
            break
    if method != "autotune":
        search.pick = search.best_measured()
        return search
    probed = sum(r.wall_seconds for _, r in search.probes)
    rivals = pick.contenders(study, budget)
    pick.remeasure(study, rivals, search.probe, None, seconds=probed * pick.TIME_SHARE)
    chosen = best_feasible(study, budget)  # what the report recommends
    search.pick = config_key(trial_config_of(chosen)) if chosen is not None else None
    search.reprobes = len(search.probes) - max_probes  # type: ignore[attr-defined]
    return search


def hand_made(truth: Truth) -> ProbeConfig:
    return truth.space.seed_configs[0].config


def with_micro(config: ProbeConfig, micro: int, gpus: int) -> ProbeConfig:
    """The config with another micro batch: the accumulation follows (mini batch fixed), and a forward micro
    batch left to follow the micro batch still does."""
    mini = config.micro_batch_size * config.gradient_accumulation_steps * gpus
    return dataclasses.replace(
        config, micro_batch_size=micro, gradient_accumulation_steps=max(1, mini // (gpus * micro))
    )


def micro_ladder(truth: Truth) -> list[ProbeConfig]:
    """The hand-made config at every micro batch of the table, smallest first."""
    base, gpus = hand_made(truth), truth.space.gpus
    ladder = []
    for exponent in range(0, 12):
        config = with_micro(base, 2**exponent, gpus)
        if base.log_prob_micro_batch_size is None:
            config = dataclasses.replace(config, log_prob_micro_batch_size=2**exponent)
        if config_key(config) in truth.runs:
            ladder.append(config)
    return ladder


def finder_search(truth: Truth, seed: int, method: str, max_probes: int) -> Search:
    """DeepSpeed's fast mode or Lightning's power mode over the hand-made config's micro batch."""
    search = Search(truth, random.Random(seed))
    measured: dict[str, ProbeResult] = {}

    def fits(config: ProbeConfig) -> bool:
        key = config_key(config)
        if key not in measured:
            measured[key] = search.probe(config)
        return search.fits(measured[key])

    ladder = micro_ladder(truth)
    if method == "deepspeed-fast":
        low, high, largest = 0, len(ladder) - 1, None
        while low <= high:
            middle = (low + high) // 2
            if fits(ladder[middle]):
                largest, low = middle, middle + 1
            else:
                high = middle - 1
        if largest is not None:
            top = ladder[largest].micro_batch_size
            for config in ladder:
                if top // 2 <= config.micro_batch_size <= top:
                    fits(config)
        feasible = [(r.samples_per_sec, k) for k, r in measured.items() if search.fits(r)]
        chosen = max(feasible)[1] if feasible else None
    else:
        base = hand_made(truth).micro_batch_size
        chosen = None
        for config in (c for c in ladder if c.micro_batch_size >= base):
            if not fits(config):
                break
            chosen = config_key(config)
    search.pick = chosen
    return search


def grid_search(truth: Truth, seed: int, method: str, max_probes: int) -> Search:
    search = Search(truth, random.Random(seed))
    for config in truth.space.grid()[:max_probes]:
        search.probe(config)
    search.pick = search.best_measured()
    return search


SEARCHES: dict[str, Callable[[Truth, int, str, int], Search]] = {
    "autotune": optuna_search,
    "tpe-2obj": optuna_search,
    "random": optuna_search,
    "deepspeed-fast": finder_search,
    "lightning-power": finder_search,
    "grid": grid_search,
}


# --- the figures -------------------------------------------------------------------------------------------


def probes_to(search: Search, goal: float) -> int | None:
    for count in range(1, len(search.probes) + 1):
        if search.found(count) >= goal:
            return count
    return None


def pick_share(search: Search) -> float:
    """The handed-over configuration's true samples/sec over the best of the table's five fastest."""
    truth = search.truth
    best_top = max(truth.speed(k) for k in truth.top(5))
    return truth.speed(search.pick) / best_top if search.pick and truth.fits(search.pick) else 0.0


def replay_table(
    table: Table, methods: list[str], seeds: int, search_unexported: bool = False
) -> dict[str, Any]:
    truth = Truth.load(table, search_unexported)
    figures: dict[str, Any] = {"table": table.name, "configurations": len(truth.runs), "methods": {}}
    figures["optimum"] = truth.optimum
    figures["feasible"] = sum(truth.fits(k) for k in truth.runs)
    figures["noise"] = noise(truth)
    hand = config_key(hand_made(truth))
    figures["hand_made_share"] = truth.share(hand)
    for method in methods:
        searches = [SEARCHES[method](truth, seed, method, max(CHECKPOINTS)) for seed in range(seeds)]
        shares = {n: [s.found(n) for s in searches] for n in CHECKPOINTS}
        to95 = [probes_to(s, 0.95) for s in searches]
        final = [SEARCHES[method](truth, seed, method, PICK_AT) for seed in range(seeds)]
        picks = [pick_share(search) for search in final]
        gains = [
            truth.speed(s.pick) / truth.speed(hand) if s.pick and truth.fits(s.pick) else 0.0 for s in final
        ]
        figures["methods"][method] = {
            "median": {n: statistics.median(v) for n, v in shares.items()},
            "worst": {n: min(v) for n, v in shares.items()},
            "oom_probes": statistics.mean(s.oom_probes for s in searches),
            "max_oom_probes": max(s.oom_probes for s in searches),
            "probes_to_95": _median_probes(to95),
            "reached_95": sum(p is not None for p in to95),
            "pick_median": statistics.median(picks),
            "pick_worst": min(picks),
            "gain_median": statistics.median(gains),
            "gain_worst": min(gains),
        }
    return figures


def noise(truth: Truth) -> dict[str, float]:
    """Relative difference of samples/sec between a configuration's two measurements: median and 90th pct."""
    gaps = sorted(
        abs(a - b) / ((a + b) / 2)
        for runs in truth.runs.values()
        if len(runs) >= 2 and (a := runs[0]["samples_per_sec"]) > 0 and (b := runs[1]["samples_per_sec"]) > 0
    )
    return {"median": statistics.median(gaps), "p90": gaps[int(0.9 * (len(gaps) - 1))]} if gaps else {}


def _median_probes(values: list[int | None]) -> float | None:
    """The median probes to the goal; a seed that never got there counts as worse than any that did."""
    if sum(v is None for v in values) * 2 >= len(values):
        return None
    return statistics.median(v if v is not None else float("inf") for v in values)


def print_table(figures: dict[str, Any]) -> None:
    print(
        f"\n{figures['table']}: {figures['configurations']} configurations, {figures['feasible']} fit; "
        f"optimum {figures['optimum']:.2f} samples/s; hand-made at {figures['hand_made_share']:.0%}; probe "
        f"noise median {figures['noise'].get('median', 0):.1%}, 90th pct {figures['noise'].get('p90', 0):.1%}"
    )
    heads = " ".join(f"{f'@{n}':>11}" for n in CHECKPOINTS)
    print(f"  {'found':16} {heads}  {'oom/search':>10} {'to 95%':>7}  {'pick':>11}  x hand-made")
    for method, m in figures["methods"].items():
        cells = " ".join(f"{m['median'][n]:5.0%} ({m['worst'][n]:3.0%})" for n in CHECKPOINTS)
        to95 = f"{m['probes_to_95']:g}" if m["probes_to_95"] is not None else "-"
        pick_cell = f"{m['pick_median']:5.0%} ({m['pick_worst']:3.0%})"
        gain = f"{m['gain_median']:.2f} ({m['gain_worst']:.2f})"
        print(
            f"  {method:16} {cells}  {m['oom_probes']:6.2f} ({m['max_oom_probes']}) {to95:>7}  "
            f"{pick_cell}  {gain}"
        )


def trace(table: Table, methods: list[str], seed: int) -> None:
    """Each probe of one seed's searches: the configuration, what it returned, its true share."""
    truth = Truth.load(table)
    for method in methods:
        search = SEARCHES[method](truth, seed, method, max(CHECKPOINTS))
        print(f"\n{table.name} {method} seed {seed}:")
        for number, (key, result) in enumerate(search.probes, start=1):
            c = json.loads(key)
            knobs = " ".join(f"{k}={c[k]}" for k in TRACE_KNOBS if k in c)
            print(
                f"  {number:2d} {result.status:4} {result.samples_per_sec:6.2f}/s "
                f"{result.peak_memory_bytes / 2**30:.3f} GiB true {truth.share(key):4.0%} | {knobs} | "
                f"found {search.found(number):4.0%}"
            )


TRACE_KNOBS = (
    "sharding",
    "rollout_batch_size",
    "micro_batch_size",
    "log_prob_micro_batch_size",
    "num_rollout_workers",
    "gradient_checkpointing",
)


def markdown(figures: dict[str, Any]) -> str:
    """The table's figures as BENCHMARKS.md shows them."""
    noise_text = figures["noise"]
    lines = [
        f"**{figures['table']}**: {figures['configurations']} configurations, {figures['feasible']} fit; "
        f"optimum {figures['optimum']:.2f} samples/s; the hand-made config at "
        f"{figures['hand_made_share']:.0%} of it; "
        f"two probes of a configuration differ by {noise_text.get('median', 0):.1%} (median), "
        f"{noise_text.get('p90', 0):.1%} (90th percentile).",
        "",
        "| method | found @4 | @8 | @12 | @20 | OOM probes / search | probes to 95% | pick after 12 "
        "| × hand-made |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for method, m in figures["methods"].items():
        cells = [f"{m['median'][n]:.0%} ({m['worst'][n]:.0%})" for n in CHECKPOINTS]
        to95 = f"{m['probes_to_95']:g}" if m["probes_to_95"] is not None else "not reached"
        lines.append(
            f"| {method} | {' | '.join(cells)} | {m['oom_probes']:.2f} (max {m['max_oom_probes']}) | "
            f"{to95} | {m['pick_median']:.0%} ({m['pick_worst']:.0%}) | "
            f"{m['gain_median']:.2f}× ({m['gain_worst']:.2f}×) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Iterator[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", default=",".join(t.name for t in TABLES))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--markdown", action="store_true", help="also print each table as BENCHMARKS.md has it"
    )
    parser.add_argument("--trace", type=int, metavar="SEED", help="print each probe of one seed's searches")
    parser.add_argument(
        "--search-unexported",
        action="store_true",
        help="replay the whole table, the rollout batch searched too (by default it is held as "
        "`autotune run` holds it: verl does not read it)",
    )
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.trace is not None:
        for name in args.tables.split(","):
            trace(table_by_name(name), args.methods.split(","), args.trace)
        return
    print("found and pick: share of the optimum, median (worst) over seeds; oom/search: mean (max)")
    results = []
    for name in args.tables.split(","):
        figures = replay_table(
            table_by_name(name), args.methods.split(","), args.seeds, args.search_unexported
        )
        print_table(figures)
        if args.markdown:
            print("\n" + markdown(figures))
        results.append(figures)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
