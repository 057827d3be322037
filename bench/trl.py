"""TRL, measured by TRL where the card is too small for TRL's defaults: autotune's pick against the manual
path a TRL user takes, and (--fidelity) the built-in probe's ranks against TRL's.

    .venv/bin/python -m bench.trl [--space trl-cpu-budget] [--rounds 5] [--steps 6] [--trials 8]
                                  [--out bench/results/trl-budget.jsonl]
    .venv/bin/python -m bench.trl --space trl-cpu-tiny --fidelity --out bench/results/trl.jsonl

On a space whose memory budget TRL's defaults exceed (search_spaces/trl-cpu-budget.yaml; on CPU the budget is
emulated: a process's peak resident set is watched and the process killed where it passes the budget, as an
allocator would fail there):

1. The search: `autotune run --engine trl --target trl` (every probe is TRL's GRPOTrainer), its cost (probes,
   and the minutes the command took) and its trl_config.yaml.
2. The manual path: TRL's defaults for the same recipe (the same generation batch, mini batch, completions per
   prompt, completion length and beta; GRPOConfig's own values for the rest: per_device_train_batch_size 8,
   gradient checkpointing on), launched with `trl grpo` under the budget; on an emulated OOM the user halves
   per_device_train_batch_size (gradient_accumulation_steps doubles: the mini batch is the recipe; the
   generation batch stays whole prompt groups), checkpointing left on, and relaunches, until a launch runs
   its steps within the budget. Its launches, and the minutes they took, are counted.
3. The gain: `trl grpo` trains the pick and the manual path's config in turn, for `--rounds` rounds of
   `--steps` optimizer steps each, both under the budget watch. Samples/sec is TRL's: the mini batch over
   TRL's own `step_time` of each step, after the first generation round (the warm-up). The ratio of every
   round, their median and their spread are printed.

`--fidelity` (the earlier figure, on trl-cpu-tiny): every configuration of the space's grid probed with
`--engine builtin` and `--engine trl` (`--repeats` times each, alternately), and the Spearman rank correlation
of their median samples/sec (1.0: the built-in probe orders configurations as TRL does).

One JSON line per measurement in `--out`, with the machine and its load, then a summary line. Needs TRL in
.venv (`./setup.sh test` installs it). About 14 minutes on two cores; run it on an idle machine: other
work on the cores slows TRL's steps unevenly and the ratio with them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from bench import common
from bench.fidelity import spearman

STEP_TIME = re.compile(r"'step_time': '([0-9.eE+-]+)'")
REWARD = (  # the user's reward, as `trl grpo --reward_funcs bench_reward.reward` imports it
    "def reward(completions, **kwargs):\n"
    "    return [float(sum(map(ord, c)) % 97) / 97.0 for c in completions]\n"
)
TRL_CLI = Path(sys.executable).with_name("trl")
TRL_DEFAULT_MICRO = 8  # GRPOConfig's per_device_train_batch_size
Log = Callable[[dict[str, Any]], None]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--space", default="trl-cpu-budget")
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds of the pick vs the manual path's config"
    )
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per TRL run")
    parser.add_argument("--trials", type=int, default=8, help="the study's trials")
    parser.add_argument("--fidelity", action="store_true", help="the built-in probe vs TRL's, instead")
    parser.add_argument("--repeats", type=int, default=2, help="--fidelity: probes per configuration")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/trl-budget.jsonl")
    args = parser.parse_args()
    if args.out is None:
        args.out = common.RESULTS / ("trl.jsonl" if args.fidelity else "trl-budget.jsonl")
    return args


# --- what a TRL user has: a local model, a dataset, a reward --------------------------------------------


def save_model(folder: Path, model: str) -> None:
    """The space's model with random weights and autotune's tokenizer, as a local model folder."""
    from autotune.models.catalog import build_causal_lm, resolve_model
    from autotune.models.tokenizer import load_tokenizer

    spec = resolve_model(model)
    build_causal_lm(spec, dtype="float32").save_pretrained(folder)
    load_tokenizer(spec).save_pretrained(folder)


def save_dataset(folder: Path, model: str, prompt_tokens: int, count: int = 512) -> None:
    """train.jsonl of prompts of about `prompt_tokens` tokens (TRL 1.16 does not truncate prompts)."""
    from autotune.models.catalog import resolve_model
    from autotune.models.tokenizer import load_tokenizer
    from autotune.probe.rank.prompts import SyntheticPrompts

    tokenizer = load_tokenizer(resolve_model(model))
    texts = SyntheticPrompts(tokenizer, prompt_tokens, seed=1)
    rows = [{"prompt": tokenizer.decode(texts[i][:prompt_tokens])} for i in range(count)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


# --- a process under an emulated memory budget -------------------------------------------------------------


def _peak_bytes(pid: int) -> int:
    """The largest peak resident set (VmHWM) among the process and its descendants: a rank's peak."""
    import psutil

    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    peak = 0
    for process in tree:
        try:
            text = Path(f"/proc/{process.pid}/status").read_text()
        except OSError:
            continue
        found = re.search(r"^VmHWM:\s+(\d+) kB", text, re.MULTILINE)
        peak = max(peak, int(found.group(1)) * 1024 if found else 0)
    return peak


