"""The conditions a probe ran in: how much of the machine other work took while it was measured.

A probe's samples/sec is only comparable with another's when both had the machine to themselves: on a shared
2-core box a load of 6 made the same configuration 3x slower. So each probe records
- on every device, the cores other work kept busy during the measured iterations: the busy CPU time of the
  cores the probe may run on (/proc/stat, its CPU affinity) less the CPU time of the probe's own ranks and
  their children, over the window's wall time, with the 1-minute load average at the probe's start and end
  beside it;
- on CUDA, the memory and utilisation the slot's GPUs showed before the probe's ranks started (NVML): what
  other processes held.
`disturbance` says when that is enough to matter. Linux only; elsewhere the figures are absent.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.units import GIB

__all__ = [
    "CpuWindow",
    "busy_now",
    "disturbance",
    "gpu_others",
    "load_average",
    "machine_busy_seconds",
    "other_cores",
    "tree_cpu_seconds",
    "visible_gpus",
    "worst_disturbance",
]

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
OTHER_CORES_FLOOR = 0.25  # other work below a quarter of a core is noise (the tuner's own threads, daemons)
OTHER_CORES_SHARE = 0.10  # ... or below a tenth of the machine's cores
GPU_OTHER_BYTES = GIB  # more than a CUDA context's worth of memory held by someone else
GPU_OTHER_UTILIZATION = 10.0  # percent


def machine_busy_seconds() -> float | None:
    """CPU seconds the cores this process may run on spent not idle since boot (/proc/stat's `cpuN` lines
    of its affinity: work pinned to other cores does not slow the probe); None off Linux."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    mine = {f"cpu{core}" for core in os.sched_getaffinity(0)}
    rows = [line.split() for line in lines if line.startswith("cpu")]
    busy = [_busy_ticks(row[1:]) for row in rows if row[0] in mine]
    return sum(busy) / TICKS if busy else None


def _busy_ticks(fields: list[str]) -> int:
    values = [int(value) for value in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    guest = sum(values[8:10]) if len(values) > 9 else 0  # already counted in user and nice
    return sum(values) - idle - guest


def _process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, user + system CPU seconds) of every process /proc shows."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS)
    return table


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (every thread) and its living descendants (DataLoader
    workers); 0 where /proc cannot be read."""
    table = _process_table() if Path("/proc").is_dir() else {}
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    total, todo = 0.0, [pid or os.getpid()]
    while todo:
        current = todo.pop()
        total += table.get(current, (0, 0.0))[1]
        todo += children.get(current, [])
    return total


def load_average() -> float | None:
    with contextlib.suppress(OSError, AttributeError):
        return round(os.getloadavg()[0], 2)
    return None


class CpuWindow:
    """A rank's measured iterations: its own CPU time and (where it can be read) the machine's."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.own = tree_cpu_seconds()
        self.machine = machine_busy_seconds()

    def stop(self) -> dict[str, float | None]:
        machine = machine_busy_seconds()
        return {
            "wall_seconds": time.monotonic() - self.started,
            "own_cpu_seconds": tree_cpu_seconds() - self.own,
            "machine_busy_seconds": None
            if machine is None or self.machine is None
            else machine - self.machine,
        }


def other_cores(windows: list[dict[str, Any] | None]) -> float | None:
    """Cores other work kept busy during the ranks' measured iterations (rank 0's window; every rank's own
    CPU time subtracted); None when a rank did not report or the machine's figure is unknown."""
    reported = [w for w in windows if w is not None]
    if not windows or len(reported) != len(windows):
        return None
    lead = reported[0]
    machine, wall = lead.get("machine_busy_seconds"), lead.get("wall_seconds") or 0.0
    if machine is None or wall <= 0:
        return None
    own = sum(float(w.get("own_cpu_seconds") or 0.0) for w in reported)
    return round(max(0.0, (machine - own) / wall), 2)


