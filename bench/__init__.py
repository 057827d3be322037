"""autotune's benchmarks: every timing, throughput and memory figure about autotune itself (BENCHMARKS.md).

Each module is one benchmark, run as a module from the repository root, e.g.
`.venv/bin/python -m bench.fidelity --help`; `common` holds what they share (a space's probe settings,
budget and prior memory model, a table of probes by configuration, the machine's record). Figures files live
in `bench/results/`.
"""

__all__ = [
    "common",
    "fidelity",
    "gain",
    "gpu_check",
    "lengths_speed",
    "memory_model",
    "memory_points",
    "probe_overhead",
    "search_replay",
    "search_tables",
    "soak",
]