def watched(command: list[str], env: dict[str, str], cwd: Path, budget_bytes: float | None) -> dict[str, Any]:
    """Run `command` in its own process group; every 50 ms read its processes' peak resident sets, and kill
    the group where a peak passes `budget_bytes` (an emulated OOM: nothing else enforces a budget on CPU)."""
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )
        peak, killed_at = 0, None
        while process.poll() is None:
            peak = max(peak, _peak_bytes(process.pid))
            if budget_bytes is not None and peak > budget_bytes and killed_at is None:
                killed_at = time.monotonic() - started
                os.killpg(process.pid, signal.SIGKILL)
            time.sleep(0.05)
        output.seek(0)
        text = output.read()
    return {
        "returncode": process.returncode,
        "peak_bytes": peak,
        "oom": killed_at is not None,
        "seconds": killed_at if killed_at is not None else time.monotonic() - started,
        "output": text,
    }


def trl_run(config: Path, data: Path, work: Path, steps: int, budget_bytes: float | None) -> dict[str, Any]:
    """`trl grpo --config config` for `steps` optimizer steps, launched as a user does, under the budget."""
    command = [str(TRL_CLI), "grpo", "--config", str(config), "--dataset_name", str(data)]
    command += ["--reward_funcs", "bench_reward.reward", "--max_steps", str(steps), "--logging_steps", "1"]
    command += ["--output_dir", str(work / "trl-out"), "--report_to", "none", "--save_strategy", "no"]
    env = {**os.environ, "PYTHONPATH": str(work), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.update(OMP_NUM_THREADS=str(os.cpu_count() or 1))
    run = watched(command, env, work, budget_bytes)
    run["step_seconds"] = [float(t) for t in STEP_TIME.findall(run["output"])]
    if not run["oom"] and (run["returncode"] != 0 or len(run["step_seconds"]) != steps):
        tail = run["output"][-2000:]
        raise SystemExit(f"trl grpo failed ({run['returncode']}, {len(run['step_seconds'])} steps): {tail}")
    return run


def samples_per_sec(step_seconds: list[float], mini: int, warmup: int) -> float:
    """TRL's own figure: the mini batch over each step's step_time, after the warm-up steps."""
    measured = step_seconds[warmup:]
    return mini * len(measured) / sum(measured)


def run_figures(run: dict[str, Any]) -> dict[str, Any]:
    """What a run's JSON line keeps (not its output)."""
    return {key: value for key, value in run.items() if key != "output"}


# --- 1. the search -----------------------------------------------------------------------------------------


def run_study(space: str, model: Path, out: Path, trials: int) -> tuple[dict[str, Any], float]:
    """`autotune run --engine trl --target trl` on the space with the local model: its summary.json, and
    the minutes the command took (everything the user waits for)."""
    command = [sys.executable, "-m", "autotune", "run", "--engine", "trl", "--target", "trl"]
    command += ["--space", space, "--model", str(model), "--weights", "pretrained", "--device", "cpu"]
    command += ["--trials", str(trials), "--gain-rounds", "0", "--out", str(out), "--json"]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    minutes = (time.monotonic() - started) / 60
    if done.returncode != 0:
        raise SystemExit(f"autotune run failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout), minutes


# --- 2. the manual path ------------------------------------------------------------------------------------


def defaults_config(export: dict[str, Any], mini: int, micro: int | None = None) -> dict[str, Any]:
    """TRL's defaults for the export's recipe: its generation batch, completions per prompt, completion length
    and beta; GRPOConfig's values for the rest. `micro`: the per_device_train_batch_size the user set (None:
    TRL's default 8); the accumulation keeps the mini batch (one process)."""
    recipe = ("model_name_or_path", "generation_batch_size", "num_generations", "max_completion_length")
    config = {key: export[key] for key in (*recipe, "beta")}
    if micro is not None:
        config["per_device_train_batch_size"] = micro
    config["gradient_accumulation_steps"] = max(1, mini // (micro or TRL_DEFAULT_MICRO))
    return {**config, "use_cpu": True, "bf16": False}


def manual_path(
    export: dict[str, Any], mini: int, paths: dict[str, Path], steps: int, budget: float, log: Log
) -> dict[str, Any]:
    """From TRL's defaults, halve per_device_train_batch_size on every emulated OOM until a launch runs its
    steps within the budget: the launches, their minutes, and the config that ran."""
    micro: int | None = None
    launches = []
    while True:
        config = defaults_config(export, mini, micro)
        path = paths["work"] / f"manual-{micro or 'defaults'}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        run = trl_run(path, paths["data"], paths["work"], steps, budget)
        shown = micro or TRL_DEFAULT_MICRO
        launches.append({"per_device_train_batch_size": shown, **run_figures(run)})
        log({"kind": "manual_launch", "launch": len(launches), "config": config, **launches[-1]})
        if not run["oom"]:
            return {"config": config, "path": path, "launches": launches}
        if shown == 1:
            raise SystemExit("the manual path ran out of memory at per_device_train_batch_size 1")
        micro = shown // 2


# --- 3. the gain -------------------------------------------------------------------------------------------


def in_turn(
    configs: dict[str, Path],
    mini: int,
    paths: dict[str, Path],
    args: argparse.Namespace,
    budget: float,
    log: Log,
) -> dict[str, list[dict[str, Any]]]:
    """Each config trained by `trl grpo` in turn for `rounds` rounds, under the budget watch; the order turns
    every round (AB, BA, ...), so a drift of the machine's speed within a round favours neither."""
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for round_ in range(args.rounds):
        order = list(configs.items()) if round_ % 2 == 0 else list(reversed(configs.items()))
        for name, path in order:
            run = trl_run(path, paths["data"], paths["work"], args.steps, budget)
            speed = None if run["oom"] else samples_per_sec(run["step_seconds"], mini, warmup=1)
            figures = {"samples_per_sec": speed, **run_figures(run), "load": os.getloadavg()[0]}
            found[name].append(figures)
            log({"kind": "trl_run", "round": round_, "config": name, **figures})
    return found


def binding(args: argparse.Namespace, work: Path, log: Log) -> dict[str, Any]:
    from autotune.space.loading import load_space

    space = load_space(args.space)
    budget = float(space.memory_budget_gib or 0) * 1024**3
    save_model(work / "model", space.model)
    save_dataset(work / "data", space.model, space.knob("max_prompt_length").values()[0])
    (work / "bench_reward.py").write_text(REWARD)
    paths = {"work": work, "data": work / "data"}
    summary, search_minutes = run_study(args.space, work / "model", work / "reports", args.trials)
    log({"kind": "study", "minutes": search_minutes, "summary": summary, "load": os.getloadavg()[0]})
    argv = shlex.split(summary["launch"])
    export_path = Path(argv[argv.index("--config") + 1])
    export = yaml.safe_load(export_path.read_text())
    mini = export["per_device_train_batch_size"] * export["gradient_accumulation_steps"]
    manual = manual_path(export, mini, paths, args.steps, budget, log)
    runs = in_turn({"pick": export_path, "manual": manual["path"]}, mini, paths, args, budget, log)
    pick = [r["samples_per_sec"] for r in runs["pick"]]
    hand = [r["samples_per_sec"] for r in runs["manual"]]
    ratios = [p / h for p, h in zip(pick, hand, strict=True) if p and h]
    if not ratios:
        raise SystemExit(f"no round ran both configs within the budget: pick {pick}, manual {hand}")
    pick, hand = [p for p in pick if p], [h for h in hand if h]
    failed = [launch for launch in manual["launches"] if launch["oom"]]
    ratio = statistics.median(pick) / statistics.median(hand)
    failed_minutes = sum(launch["seconds"] for launch in failed) / 60
    same = same_config(export, manual["config"])
    return {
        "budget_gib": budget / 1024**3,
        "pick": {k: v for k, v in export.items() if k != "model_name_or_path"},
        "manual": {k: v for k, v in manual["config"].items() if k != "model_name_or_path"},
        "pick_samples_per_sec": statistics.median(pick),
        "manual_samples_per_sec": statistics.median(hand),
        "ratio": ratio,
        "round_ratios": ratios,
        "peaks_gib": {name: max(r["peak_bytes"] for r in found) / 1024**3 for name, found in runs.items()},
        "search": {
            "minutes": search_minutes,
            "probes": summary["cost"]["probes_run"],
            "probe_minutes": summary["cost"]["probe_wall_seconds"] / 60,
            "trials": summary["trials"],
        },
        "manual_path": {
            "launches": len(manual["launches"]),
            "failed": len(failed),
            "failed_minutes": failed_minutes,
            "minutes": sum(launch["seconds"] for launch in manual["launches"]) / 60,
        },
        "same_config": same,  # then the ratio is trl grpo's own noise between two runs of one config
        "break_even_minutes": None if same else break_even(search_minutes, failed_minutes, ratio),
        "defaults": failed[0] if failed else manual["launches"][0],
        "study_pick_trial": (summary.get("recommended") or {}).get("trial"),
    }


def same_config(export: dict[str, Any], manual: dict[str, Any]) -> bool:
    """Whether the pick is the manual path's config (which leaves checkpointing and the loader at TRL's
    defaults: on, no worker)."""
    filled = {**manual, "activation_checkpointing": True, "dataloader_num_workers": 0}
    return all(filled.get(key) == value for key, value in export.items())


def break_even(search_minutes: float, failed_minutes: float, ratio: float) -> float | None:
    """Minutes of training (at the manual path's speed) after which the search has paid for itself: the
    autotune user waits for the search, then trains at `ratio`; the manual user loses the failed launches,
    then trains at 1 (None: the pick is not faster, so it never pays)."""
    if ratio <= 1.0:
        return None
    return max(0.0, search_minutes - failed_minutes) / (1.0 - 1.0 / ratio)


# --- --fidelity --------------------------------------------------------------------------------------------


def fidelity(args: argparse.Namespace, log: Log) -> dict[str, Any]:
    from autotune.space.loading import load_space
    from autotune.trainers.registry import run_probe

    space = load_space(args.space)
    configs = space.grid()
    medians: dict[str, list[float]] = {"builtin": [], "trl": []}
    for index, config in enumerate(configs):
        figures: dict[str, list[float]] = {"builtin": [], "trl": []}
        for repeat in range(args.repeats):
            for engine in ("builtin", "trl"):
                settings = dataclasses.replace(common.probe_settings(space), engine=engine)
                result = run_probe(config, settings)
                figures[engine].append(result.samples_per_sec if result.status == "ok" else 0.0)
                log(
                    {
                        "kind": "probe",
                        "config": index,
                        "repeat": repeat,
                        "engine": engine,
                        "knobs": config.to_dict(),
                        "status": result.status,
                        "samples_per_sec": result.samples_per_sec,
                        "peak_gib": result.peak_memory_gib,
                        "load": os.getloadavg()[0],
                    }
                )
        for engine in medians:
            medians[engine].append(statistics.median(figures[engine]))
    rho = spearman(pd.Series(medians["builtin"]), pd.Series(medians["trl"]))
    return {"configs": len(configs), "spearman": float(rho), "medians": medians}


def report(found: dict[str, Any]) -> None:
    if "fidelity" in found:
        f = found["fidelity"]
        print(f"fidelity: Spearman {f['spearman']:.3f} over {f['configs']} configurations (builtin vs TRL)")
        return
    g = found["binding"]
    defaults = g["defaults"]
    print(
        f"TRL's defaults under {g['budget_gib']:.2f} GiB: "
        + (
            f"emulated OOM (killed at {defaults['peak_bytes'] / 1024**3:.2f} GiB, "
            f"{defaults['seconds']:.0f} s in)"
            if defaults["oom"]
            else "ran within the budget"
        )
    )
    rounds = ", ".join(f"{r:.2f}" for r in g["round_ratios"])
    print(
        f"pick {g['pick_samples_per_sec']:.2f}, manual path {g['manual_samples_per_sec']:.2f} samples/s "
        f"(TRL's step_time); ratio {g['ratio']:.2f}x (rounds: {rounds})"
    )
    s, m = g["search"], g["manual_path"]
    if g.get("same_config"):
        print("the pick is the manual path's config: the ratio is trl grpo's own noise between two runs")
    print(f"search: {s['probes']} probes, {s['minutes']:.1f} min", end="; ")
    print(f"manual path: {m['launches']} launches, {m['minutes']:.1f} min")
    paid = g.get("break_even_minutes")
    if paid is not None:
        print(f"the search pays for itself after {paid:.0f} min of training at the manual path's speed")
    elif not g.get("same_config"):
        print("the search does not pay for itself in speed: the pick is not faster")


def main() -> int:
    args = parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as out, tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:

        def log(record: dict[str, Any]) -> None:
            out.write(json.dumps(record) + "\n")
            out.flush()

        log({"kind": "run", "args": {k: str(v) for k, v in vars(args).items()}, "machine": common.machine()})
        if args.fidelity:
            found = {"fidelity": fidelity(args, log)}
        else:
            found = {"binding": binding(args, Path(tmp), log)}
        log({"kind": "summary", **found, "machine_after": common.machine()})
    report(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
