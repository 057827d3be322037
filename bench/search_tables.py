"""The benchmark tables of the search: every configuration of a space, probed twice.

    .venv/bin/python -m bench.search_tables [--tables ppo-1rank,sharded-2rank,grpo-lora-rm] [--passes 2]

Each table (bench/results/table-<name>.jsonl, committed; JSON lines) holds one row per probe: the config key,
the pass (1, 2), the `ProbeResult`, the load average when it started and the time it ended. The first pass
goes through the space's grid in order, the second in reverse, so that a slow stretch of the machine does not
fall on the same configurations twice. Probes run without a memory budget, so every peak and speed is
measured in full; the replay (bench/search_replay.py) applies the space's budget afterwards. Resumable: rows
already in the file are skipped. The rows are the configurations a study searches: the knobs verl has no key
for (the rollout batch) held as `autotune run` holds them, which is what the replay reads. About 6-10 minutes
per table on an idle 2-core machine. Probes beside other work on two cores run slower (a 2-rank probe lost
20-30% of its speed beside a replay, even at nice 19), so `--retake FILE` drops the rows measured during the
listed windows and probes them again. Never `git stash` a table while it is measured: the probes go on
appending to the file git replaced, and their rows are lost.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from autotune.probe.launcher import run_probe
from autotune.run.prepare import hold_unexported
from autotune.space.loading import load_space
from autotune.space.model import SearchSpace
from autotune.study.trials import config_key
from bench import common

__all__ = ["TABLES", "Table", "load_rows", "measure", "table_by_name"]

SPACES = Path(__file__).resolve().parent / "spaces"


@dataclass(frozen=True)
class Table:
    """A benchmark table: its space file and its measurements."""

    name: str

    @property
    def space_path(self) -> Path:
        return SPACES / f"{self.name}.yaml"

    @property
    def path(self) -> Path:
        return common.RESULTS / f"table-{self.name}.jsonl"

    def space(self, cores: int | None = None) -> SearchSpace:
        return load_space(str(self.space_path), cores=cores)

    def searched_space(self, search_unexported: bool = False) -> SearchSpace:
        """The space as `autotune run` searches it on the machine the tables were measured on (a fixed grid
        everywhere): the knobs verl has no key for held (autotune.run.prepare.hold_unexported), unless
        `search_unexported`."""
        return hold_unexported(self.space(cores=2), search_unexported, Console(quiet=True))


# one rank PPO full fine-tuning; two gloo ranks with sharding choices; GRPO with LoRA and a reward model
TABLES = (Table("ppo-1rank"), Table("sharded-2rank"), Table("grpo-lora-rm"))


def table_by_name(name: str) -> Table:
    for table in TABLES:
        if table.name == name:
            return table
    raise SystemExit(f"unknown table {name!r}; the tables are {', '.join(t.name for t in TABLES)}")


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The table's rows in file order ({"key", "pass", "result", "loadavg"}), keyed as `config_key` keys
    today; [] before it is measured."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{**row, "key": common.current_key(row["key"])} for row in rows]


def measure(table: Table, passes: int) -> None:
    """Probe every configuration `passes` times, appending to the table; rows already there are kept."""
    space = table.searched_space()  # the rows the replay reads
    settings = common.probe_settings(space, memory_budget_gib=None)
    done = {(row["key"], row["pass"]) for row in load_rows(table.path)}
    grid = space.grid()
    table.path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with table.path.open("a") as sink:
        for number in range(1, passes + 1):
            order = grid if number % 2 else list(reversed(grid))
            for index, config in enumerate(order):
                key = config_key(config)
                if (key, number) in done:
                    continue
                load = list(os.getloadavg())
                result = run_probe(config, settings)
                row = {"key": key, "pass": number, "result": asdict(result), "loadavg": load}
                row["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                print(
                    f"{table.name} pass {number} {index + 1}/{len(grid)}: {result.status} "
                    f"{result.samples_per_sec:.2f} samples/s {result.peak_memory_gib:.3f} GiB "
                    f"load {load[0]:.1f} ({time.monotonic() - started:.0f} s)",
                    flush=True,
                )


def drop_disturbed(table: Table, windows: list[tuple[str, str]]) -> int:
    """Remove the rows whose probe ran during any of `windows` (ISO times: when other work loaded the
    machine), so that `measure` probes them again; returns how many were removed."""
    spans = [(_seconds(start), _seconds(end)) for start, end in windows]
    rows = load_rows(table.path)
    kept = []
    for row in rows:
        ended = _seconds(row["time"]) if "time" in row else None
        began = ended - row["result"]["wall_seconds"] if ended is not None else None
        if ended is not None and any(began <= end and ended >= start for start, end in spans):
            continue
        kept.append(row)
    table.path.write_text("".join(json.dumps(row) + "\n" for row in kept))
    return len(rows) - len(kept)


def _seconds(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", default=",".join(t.name for t in TABLES))
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument(
        "--retake",
        type=Path,
        metavar="FILE",
        help="lines 'START END' (ISO times) when other work loaded the machine: their rows are probed again",
    )
    args = parser.parse_args()
    print(json.dumps(common.machine()))
    windows = (
        [tuple(line.split()[:2]) for line in args.retake.read_text().splitlines()] if args.retake else []
    )
    for name in args.tables.split(","):
        if windows:
            print(f"{name}: {drop_disturbed(table_by_name(name), windows)} rows to probe again")
        measure(table_by_name(name), args.passes)


if __name__ == "__main__":
    main()
