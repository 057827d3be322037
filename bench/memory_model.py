"""The memory model against measured peaks over the fidelity configurations, before and after calibration.

    .venv/bin/python -m bench.memory_model --from bench/results/fidelity.jsonl     # no probes: reuse peaks
    .venv/bin/python -m bench.memory_model [--space cpu-tiny] [--configs 12]        # probes each config once
    .venv/bin/python -m bench.memory_model --from bench/results/table-ppo-1rank.jsonl \
        --space bench/spaces/ppo-1rank.yaml                                            # a whole table

Peaks come from the short probes of `bench.fidelity` (the same configurations, the same probe `autotune
run` launches; with `--from`, its first repeat of each), or from one short probe per configuration (saved to
`--out`), or from a table of bench.search_tables (every configuration of its space; the last probe of each).
Prints, per configuration, the measured peak and the prediction from the priors alone and after calibrating
on `--calibrate-on` probes (the first ones measured; for the grid, the first ones fidelity.py would pick),
fitted from the priors with `MemoryModel.calibrate` as `Tuner.calibrate` does; then the median and worst
relative error: the priors' over every configuration, the calibrated model's over the held-out ones. Then
the spread of held-out errors over every choice of 3 calibration points (memory_points.py's `triples`; up
to 30 configurations), which side of the space's feasibility limit each prediction falls on, and, where
the fidelity file has long runs, how much higher the long run's peak is than the short probe's.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from autotune.config.knobs import ProbeConfig
from autotune.memory.calibration import MemoryModel
from autotune.space.loading import load_space
from autotune.space.model import SearchSpace
from bench import common, fidelity
from bench.memory_points import triples

DEFAULT_OUT = common.RESULTS / "memory_model.jsonl"


def probe_peaks(space: SearchSpace, count: int, seed: int, out: Path) -> list[dict[str, Any]]:
    """One short probe per configuration, written as fidelity.py's probe lines."""
    settings = fidelity.probe_settings(space)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with out.open("w", encoding="utf-8") as sink, fidelity.keep_timing() as timing:
        for index, config in enumerate(fidelity.pick_configs(space, count, seed)):
            name = fidelity.label(config, space)
            row = fidelity.probe_row(
                config, settings, timing, index=index, label=name, mode="short", repeat=0
            )
            print(
                f"{index + 1}/{count} {name:22s} {row['status']} {row['peak_memory_bytes'] / 2**30:.3f} GiB"
            )
            sink.write(json.dumps(row) + "\n")
            rows.append(row)
    return rows


def grid_rows(path: Path, space: SearchSpace, first: int) -> list[dict[str, Any]]:
    """A bench.search_tables table (every configuration, the last probe of each) as fidelity.py's probe lines,
    ordered so that the `first` configurations fidelity.py would pick come first (the calibration points)."""
    picked = [fidelity.label(c, space) for c in fidelity.pick_configs(space, first)]
    rows = []
    for number, result in enumerate(common.grid_table(path).values()):
        name = fidelity.label(ProbeConfig(**result["config"]), space)
        index = picked.index(name) if name in picked else first + number
        rows.append({**result, "index": index, "label": name, "mode": fidelity.SHORT, "repeat": 0})
    return rows


def load_rows(path: Path, space: SearchSpace, first: int) -> list[dict[str, Any]]:
    head = json.loads(path.read_text().splitlines()[0])
    return grid_rows(path, space, first) if "result" in head else fidelity.load_rows(path)


