"""Measurements a probe rank takes of itself: peak memory (CUDA allocator, NVML, or RSS) and GPU utilisation.

Imported by the probe program (in the child), never needed by the tuner itself.
"""

from __future__ import annotations

import ctypes
import gc
import resource
import sys
import threading
from contextlib import suppress
from typing import Any

__all__ = ["NvmlSampler", "peak_memory", "peak_rss_bytes", "reset_peak", "rss_peak", "state_bytes"]


def peak_rss_bytes() -> int:
    """High-water mark of this process's resident set: on Linux its VmHWM, the peak of its own memory since it
    started (or since `reset_peak`). Not ru_maxrss there: at exec the kernel carries the spawning process's
    high-water mark into ru_maxrss, so a rank started by a 800 MiB test process or tuner read 800 MiB
    whatever it used itself. Elsewhere ru_maxrss (macOS reports bytes)."""
    with suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def reset_peak(device: str) -> None:
    """Start the peak afresh once the models are built. Building is not the job's memory: verl (and the probe,
    when it shards) builds on the host and moves only each rank's shard to the device; on CPU, where the host
    is the emulated device, the whole model each rank builds before sharding would otherwise be its peak.
    On Linux, glibc's malloc_trim hands the freed build memory back (small tensors live on the heap, which
    otherwise stays resident) and writing 5 to clear_refs resets the resident set's high-water mark (VmHWM,
    which `peak_rss_bytes` reads)."""
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
        return
    gc.collect()
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
    with suppress(OSError), open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def _local_bytes(tensor: Any, device: str) -> int:
    """Bytes this rank holds of `tensor` on `device`: a sharded (DTensor) parameter counts its shard."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size() if local.device.type == device else 0


def state_bytes(models: Any, device: str) -> dict[str, int]:
    """The training states this rank holds on `device` at the end of an iteration, tensor by tensor: the
    weights of every model, the gradients and Adam's states of the trained ones (what sharding divides and
    offload moves; the memory model's exact terms, measured)."""
    weights = gradients = optimizer = 0
    seen: set[int] = set()
    for model in (models.actor, models.ref, models.critic, models.reward):
        for param in model.parameters() if model is not None else ():
            if id(param) in seen:  # tied weights, or a reference that is the actor
                continue
            seen.add(id(param))
            weights += _local_bytes(param, device)
            if param.grad is not None:
                gradients += _local_bytes(param.grad, device)
    for opt in (models.actor_optimizer, models.critic_optimizer):
        for state in opt.state.values() if opt is not None else ():
            optimizer += sum(_local_bytes(v, device) for v in state.values() if hasattr(v, "numel"))
    return {"weights": weights, "gradients": gradients, "optimizer": optimizer}


class NvmlSampler:
    """Samples one GPU's utilisation and device-level memory in a background thread.

    NVML sees the whole device (CUDA context, other processes, fragmentation), which the torch allocator
    does not; sampling may miss a short spike, so the caller reports the larger of the two peaks.
    """

    def __init__(self, device_index: int, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak_used = 0
        self._utilization: list[int] = []
        self._active = False
        self._stop = threading.Event()
        self._handle = None
        with suppress(Exception):  # no NVML (no driver, or a CPU box): utilisation stays unknown
            import pynvml
            import torch

            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(device_index).uuid)
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(
                uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            )
        self._thread = threading.Thread(target=self._loop, daemon=True)
        if self._handle is not None:
            self._thread.start()

    @property
    def available(self) -> bool:
        return self._handle is not None

    def measuring(self, active: bool) -> None:
        """Utilisation counts only while an iteration runs (not during model build or between phases)."""
        self._active = active

    def _loop(self) -> None:
        import pynvml

        while not self._stop.wait(self.interval):
            with suppress(Exception):
                used = pynvml.nvmlDeviceGetMemoryInfo(self._handle).used
                self.peak_used = max(self.peak_used, int(used))
                if self._active:
                    self._utilization.append(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def stop(self) -> float | None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)
        return sum(self._utilization) / len(self._utilization) if self._utilization else None


def rss_peak(peak_bytes: int) -> dict[str, Any]:
    """A CPU rank's peak as results carry it: its resident set's high-water mark."""
    return {"bytes": peak_bytes, "source": "rss", "rss_bytes": peak_bytes}


def peak_memory(device: str, sampler: NvmlSampler | None) -> dict[str, Any]:
    """This rank's peak: CUDA allocator peaks plus NVML's device figure, or the peak RSS on CPU."""
    if device != "cuda":
        return rss_peak(peak_rss_bytes())
    import torch

    reserved = int(torch.cuda.max_memory_reserved())
    allocated = int(torch.cuda.max_memory_allocated())
    nvml = sampler.peak_used if sampler and sampler.available else 0
    return {
        "bytes": max(reserved, nvml),
        "source": "nvml" if nvml > reserved else "torch_reserved",
        "torch_reserved_bytes": reserved,
        "torch_allocated_bytes": allocated,
        "nvml_used_bytes": nvml or None,
        "rss_bytes": peak_rss_bytes(),
    }
