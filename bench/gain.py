"""Gain over the seed article's three hand-made configs, on CPU-sized copies of its three scenarios.

    .venv/bin/python -m bench.gain [--scenarios 5.1,5.2,5.3] [--trials 20] [--iterations 3] [--repeats 3]
                                   [--keep DIR] [--json PATH]

For each scenario (search_spaces/seed-*.yaml: §5.1 2×A100-80G 7B LoRA, §5.2 4×A100-40G 13B full fine-tuning,
§5.3 RTX 3090 1.1B LoRA) this builds a scaled-down copy of the space, probes the scaled hand-made config as it
is, runs the real CLI `autotune run --space <scaled.yaml> --trials 20` (so at most 20 probes; the hand-made
config is enqueued first, as in any run), reads the Pareto-best config from the study, then probes the
hand-made and the chosen config again, alternately, with more measured iterations, and prints the ratio of
their median samples/sec. About 6 minutes on an idle 2-core machine; the load average is printed with the
figures, so that a run taken on a busy machine is recognisable.

Scaling rule (the same for all three; `scale_space`):

- model: tiny-llama (2 layers, width 64, Llama's 32,000-token vocabulary) on one CPU rank; the
  DeBERTa-v3-large reward model becomes tiny-deberta, a reward function stays a function; LoRA ranks ÷ 8.
- one rank stands for one GPU: a global batch (train, mini, rollout) becomes its per-GPU share (÷ W, the
  scenario's GPU count), then every batch size ÷ 8 — micro and log-prob micro batches are per GPU already,
  so just ÷ 8. The three hand-made configs all hold 256 samples per GPU, so T = 32 and R = 8 in each, and
  the rule keeps both the number of generate calls (T/R) and of optimizer steps (T/M) per iteration: M is
  16, 8 and 4. Ranges are scaled the same way (a bound below 1 becomes 1, the rollout batch is capped at T).
- headroom, algorithm and gradient checkpointing choices are kept as they are; one rank holds its states
  whole, so sharding and offload are left out of the scaled space (and the scaled hand-made config).
- the recipe stays fixed, as in the original spaces: T and M as above, lengths ÷ 8: §5.1 200/256 -> 25/32,
  §5.2 128/192 -> 16/24, §5.3 96/128 -> 12/16. The tuner's pick trains the same recipe as the hand-made
  config; only the system knobs differ.
- rollout workers: at most this machine's physical cores, for the hand-made config too (4 and 6 workers on
  2 cores is the article's own pitfall 6.2, and the tool refuses it).
- budget (memory_budget_gib; on CPU an emulated budget on the peak RSS): the share of the original space
  that `autotune check`'s estimate fits on the original card less headroom (each configuration held as it
  says: §5.2's FSDP full shard or shard_grad_op, with offload or not) is carried over: the scaled budget
  less headroom is the largest of
    * the peak at that share of the scaled grid (the CPU memory model calibrated on
      bench/results/table-ppo-1rank.jsonl, shifted to the hand-made config's measured peak),
    * the hand-made config's measured peak + 0.02 GiB (the RSS noise): the article ran these configs, so
      they are taken to fit even where the estimate of the original says otherwise (§5.1 and §5.2), and
    * `autotune run`'s own floor (its uncalibrated estimate of weights, optimizer state and runtime),
      below which it refuses to start.
  Which term decided is printed. At these sizes the runtime (~0.45 GiB of RSS) dominates every peak, so the
  budget constrains the search far less than a real card does.

Two ratios of median samples/sec are printed: speed alone, and budget-aware, where a long probe whose peak
ends above the budget (an emulated OOM: it would not run on the scaled card) counts 0 samples/sec — for the
hand-made config as for the chosen one. Both configs' highest long-probe peaks are printed beside the
budget less headroom, the limit the tuner chose within.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml

from autotune.config.knobs import ProbeConfig, physical_cores
from autotune.memory.calibration import MemoryModel
from autotune.memory.sharded import estimate_with
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.probe.launcher import run_probe
from autotune.report.selection import best_feasible
from autotune.run.prepare import states_floor
from autotune.space.loading import load_space, space_from_dict
from autotune.space.model import SearchSpace, knob_value
from autotune.status import Attr, Status
from autotune.study.trials import status_counts, trial_config
from autotune.units import GIB
from bench import common

GRID_TABLE = common.RESULTS / "table-ppo-1rank.jsonl"  # tiny-llama on one CPU rank, every config probed
FACTOR = 8  # batch sizes (per GPU) and lengths are divided by this
RSS_NOISE_GIB = 0.02  # run-to-run spread of a CPU probe's peak RSS (search_spaces/cpu-tiny.yaml)
DEVICE = "cpu"  # the scaling rule sizes everything for a CPU
REWARD_MODELS = {"function": "function", "deberta-v3-large": "tiny-deberta"}


@dataclass(frozen=True)
class Scenario:
    key: str
    seed_space: str


SCENARIOS = (
    Scenario("5.1", "seed-2xa100-80g-7b-lora"),
    Scenario("5.2", "seed-4xa100-40g-13b-fsdp"),
    Scenario("5.3", "seed-rtx3090-24g-small-lora"),
)


# --- scaling ------------------------------------------------------------------------------------------------


def _global(value: int, gpus: int) -> int:
    """A global batch size: its per-GPU share, ÷ FACTOR, at least 1."""
    return max(1, value // (gpus * FACTOR))


def _micro(value: int) -> int:
    return max(1, value // FACTOR)


def _length(value: int) -> int:
    return max(1, round(value / FACTOR))


def _scaled_range(raw: Any, scale: Callable[[int], int]) -> Any:
    """A knob's YAML value (a fixed number or {min, max}) with `scale` applied to each bound."""
    return {"min": scale(raw["min"]), "max": scale(raw["max"])} if isinstance(raw, dict) else scale(raw)