def measured(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Per configuration, in probe order: the first ok short probe's peak (what a study would have seen),
    and the long run's peak where there is one."""
    table: dict[str, dict[str, Any]] = {}
    for r in rows:
        # a peak over an emulated budget was measured in full: it counts (a real OOM's peak does not)
        if r["status"] != "ok" and r.get("oom_kind") != "emulated":
            continue
        entry = table.setdefault(r["label"], {"index": r["index"], "config": r["config"]})
        if r["mode"] == fidelity.SHORT:
            entry.setdefault("peak", r["peak_memory_bytes"])
        else:
            entry["long_peak"] = r["peak_memory_bytes"]
    frame = pd.DataFrame.from_dict(table, orient="index").dropna(subset=["peak"])
    return frame.sort_values("index")


def predictions(frame: pd.DataFrame, prior: MemoryModel, calibration: list[str]) -> pd.DataFrame:
    """Predicted peaks and relative errors from the priors and after calibrating on `calibration`."""
    configs = {name: ProbeConfig(**frame.at[name, "config"]) for name in frame.index}
    fitted = MemoryModel(prior.arch, prior.world_size, prior.device).calibrate(
        [(configs[name], int(frame.at[name, "peak"])) for name in calibration]
    )
    out = pd.DataFrame(index=frame.index)
    out["measured_gib"] = frame["peak"] / 2**30
    for tag, model in (("prior", prior), ("calibrated", fitted)):
        out[f"{tag}_gib"] = [model.predict(configs[name]) / 2**30 for name in frame.index]
        out[f"{tag}_err_%"] = 100 * (out[f"{tag}_gib"] / out["measured_gib"] - 1)
    out["calibration"] = [name in calibration for name in frame.index]
    if "long_peak" in frame:
        out["long_vs_short_%"] = 100 * (frame["long_peak"] / frame["peak"] - 1)
    print(
        f"calibrated on {calibration}: constant {fitted.constant / 2**30:.3f} GiB, factor {fitted.factor:.3f}"
    )
    return out


def error_line(label: str, errors: pd.Series) -> str:
    errors = errors.abs()
    return (
        f"{label}: median |err| {errors.median():.1f}%, worst {errors.max():.1f}% over {len(errors)} configs"
    )


def feasibility(table: pd.DataFrame, limit_gib: float) -> str:
    """Held-out configurations the calibrated model puts on the other side of the feasibility limit."""
    held = table[~table["calibration"]]
    over = held[(held["calibrated_gib"] > limit_gib) & (held["measured_gib"] <= limit_gib)]
    under = held[(held["calibrated_gib"] <= limit_gib) & (held["measured_gib"] > limit_gib)]
    wrong = pd.concat([over, under])
    line = (
        f"feasibility (peak <= {limit_gib:.3f} GiB), calibrated model on held-out configs: {len(over)} of "
        f"{len(held)} predicted over the limit but measured under, {len(under)} the other way"
    )
    if len(wrong):
        distance = (wrong["measured_gib"] - limit_gib).abs().max()
        line += f"; the farthest misjudged peak is {1024 * distance:.0f} MiB from the limit"
    return line


def repeat_spread(rows: list[dict[str, Any]]) -> str | None:
    """How much the peak of the same configuration moves between short probes: a floor for any model."""
    peaks: dict[str, list[int]] = {}
    for r in rows:
        if r["mode"] == fidelity.SHORT and r["status"] == "ok":
            peaks.setdefault(r["label"], []).append(r["peak_memory_bytes"])
    spreads = [(max(p) - min(p)) / statistics.median(p) for p in peaks.values() if len(p) > 1]
    if not spreads:
        return None
    return (
        f"peak of repeated short probes of one config, (max-min)/median: "
        f"median {100 * statistics.median(spreads):.1f}%, "
        f"worst {100 * max(spreads):.1f}% over {len(spreads)} configs"
    )


def all_triples(frame: pd.DataFrame, prior: MemoryModel, space: SearchSpace) -> None:
    """Every choice of 3 calibration configurations (memory_points.triples, in its row format)."""
    rows = [
        {
            "name": name,
            "model": space.model,
            "reward_model": space.reward_model,
            "gpus": space.gpus,
            "config": frame.at[name, "config"],
            "peak_memory_bytes": int(frame.at[name, "peak"]),
        }
        for name in frame.index
    ]
    # memory_points.triples pools tiny-llama on one rank with a reward function; C(n, 3) grows fast
    if (
        space.model == "tiny-llama"
        and space.reward_model == "function"
        and space.gpus == 1
        and 3 < len(rows) <= 30
    ):
        triples(rows, lambda row: prior)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--from", dest="source", type=Path, help="fidelity.py's JSON lines: reuse its peaks")
    parser.add_argument("--space", default=None, help="default: the fidelity file's space, else cpu-tiny")
    parser.add_argument("--configs", type=int, default=12, help="without --from: configurations to probe")
    parser.add_argument(
        "--seed", type=int, default=0, help="without --from: seed of the configuration choice"
    )
    parser.add_argument("--calibrate-on", type=int, default=3, help="calibrate on the first N probes (3)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="without --from: where the probes go")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    space = load_space(args.space or (args.source and fidelity.space_name(args.source)) or "cpu-tiny")
    if args.source:
        rows = load_rows(args.source, space, args.calibrate_on)
    else:
        rows = probe_peaks(space, args.configs, args.seed, args.out)
    frame = measured(rows)
    prior = common.prior_memory_model(space)
    table = predictions(frame, prior, list(frame.index[: args.calibrate_on]))
    with pd.option_context(
        "display.width", 160, "display.max_columns", 20, "display.float_format", "{:.3f}".format
    ):
        print(table)
    held = table[~table["calibration"]]
    print(error_line("priors only", table["prior_err_%"]))
    print(error_line(f"calibrated on {args.calibrate_on} probes, held out", held["calibrated_err_%"]))
    print(feasibility(table, fidelity.limit_gib(space)))
    if "long_vs_short_%" in table:
        growth = table["long_vs_short_%"].dropna()
        print(
            f"long run's peak vs the short probe's: median {statistics.median(growth):+.1f}%, "
            f"range {growth.min():+.1f}% to {growth.max():+.1f}%"
        )
    spread = repeat_spread(rows)
    if spread:
        print(spread)
    all_triples(frame, prior, space)


if __name__ == "__main__":
    main()
