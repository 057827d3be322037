"""What Ray adds to a probe's wall time: the same configuration probed on this machine and on a Ray cluster.

    python -m bench.ray_overhead [--repeats 3] [--ray ADDRESS] [--out bench/results/ray_overhead.json]

Without --ray it starts a cluster on this machine (Ray's `cluster_utils.Cluster`: a head that runs nothing and
two nodes of one CPU each, as tests/test_ray.py does) and stops it at the end; its start is not counted. Per
repeat, in turn: a local probe with ranks forked from the warm fork server (what `autotune run` does), a local
probe with fresh rank processes (AUTOTUNE_FORKSERVER=0, what each Ray rank does on its node), a probe on the
cluster, for one rank and for two ranks (on one machine: two local ranks; on the cluster: one rank on each of
two nodes, `--nodes 2`). The figures: wall, start-up (everything outside the warm-up and measured iterations),
the cluster's placement wait, and the medians of what Ray adds over each local way.

CPU ranks: one thread each on the cluster (a CPU per rank), one thread each locally too (so that the
iterations compare). The load average at the start and end is printed and kept: figures taken on a busy
machine must be measured again idle.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.probe import forkserver
from autotune.probe.cluster.connect import joined
from autotune.probe.contract import ProbeSettings
from autotune.probe.launcher import run_probe
from bench import common
from bench.probe_overhead import CONFIGS

CONFIG = next(c for name, c in CONFIGS.items() if name.startswith("issue example"))  # T16 R8 m4 g2, 32+16
WAYS = ("local, fork server", "local, fresh processes", "ray")


@contextlib.contextmanager
def local_cluster() -> Iterator[str]:
    """A head that runs nothing and two nodes of one CPU each, in a temp dir of its own."""
    temp = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # Ray's socket paths must stay short
    os.environ["RAY_TMPDIR"] = temp
    from ray.cluster_utils import Cluster

    small = {"object_store_memory": 75 * 1024**2}
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, **small}
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, **small)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def probe(way: str, ranks: int, address: str) -> dict[str, Any]:
    settings = ProbeSettings(model="tiny-llama", device="cpu", world_size=ranks, threads_per_rank=1)
    if way == "ray":
        settings = dataclasses.replace(settings, ray_address=address, nodes=ranks)
    os.environ[forkserver.SWITCH] = "0" if way == "local, fresh processes" else "1"
    result = run_probe(CONFIG, settings)
    assert result.status == "ok", result.message + result.stderr_tail
    return {
        "way": way,
        "ranks": ranks,
        "wall_seconds": round(result.wall_seconds, 3),
        "startup_seconds": round(result.startup_seconds, 3),
        "iterations_seconds": round(result.warmup_seconds + result.measured_seconds, 3),
        "placement_seconds": result.environment.get("cluster", {}).get("placement_seconds"),
        "nodes": sorted(set(result.rank_nodes)),
    }


def summary(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for ranks in sorted({row["ranks"] for row in rows}):
        wall = {way: median_wall(rows, way, ranks) for way in WAYS}
        forked, fresh = wall["ray"] - wall[WAYS[0]], wall["ray"] - wall[WAYS[1]]
        lines.append(
            f"{ranks} rank(s): median wall {wall['ray']:.1f} s on Ray; Ray adds {forked:+.1f} s over a local "
            f"probe forked from the warm server, {fresh:+.1f} s over fresh local processes"
        )
    return lines


def median_wall(rows: list[dict[str, Any]], way: str, ranks: int) -> float:
    return statistics.median(r["wall_seconds"] for r in rows if r["way"] == way and r["ranks"] == ranks)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ray", metavar="ADDRESS", help="a running cluster with two nodes of a free CPU")
    parser.add_argument("--out", type=Path, default=common.RESULTS / "ray_overhead.json")
    args = parser.parse_args()
    before = common.machine()
    print(f"load average at the start: {before['loadavg']}")
    cluster = contextlib.nullcontext(args.ray) if args.ray else local_cluster()
    rows = []
    with cluster as address, joined(address) as joined_cluster:
        forkserver.get()  # started once, outside every probe's wall time
        for repeat in range(args.repeats):
            for ranks in (1, 2):
                for way in WAYS:
                    row = {"repeat": repeat, **probe(way, ranks, joined_cluster.address)}
                    rows.append(row)
                    print(json.dumps(row))
    after = common.machine()
    lines = summary(rows)
    print("\n".join(lines))
    print(f"load average at the end: {after['loadavg']}")
    record = {"machine": before, "loadavg_end": after["loadavg"], "config": CONFIG.to_dict(), "rows": rows}
    args.out.write_text(json.dumps({**record, "summary": lines}, indent=1) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