def _nvml_uuids(pynvml: Any) -> Iterator[tuple[str, Any]]:
    """(UUID, handle) of every GPU NVML sees and of every MIG device on them (`GPU-...`, `MIG-...`)."""
    for index in range(pynvml.nvmlDeviceGetCount()):
        gpu = pynvml.nvmlDeviceGetHandleByIndex(index)
        yield _text(pynvml.nvmlDeviceGetUUID(gpu)), gpu
        slots = 0
        with contextlib.suppress(Exception):  # NVML_ERROR_NOT_SUPPORTED: no MIG on this GPU
            slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)
        for slot in range(slots):
            with contextlib.suppress(Exception):  # NVML_ERROR_NOT_FOUND: an empty slot
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
                yield _text(pynvml.nvmlDeviceGetUUID(mig)), mig


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml_handle(pynvml: Any, entry: str) -> Any | None:
    """The NVML handle of one CUDA_VISIBLE_DEVICES entry, None when it names no device: an index, a GPU or
    MIG UUID (nvmlDeviceGetHandleByUUID takes both, a MIG UUID giving the MIG device's handle), or, as CUDA
    accepts, the start of one that no other device's UUID shares."""
    if entry.isdigit():
        index = int(entry)
        return pynvml.nvmlDeviceGetHandleByIndex(index) if index < pynvml.nvmlDeviceGetCount() else None
    if not entry.startswith(("GPU-", "MIG-")):
        return None
    with contextlib.suppress(Exception):
        return pynvml.nvmlDeviceGetHandleByUUID(entry)
    matches = [handle for uuid, handle in _nvml_uuids(pynvml) if uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None


def visible_gpus(pynvml: Any, visible_devices: str | None) -> list[tuple[str, Any]]:
    """(entry, NVML handle) of each device CUDA_VISIBLE_DEVICES makes visible, in its order; every GPU NVML
    sees when it is unset or empty. Indices, UUIDs (`GPU-...`) and MIG devices (`MIG-...`) alike; like
    CUDA, an entry that names no device hides it and every entry after it (CUDA C++ Programming Guide, "CUDA
    Environment Variables"). NVML must be initialised."""
    entries = [item.strip() for item in (visible_devices or "").split(",") if item.strip()]
    if not entries:
        return [(str(i), pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    found = []
    for entry in entries:
        handle = _nvml_handle(pynvml, entry)
        if handle is None:
            break
        found.append((entry, handle))
    return found


def _gpu_index(pynvml: Any, handle: Any, fallback: int) -> int:
    """NVML's index of the GPU a handle is on (a MIG device's parent GPU), else `fallback`."""
    with contextlib.suppress(Exception):
        if pynvml.nvmlDeviceIsMigDeviceHandle(handle):
            handle = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    with contextlib.suppress(Exception):
        return int(pynvml.nvmlDeviceGetIndex(handle))
    return fallback


def _gpu_use(pynvml: Any, position: int, entry: str, handle: Any) -> dict[str, Any]:
    """What one device held and how busy it was; utilisation None where NVML has none (a MIG device)."""
    utilization = None
    with contextlib.suppress(Exception):
        utilization = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    use = {
        "index": _gpu_index(pynvml, handle, position),
        "used_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).used),
        "utilization": utilization,
    }
    return use if entry.isdigit() else {**use, "device": entry}


def gpu_others(visible_devices: str | None) -> list[dict[str, Any]] | None:
    """Memory and utilisation of the slot's GPUs before the probe's ranks exist (NVML, no CUDA context in
    the tuner): all of it belongs to other processes. None without NVML. A slot given by UUID or MIG device
    (`visible_gpus`) records the entry as `device` beside its GPU's index."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML (a CPU machine or no driver)
        return None
    try:
        devices = visible_gpus(pynvml, visible_devices)
        return [_gpu_use(pynvml, position, *device) for position, device in enumerate(devices)]
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def worst_disturbance(environments: list[dict[str, Any]]) -> str:
    """One text for several probes: the most other work any of them saw, '' when none mattered."""
    disturbed = [env for env in environments if disturbance(env)]
    if not disturbed:
        return ""
    loads = [env.get("load") or {} for env in disturbed]
    busiest = max(loads, key=lambda load: load.get("other_cores") or 0.0)
    gpus = [gpu for load in loads for gpu in load.get("gpus") or []]
    worst = {**busiest, "gpus": sorted(gpus, key=lambda gpu: -gpu["used_bytes"])[:1]}
    return disturbance({"load": worst}).replace(" kept ", " kept up to ").replace(" had ", " had up to ")


def busy_now(probing: bool, cores: int | None = None) -> str:
    """Other work on the machine right now, from the load average beside the probes (which keep at most
    every core busy while one runs): '' when it is not enough to slow them."""
    cores = cores or len(os.sched_getaffinity(0))
    load = load_average()
    if load is None:
        return ""
    other = load - (cores if probing else 0)
    if other < max(1.0, OTHER_CORES_SHARE * cores):
        return ""
    return f"other work: load {load:.1f} on {cores} cores, probes run slower (see --timeout-per-probe)"


def timeout_under_load(environment: dict[str, Any], limit: float) -> float | None:
    """The wall-clock limit a probe that timed out at `limit` s may need at the load it ran under (its share
    of the cores shrank in proportion), rounded up to 100 s; None when the load did not slow it."""
    load = environment.get("load") or {}
    cores = load.get("cores") or len(os.sched_getaffinity(0))
    high = _load_beyond_probe(load, cores)
    if high is None or limit <= 0:
        return None
    return float(math.ceil(limit * high / cores / 100) * 100)


def _load_beyond_probe(load: dict[str, Any], cores: int) -> float | None:
    """The 1-minute load average where it shows other work beside the probe (which keeps at most `cores`
    busy) by a core or more: the only sign left when the ranks reported no CPU time (a timeout, a crash)."""
    seen = [v for v in (load.get("load_1m_start"), load.get("load_1m_end")) if isinstance(v, (int, float))]
    if not seen or max(seen) - cores < max(1.0, OTHER_CORES_SHARE * cores):
        return None
    return float(max(seen))


def disturbance(environment: dict[str, Any], cores: int | None = None) -> str:
    """What other work took during a probe when it is enough to matter, else ''."""
    load = environment.get("load") or {}
    cores = cores or load.get("cores") or len(os.sched_getaffinity(0))
    said = []
    busy = load.get("other_cores")
    if busy is not None and busy >= max(OTHER_CORES_FLOOR, OTHER_CORES_SHARE * cores):
        said.append(f"other work kept {busy:.1f} of {cores} cores busy")
    elif busy is None and (high := _load_beyond_probe(load, cores)):
        said.append(f"the load average reached {high:.1f} on {cores} cores (other work beside the probe)")
    for gpu in load.get("gpus") or []:
        busy_gpu = gpu.get("utilization")
        if gpu["used_bytes"] > GPU_OTHER_BYTES or (busy_gpu or 0.0) > GPU_OTHER_UTILIZATION:
            name = f"GPU {gpu['index']}" + (f" ({gpu['device']})" if gpu.get("device") else "")
            shown = f" and {busy_gpu:.0f}%" if busy_gpu is not None else ""
            said.append(f"{name} had {gpu['used_bytes'] / GIB:.1f} GiB{shown} in use by others")
    return "; ".join(said)
