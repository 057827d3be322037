"""Probe slots for `--parallel P`: P probes at a time, each on its own disjoint set of W GPUs.

On CUDA a slot is W device ids, handed to the probe's ranks as CUDA_VISIBLE_DEVICES (P·W must not exceed the
GPUs that CUDA_VISIBLE_DEVICES allows or NVML reports). On CPU a slot is a share of the cores: each rank of
each concurrent probe gets cores // (P·W) threads, so concurrent probes do not oversubscribe the machine
(their timings still share memory bandwidth: compare them with each other, not with a --parallel 1 run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass

from autotune.config.knobs import usable_cores
from autotune.errors import UserError
from autotune.probe.contract import ProbeSettings

__all__ = ["Slot", "oversubscribed", "plan_slots", "visible_device_ids"]


@dataclass(frozen=True)
class Slot:
    index: int
    devices: tuple[str, ...] | None = None  # CUDA device ids (CUDA_VISIBLE_DEVICES entries); None on CPU
    threads: int | None = None  # CPU threads per rank; None on CUDA
    placed: bool = False  # on a Ray cluster: Ray places each probe (autotune.probe.cluster)

    def apply(self, settings: ProbeSettings) -> ProbeSettings:
        devices = ",".join(self.devices) if self.devices else None
        return dataclasses.replace(settings, visible_devices=devices, threads_per_rank=self.threads)

    def describe(self) -> str:
        if self.placed:
            return f"slot {self.index}: placed by Ray"
        if self.devices:
            return f"slot {self.index}: GPUs {','.join(self.devices)}"
        return f"slot {self.index}: {self.threads} CPU thread(s) per rank"


def visible_device_ids() -> list[str]:
    """The device ids a probe may use: CUDA_VISIBLE_DEVICES' entries when it is set, else NVML's count."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    count = 0
    with contextlib.suppress(Exception):  # no driver: no GPUs
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    if not count:
        import torch

        count = torch.cuda.device_count()  # NVML-based in torch too: does not initialise CUDA
    return [str(index) for index in range(count)]


def plan_slots(
    parallel: int,
    world_size: int,
    device: str,
    gpus: list[str] | None = None,
    cores: int | None = None,
    cluster: bool = False,
) -> list[Slot]:
    """P disjoint slots of W ranks; too few GPUs is a UserError naming what is visible. On a Ray cluster
    (`cluster`) Ray places each probe on the GPUs (or a CPU per rank) it holds for it."""
    if cluster:
        return [Slot(i, placed=True) for i in range(parallel)]
    if device == "cuda":
        gpus = visible_device_ids() if gpus is None else gpus
        needed = parallel * world_size
        if needed > len(gpus):
            raise UserError(
                f"--parallel {parallel} with {world_size} GPU(s) per probe needs {needed} GPUs, but "
                f"{len(gpus)} are visible ({','.join(gpus) or 'none'}); lower --parallel or --gpus"
            )
        return [Slot(i, tuple(gpus[i * world_size : (i + 1) * world_size])) for i in range(parallel)]
    cores = cores or usable_cores()
    threads = max(1, cores // (parallel * world_size))
    return [Slot(i, threads=threads) for i in range(parallel)]


def oversubscribed(slots: list[Slot], world_size: int, cores: int | None = None) -> bool:
    """CPU probes asking for more ranks than there are cores: their timings would mostly measure waiting."""
    cores = cores or usable_cores()
    return slots[0].devices is None and not slots[0].placed and len(slots) * world_size > cores