def scale_space(original: SearchSpace, cores: int) -> dict[str, Any]:
    """The scaled copy of a seed space as a YAML-ready dict (its budget is filled in by `scaled_budget`)."""
    knobs, gpus = original.raw["knobs"], original.gpus
    hand = original.seed_configs[0]
    train = _global(hand.config.train_batch_size, gpus)
    mini = _global(knob_value(hand.config, "mini_batch_size", gpus), gpus)
    rollout = _scaled_range(knobs["rollout_batch_size"], lambda v: min(train, _global(v, gpus)))
    workers = knobs["num_rollout_workers"]
    scaled = {
        "train_batch_size": train,
        "mini_batch_size": mini,
        "max_prompt_length": _length(knobs["max_prompt_length"]),
        "max_response_length": _length(knobs["max_response_length"]),
        "rollout_batch_size": rollout,
        "micro_batch_size": _scaled_range(knobs["micro_batch_size"], lambda v: min(mini, _micro(v))),
        "num_rollout_workers": {"min": 1, "max": min(cores, workers["max"])} if cores > 1 else 1,
        "gradient_checkpointing": knobs.get("gradient_checkpointing", True),
    }
    if "log_prob_micro_batch_size" in knobs:
        scaled["log_prob_micro_batch_size"] = _scaled_range(knobs["log_prob_micro_batch_size"], _micro)
    lora = dict(original.raw.get("lora", {"enabled": False}))
    if lora.get("enabled"):
        lora.update(r=_micro(lora["r"]), alpha=_micro(lora["alpha"]))
    c = hand.config
    return {
        "description": f"{original.name} scaled for bench.gain (batches ÷ W·{FACTOR}, lengths ÷ {FACTOR})",
        "model": "tiny-llama",
        "reward_model": REWARD_MODELS[original.reward_model],
        "gpus": 1,
        "memory_budget_gib": None,
        "headroom": original.headroom,
        "algorithm": original.algorithm,
        "rollout_n": original.rollout_n,
        "kl_coef": original.kl_coef,
        "lora": lora,
        "probe": {"iterations": 1, "warmup": 1, "timeout_seconds": 180},
        "knobs": scaled,
        "seed_configs": [
            {
                "name": f"{hand.name} scaled",
                "rollout_batch_size": _global(c.rollout_batch_size, gpus),
                "train_batch_size": train,
                "mini_batch_size": mini,
                "micro_batch_size": _micro(c.micro_batch_size),
                "num_rollout_workers": min(cores, c.num_rollout_workers),
                "max_prompt_length": scaled["max_prompt_length"],
                "max_response_length": scaled["max_response_length"],
                "gradient_checkpointing": c.gradient_checkpointing,
            }
        ],
    }


