"""Soak: a 200-trial study of very short probes; trials per minute, and whether the tuner's memory grows.

    .venv/bin/python -m bench.soak                      # 200 trials on cpu-tiny, real probes (~5-10 min)
    .venv/bin/python -m bench.soak --parallel 2         # two probe slots, journal storage
    .venv/bin/python -m bench.soak --trials 40 --marks 10,40   # a quick look

It runs `autotune run` in this process (the same code as the command, `autotune.run.main.run_study`) on the
`cpu-tiny` space with 1 measured iteration and no warm-up per probe (the shortest real probe), and samples
this process's RSS, i.e. the tuner's, when the study reaches each mark (the last one as the tuner loop ends,
before the report is written: that imports matplotlib once). Probes are child processes and do not
count. Over 200 trials most proposals late in the study are already measured or pruned: that is the point, as
it is the bookkeeping (storage, sampler, memory model, progress) that must not grow with the trial count.

Aim (issue 6): RSS at trial 200 within a few MiB of RSS at trial 20.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import psutil
from rich.console import Console

MIB = 2**20


def space_with_short_probes(folder: Path) -> Path:
    """cpu-tiny with the shortest real probe: no warm-up, one measured iteration."""
    import yaml

    from autotune.space.loading import load_space

    data = dict(load_space("cpu-tiny").raw)
    data["probe"] = {**data.get("probe", {}), "warmup": 0, "iterations": 1}
    path = folder / "cpu-tiny-soak.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def watch(storage: str, study: str, marks: list[int], stop: threading.Event, seen: dict[int, dict]) -> None:
    """Record the tuner's RSS and the elapsed time when the study first reaches each mark."""
    from autotune.study.trials import finished_trials, open_study

    me, started, opened = psutil.Process(), time.monotonic(), None
    while not stop.is_set() and len(seen) < len(marks):
        try:
            opened = opened or open_study(storage, study, None, create=False)
            done = len(finished_trials(opened))
        except Exception:  # not created yet
            done = 0
        for mark in marks:
            if done >= mark and mark not in seen:
                seen[mark] = {"rss_mib": me.memory_info().rss / MIB, "seconds": time.monotonic() - started}
        stop.wait(0.5)


def soak(trials: int, parallel: int, marks: list[int], folder: Path) -> dict:
    import autotune.run.main
    from autotune.run.main import RunOptions, run_study
    from autotune.study.storage import default_storage_url

    study = "soak"
    storage = default_storage_url(folder / study, parallel)
    options = RunOptions(
        space=str(space_with_short_probes(folder)),
        trials=trials,
        out=folder,
        study=study,
        device="cpu",
        parallel=parallel,
    )
    seen: dict[int, dict] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(storage, study, marks, stop, seen), daemon=True)
    (folder / study).mkdir(parents=True, exist_ok=True)
    watcher.start()
    started = time.monotonic()
    # The last mark is taken as the tuner loop ends, before the report: writing a report imports matplotlib
    # (about 30 MiB, once), which is not the tuner growing with its trial count.
    write_report = autotune.run.main.finish

    def finish_after_sampling(*args, **kwargs):
        rss = psutil.Process().memory_info().rss / MIB
        seen.setdefault(trials, {"rss_mib": rss, "seconds": time.monotonic() - started})
        seen["report"] = {"rss_mib": None}
        result = write_report(*args, **kwargs)
        seen["report"] = {
            "rss_mib": psutil.Process().memory_info().rss / MIB,
            "seconds": time.monotonic() - started,
        }
        return result

    autotune.run.main.finish = finish_after_sampling
    try:
        run_study(options, Console(file=io.StringIO(), width=120))
    finally:
        autotune.run.main.finish = write_report
    elapsed = time.monotonic() - started
    time.sleep(1.0)  # the watcher's last look
    stop.set()
    watcher.join()
    return {"trials": trials, "parallel": parallel, "seconds": elapsed, "marks": seen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--marks", default="20,200", help="trial counts at which to sample the tuner's RSS")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    marks = sorted(int(mark) for mark in args.marks.split(","))
    with tempfile.TemporaryDirectory(prefix="autotune-soak-") as tmp:
        figures = soak(args.trials, args.parallel, marks, Path(tmp))
    figures["load_average"] = os.getloadavg()
    minutes = figures["seconds"] / 60
    print(
        f"{args.trials} trials in {minutes:.1f} min: {args.trials / minutes:.1f} trials/min "
        f"(parallel {args.parallel})"
    )
    report = figures["marks"].pop("report", None)
    for mark, sample in sorted(figures["marks"].items()):
        print(f"  tuner RSS at trial {mark:>4}: {sample['rss_mib']:.1f} MiB ({sample['seconds']:.0f} s in)")
    if report and report.get("rss_mib"):
        print(f"  after writing the report: {report['rss_mib']:.1f} MiB (matplotlib and the report, once)")
    first, last = marks[0], marks[-1]
    if first in figures["marks"] and last in figures["marks"]:
        growth = figures["marks"][last]["rss_mib"] - figures["marks"][first]["rss_mib"]
        print(f"  growth from trial {first} to {last}: {growth:+.1f} MiB (aim: a few MiB at most)")
    print(f"  load average during the run: {figures['load_average'][0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
