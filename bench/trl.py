"""TRL, measured by TRL: autotune's pick against TRL's defaults, and the built-in probe's fidelity to TRL.

    .venv/bin/python -m bench.trl [--space trl-cpu-tiny] [--rounds 3] [--steps 12] [--repeats 2]
                                  [--out bench/results/trl.jsonl]

Two figures, on a CPU-sized space whose hand-made config is TRL's defaults (search_spaces/trl-cpu-tiny.yaml):

1. The gain a TRL user gets. `autotune run --engine trl --target trl` runs the study (every probe is TRL's
   GRPOTrainer) and writes trl_config.yaml. Then TRL itself trains, as `trl grpo --config ...`, first the
   export and then TRL's defaults for the same recipe (the same generation batch, mini batch, completions
   per prompt, completion length and beta; GRPOConfig's own values for everything else:
   per_device_train_batch_size 8, gradient checkpointing on, no dataloader workers), each for `--steps`
   optimizer steps, in turn for `--rounds` rounds. Samples/sec is TRL's: the mini batch over TRL's
   `step_time` of each step, after the first generation round (the warm-up). The ratio of the medians, and
   every round's ratio, are printed.
2. The fidelity of autotune's built-in probe to TRL: every configuration of the space's grid is probed with
   `--engine builtin` and `--engine trl` (`--repeats` times each, alternately), and the Spearman rank
   correlation of their median samples/sec is printed (1.0: the built-in probe orders configurations as TRL
   does, so a study probed without TRL still picks what is fast in TRL).

One JSON line per measurement in `--out`, with the machine and its load, then a summary line. Needs TRL in
.venv (`./setup.sh test` installs it). About 7 minutes on two cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--space", default="trl-cpu-tiny")
    parser.add_argument("--rounds", type=int, default=3, help="back-to-back rounds of export vs defaults")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per TRL run")
    parser.add_argument("--repeats", type=int, default=2, help="probes per configuration and engine")
    parser.add_argument("--out", type=Path, default=common.RESULTS / "trl.jsonl")
    return parser.parse_args()


def save_model(folder: Path, model: str) -> None:
    """The space's model with random weights and autotune's tokenizer, as a local model folder."""
    from autotune.models.registry import build_causal_lm, resolve_model
    from autotune.models.tokenizer import load_tokenizer

    spec = resolve_model(model)
    build_causal_lm(spec, dtype="float32").save_pretrained(folder)
    load_tokenizer(spec).save_pretrained(folder)


def save_dataset(folder: Path, model: str, prompt_tokens: int, count: int = 512) -> None:
    """train.jsonl of prompts of about `prompt_tokens` tokens (TRL 1.16 does not truncate prompts)."""
    from autotune.models.registry import resolve_model
    from autotune.models.tokenizer import load_tokenizer
    from autotune.probe.rank.prompts import SyntheticPrompts

    tokenizer = load_tokenizer(resolve_model(model))
    texts = SyntheticPrompts(tokenizer, prompt_tokens, seed=1)
    rows = [{"prompt": tokenizer.decode(texts[i][:prompt_tokens])} for i in range(count)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def run_study(space: str, model: Path, out: Path) -> dict[str, Any]:
    """`autotune run --engine trl --target trl` on the space with the local model; its summary.json."""
    command = [sys.executable, "-m", "autotune", "run", "--engine", "trl", "--target", "trl"]
    command += ["--space", space, "--model", str(model), "--weights", "pretrained", "--device", "cpu"]
    command += ["--out", str(out), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"autotune run failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def defaults_config(export: dict[str, Any], mini_batch: int) -> dict[str, Any]:
    """TRL's defaults for the same recipe: the export's recipe fields, GRPOConfig's values for the rest (the
    accumulation follows from the mini batch at TRL's default per_device_train_batch_size 8, one process)."""
    recipe = ("model_name_or_path", "generation_batch_size", "num_generations", "max_completion_length")
    recipe += ("beta",)
    config = {key: export[key] for key in recipe}
    config["gradient_accumulation_steps"] = max(1, mini_batch // 8)
    return {**config, "use_cpu": True, "bf16": False}


def trl_samples_per_sec(config: Path, data: Path, work: Path, steps: int, mini: int, warmup: int) -> dict:
    """TRL trains `config` for `steps` optimizer steps, launched as a user does; samples/sec from its own
    step_time after `warmup` steps."""
    command = [str(TRL_CLI), "grpo", "--config", str(config), "--dataset_name", str(data)]
    command += ["--reward_funcs", "bench_reward.reward", "--max_steps", str(steps), "--logging_steps", "1"]
    command += ["--output_dir", str(work / "trl-out"), "--report_to", "none", "--save_strategy", "no"]
    env = {**os.environ, "PYTHONPATH": str(work), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.update(OMP_NUM_THREADS=str(os.cpu_count() or 1))
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work, check=False)
    times = [float(t) for t in STEP_TIME.findall(done.stdout + done.stderr)]
    if done.returncode != 0 or len(times) != steps:
        raise SystemExit(f"trl grpo failed ({done.returncode}, {len(times)} steps): {done.stderr[-2000:]}")
    measured = times[warmup:]
    return {"samples_per_sec": mini * len(measured) / sum(measured), "step_seconds": times}


def gain(args: argparse.Namespace, work: Path, log) -> dict[str, Any]:
    from autotune.space.model import load_space

    space = load_space(args.space)
    save_model(work / "model", space.model)
    save_dataset(work / "data", space.model, space.knob("max_prompt_length").values()[0])
    (work / "bench_reward.py").write_text(REWARD)
    summary = run_study(args.space, work / "model", work / "reports")
    export_path = Path(shlex.split(summary["launch"])[shlex.split(summary["launch"]).index("--config") + 1])
    export = yaml.safe_load(export_path.read_text())
    mini = export["per_device_train_batch_size"] * export["gradient_accumulation_steps"]
    defaults_path = work / "trl_defaults.yaml"
    defaults_path.write_text(yaml.safe_dump(defaults_config(export, mini), sort_keys=False))
    warmup = export["generation_batch_size"] // mini  # the first generation round's steps
    speeds: dict[str, list[float]] = {"export": [], "defaults": []}
    for round_ in range(args.rounds):
        for name, path in (("export", export_path), ("defaults", defaults_path)):
            figures = trl_samples_per_sec(path, work / "data", work, args.steps, mini, warmup)
            speeds[name].append(figures["samples_per_sec"])
            log({"kind": "trl_run", "round": round_, "config": name, **figures, "load": os.getloadavg()[0]})
    ratios = [e / d for e, d in zip(speeds["export"], speeds["defaults"], strict=True)]
    return {
        "export": {k: v for k, v in export.items() if k != "model_name_or_path"},
        "export_samples_per_sec": statistics.median(speeds["export"]),
        "defaults_samples_per_sec": statistics.median(speeds["defaults"]),
        "ratio": statistics.median(speeds["export"]) / statistics.median(speeds["defaults"]),
        "round_ratios": ratios,
        "study_pick_trial": (summary.get("recommended") or {}).get("trial"),
    }


def fidelity(args: argparse.Namespace, log) -> dict[str, Any]:
    from autotune.probe.launcher import run_probe
    from autotune.space.model import load_space

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


def main() -> int:
    args = parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as out, tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:

        def log(record: dict[str, Any]) -> None:
            out.write(json.dumps(record) + "\n")
            out.flush()

        log({"kind": "run", "args": {k: str(v) for k, v in vars(args).items()}, "machine": common.machine()})
        found = {"gain": gain(args, Path(tmp), log), "fidelity": fidelity(args, log)}
        log({"kind": "summary", **found})
    g, f = found["gain"], found["fidelity"]
    export, defaults = g["export_samples_per_sec"], g["defaults_samples_per_sec"]
    print(f"export {export:.2f}, TRL defaults {defaults:.2f} samples/s (TRL's step_time)")
    print(f"ratio {g['ratio']:.2f}x (rounds: {', '.join(f'{r:.2f}' for r in g['round_ratios'])})")
    print(f"fidelity: Spearman {f['spearman']:.3f} over {f['configs']} configurations (builtin vs TRL)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