def original_fraction(original: SearchSpace) -> tuple[float, float]:
    """(share of the original space that fits its card, each config held as it says; the hand-made's GiB).
    The original's recipe is fixed, so every config trains the hand-made's T and M."""
    hand = original.seed_configs[0].config
    arch = common.prior_memory_model(original, "cuda").arch
    limit = common.space_budget(original).limit
    grid = original.grid()
    fits = sum(estimate_with(MemoryModel(arch, original.gpus, "cuda"), c).peak <= limit for c in grid)
    return fits / len(grid), estimate_with(MemoryModel(arch, original.gpus, "cuda"), hand).peak / GIB


def cpu_memory_model(space: SearchSpace) -> MemoryModel:
    """The CPU memory model for the scaled space, calibrated on the ok probes of the committed ppo-1rank
    table (bench/search_tables.py: tiny-llama on one CPU rank, every configuration of its space)."""
    points = [
        (ProbeConfig(**result["config"]), result["peak_memory_bytes"])
        for result in common.grid_table(GRID_TABLE).values()
        if result["status"] == Status.OK
    ]
    return common.prior_memory_model(space, "cpu").calibrate(points)


def model_floor(space: SearchSpace) -> float:
    """The peak below which `autotune run` says no configuration can fit (its uncalibrated prior)."""
    return states_floor(space, common.prior_memory_model(space, DEVICE))[0]


def scaled_budget(space: SearchSpace, fraction: float, hand_peak: int) -> dict[str, Any]:
    """The budget (GiB) by the rule in the module docstring, and which of its three terms decided it."""
    model = cpu_memory_model(space)
    hand = space.seed_configs[0].config
    shift = hand_peak - model.predict(hand)  # the model's offset for this model/LoRA/reward combination
    peaks = sorted(model.predict(c) + shift for c in space.grid())
    by_fraction = peaks[max(0, math.ceil(fraction * len(peaks)) - 1)] if fraction > 0 else 0.0
    terms = {
        "fraction": by_fraction,
        "hand-made peak + noise": hand_peak + RSS_NOISE_GIB * GIB,
        # `autotune run` refuses a budget below its uncalibrated floor (weights, optimizer state, runtime)
        "autotune's floor": model_floor(space) * 1.001,
    }
    decided_by = max(terms, key=terms.__getitem__)
    limit = terms[decided_by]
    return {
        "budget_gib": math.ceil(limit / (1 - space.headroom) / GIB * 1e4) / 1e4,
        "limit_gib": limit / GIB,
        "terms_gib": {name: value / GIB for name, value in terms.items()},
        "decided_by": decided_by,
        "scaled_fraction": sum(p <= limit for p in peaks) / len(peaks),
        "grid_size": len(peaks),
    }


# --- probing ------------------------------------------------------------------------------------------------


def summary(result: ProbeResult) -> dict[str, Any]:
    return {
        "status": result.status,
        "samples_per_sec": result.samples_per_sec,
        "peak_gib": result.peak_memory_gib,
        "wall_seconds": result.wall_seconds,
        "phase_seconds": result.phase_seconds,
        "message": result.message,
    }


def compare(
    hand: ProbeConfig, chosen: ProbeConfig, settings: ProbeSettings, repeats: int
) -> dict[str, list[dict]]:
    """Long probes of both, alternating (hand, chosen, hand, ...) so that load drifts hit both alike."""
    runs: dict[str, list[dict]] = {"hand": [], "chosen": []}
    for _ in range(repeats):
        for name, config in (("hand", hand), ("chosen", chosen)):
            runs[name].append(summary(run_probe(config, settings)))
    return runs


# --- the tuner, through its CLI ----------------------------------------------------------------------------


def run_autotune(space_path: Path, out: Path, study: str, trials: int, seed: int, device: str) -> dict:
    command = [
        sys.executable, "-m", "autotune", "run", "--space", str(space_path), "--trials", str(trials),
        "--out", str(out), "--study", study, "--seed", str(seed), "--device", device,
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"}, check=False
    )
    return {
        "command": " ".join(command[1:]),
        "exit_code": proc.returncode,
        "seconds": time.monotonic() - started,
        "output_tail": (proc.stdout + proc.stderr)[-3000:],
    }


def read_study(out: Path, study_name: str, space: SearchSpace) -> dict[str, Any]:
    """The Pareto-best config (the one best_config.yaml holds) and what the study spent."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{out / study_name / 'study.db'}"
    study = optuna.load_study(study_name=study_name, storage=storage)
    best = best_feasible(study, common.space_budget(space))
    trials = study.get_trials(deepcopy=False)
    probes = [t for t in trials if Attr.RESULT in t.user_attrs]
    return {
        "chosen": trial_config(best) if best else None,
        "chosen_trial": best.number if best else None,
        "chosen_short_sps": best.values[0] if best else None,
        "statuses": status_counts(study),
        "probes": len(probes),
        "probe_seconds": sum(t.user_attrs[Attr.RESULT].get("wall_seconds", 0.0) for t in probes),
        "best_config_yaml": (out / study_name / "best_config.yaml").is_file(),
    }


# --- one scenario -----------------------------------------------------------------------------------------


def knobs_text(c: ProbeConfig) -> str:
    lm = f" lm{c.log_prob_micro_batch_size}" if c.log_prob_micro_batch_size else ""
    ckpt = " ckpt" if c.gradient_checkpointing else ""
    return (
        f"R{c.rollout_batch_size} m{c.micro_batch_size} g{c.gradient_accumulation_steps}{lm} "
        f"w{c.num_rollout_workers}{ckpt}"
    )


def run_scenario(scenario: Scenario, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    load_before = os.getloadavg()
    original = load_space(scenario.seed_space, cores=64)  # the article's servers have many cores
    cores = physical_cores()
    data = scale_space(original, cores)
    draft = space_from_dict({**data, "memory_budget_gib": 64.0}, cores=cores, name=f"gain-{scenario.key}")
    hand = draft.seed_configs[0].config
    fraction, original_hand_gib = original_fraction(original)
    # The hand-made config as it is, with as many iterations as the long probes: RSS grows a little with
    # every iteration, and the budget must hold its peak in the comparison too.
    first = run_probe(hand, common.probe_settings(draft, DEVICE, args.iterations))
    if first.status != "ok":
        return {"scenario": scenario.key, "error": f"hand-made probe {first.status}: {first.message}"}
    budget = scaled_budget(draft, fraction, first.peak_memory_bytes)
    data["memory_budget_gib"] = budget["budget_gib"]
    space_path = workdir / f"gain-{scenario.key}.yaml"
    space_path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    space = load_space(str(space_path), cores=cores)
    run = run_autotune(space_path, workdir, f"gain-{scenario.key}", args.trials, args.seed, DEVICE)
    found = read_study(workdir, f"gain-{scenario.key}", space) if run["exit_code"] in (0, 1) else {}
    result: dict[str, Any] = {
        "scenario": scenario.key,
        "seed_space": scenario.seed_space,
        "original_fraction": fraction,
        "original_hand_estimate_gib": original_hand_gib,
        "original_budget_gib": original.memory_budget_gib,
        "budget": budget,
        "space": data,
        "hand": {"config": asdict(hand), "first": summary(first)},
        "run": run,
        "study": {k: v for k, v in found.items() if k != "chosen"},
        "loadavg_before": load_before,
    }
    chosen = found.get("chosen")
    if chosen is not None:
        settings = common.probe_settings(space, DEVICE, args.iterations)
        runs = compare(hand, chosen, settings, args.repeats)
        result["chosen"] = {"config": asdict(chosen)}
        result["long"] = runs
        result.update(ratios(runs, space))
    result["loadavg_after"] = os.getloadavg()
    return result


def ratios(runs: dict[str, list[dict]], space: SearchSpace) -> dict[str, Any]:
    """Speed alone, and budget-aware: a long probe above the budget (an emulated OOM) counts 0 samples/s."""
    limit = common.space_budget(space).limit / GIB

    def speed(name: str, budget_aware: bool) -> float:
        return statistics.median(
            r["samples_per_sec"] if r["status"] == "ok" or not budget_aware else 0.0 for r in runs[name]
        )

    def ratio(budget_aware: bool) -> float:
        hand = speed("hand", budget_aware)
        return speed("chosen", budget_aware) / hand if hand else math.inf

    return {
        "hand_sps": speed("hand", False),
        "chosen_sps": speed("chosen", False),
        "hand_max_peak_gib": max(r["peak_gib"] for r in runs["hand"]),
        "chosen_max_peak_gib": max(r["peak_gib"] for r in runs["chosen"]),
        "limit_gib": limit,
        "speed_ratio": ratio(False),
        "budget_ratio": ratio(True),
    }


# --- output ------------------------------------------------------------------------------------------------


def print_scenario(r: dict[str, Any]) -> None:
    if "error" in r:
        print(f"§{r['scenario']}: {r['error']}")
        return
    b, s = r["budget"], r["study"]
    print(
        f"\n§{r['scenario']} ({r['seed_space']}): original fits {r['original_fraction']:.1%} of its space "
        f"(hand-made estimated at {r['original_hand_estimate_gib']:.1f} of {r['original_budget_gib']} GiB); "
        f"scaled budget {b['budget_gib']:.3f} GiB (limit {b['limit_gib']:.3f}, set by {b['decided_by']}; "
        f"{b['scaled_fraction']:.0%} of {b['grid_size']} configs predicted to fit)"
    )
    print(
        f"  autotune run: exit {r['run']['exit_code']}, {r['run']['seconds']:.0f} s, "
        f"{s.get('probes', 0)} probes ({s.get('probe_seconds', 0):.0f} s), statuses {s.get('statuses')}, "
        f"best_config.yaml {'written' if s.get('best_config_yaml') else 'missing'}"
    )
    hand = ProbeConfig(**r["hand"]["config"])
    first = r["hand"]["first"]
    print(
        f"  hand-made {knobs_text(hand)}, first probe: {first['samples_per_sec']:.2f} samples/s, "
        f"{first['peak_gib']:.3f} GiB"
    )
    if "chosen" not in r:
        print("  no feasible configuration: no ratio")
        print(r["run"]["output_tail"][-1500:])
        return
    chosen = ProbeConfig(**r["chosen"]["config"])
    for name, config in (("hand-made", hand), ("chosen", chosen)):
        runs = r["long"]["hand" if name == "hand-made" else "chosen"]
        figures = ", ".join(
            f"{x['samples_per_sec']:.2f}/s {x['peak_gib']:.3f} GiB {x['status']}" for x in runs
        )
        print(f"  {name:9} {knobs_text(config):22} long probes: {figures}")
    print(
        f"  ratio chosen / hand-made: {r['speed_ratio']:.2f}x (speed), {r['budget_ratio']:.2f}x (an emulated "
        f"OOM counting 0); highest long-probe peaks {r['hand_max_peak_gib']:.3f} (hand-made) and "
        f"{r['chosen_max_peak_gib']:.3f} GiB (chosen) against the limit {r['limit_gib']:.3f}; "
        f"load {r['loadavg_before'][0]:.1f} -> {r['loadavg_after'][0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenarios", default=",".join(s.key for s in SCENARIOS))
    parser.add_argument(
        "--trials", type=int, default=20, help="autotune run --trials (at most that many probes)"
    )
    parser.add_argument("--iterations", type=int, default=3, help="measured iterations of the long probes")
    parser.add_argument("--repeats", type=int, default=3, help="long probes of each config, alternating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="keep the scaled spaces and studies here")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    wanted = set(args.scenarios.split(","))
    started, here = time.monotonic(), common.machine()
    load = here["loadavg"]
    print(
        f"bench/gain.py: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {here['cpu_count']} CPUs"
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="autotune-gain-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for scenario in SCENARIOS:
            if scenario.key in wanted:
                results.append(run_scenario(scenario, args, workdir))
                print_scenario(results[-1])
    total = time.monotonic() - started
    load = os.getloadavg()
    print(f"\ntotal {total / 60:.1f} min; load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "minutes": total / 60}, indent=2, default=str))


if __name__ == "__main__":
    main()
