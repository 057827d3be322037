"""The slot's GPUs as NVML sees them when CUDA_VISIBLE_DEVICES names them by index, by UUID (`GPU-...`, whole
or its start) or as MIG devices (`MIG-...`): conditions.visible_gpus, gpu_others and the verl backend's
GpuWatch, on a fake pynvml module (fast tier: no GPU, no process)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import pytest

from autotune.probe.conditions import disturbance, gpu_others, visible_gpus
from autotune.probe.verl.backend import GpuWatch
from autotune.units import GIB


class NVMLError(Exception):
    pass


@dataclass(eq=False)
class Device:
    uuid: str
    total: int
    used: int
    busy: float | None = 0.0  # None: NVML_ERROR_NOT_SUPPORTED, as on a MIG device
    parent: Device | None = None
    migs: list[Device] = field(default_factory=list)


def fake_pynvml(gpus: list[Device]) -> types.ModuleType:
    """The pynvml calls autotune makes, over `gpus` (with their MIG devices)."""
    nvml = types.ModuleType("pynvml")
    every = [d for gpu in gpus for d in (gpu, *gpu.migs)]

    def by_uuid(uuid: str) -> Device:  # the whole UUID, of a GPU or a MIG device
        found = [d for d in every if d.uuid == uuid]
        if not found:
            raise NVMLError("NVML_ERROR_NOT_FOUND")
        return found[0]

    def max_migs(gpu: Device) -> int:
        if not gpu.migs:
            raise NVMLError("NVML_ERROR_NOT_SUPPORTED")
        return 7

    def mig(gpu: Device, slot: int) -> Device:
        if slot >= len(gpu.migs):
            raise NVMLError("NVML_ERROR_NOT_FOUND")
        return gpu.migs[slot]

    def utilization(device: Device):
        if device.busy is None:
            raise NVMLError("NVML_ERROR_NOT_SUPPORTED")
        return types.SimpleNamespace(gpu=device.busy)

    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: len(gpus)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    nvml.nvmlDeviceGetHandleByUUID = by_uuid
    nvml.nvmlDeviceGetUUID = lambda d: d.uuid.encode()  # bytes, as older pynvml returns it
    nvml.nvmlDeviceGetIndex = lambda d: gpus.index(d)
    nvml.nvmlDeviceGetMaxMigDeviceCount = max_migs
    nvml.nvmlDeviceGetMigDeviceHandleByIndex = mig
    nvml.nvmlDeviceIsMigDeviceHandle = lambda d: int(d.parent is not None)
    nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle = lambda d: d.parent
    nvml.nvmlDeviceGetMemoryInfo = lambda d: types.SimpleNamespace(used=d.used, total=d.total)
    nvml.nvmlDeviceGetUtilizationRates = utilization
    return nvml


GPU0 = Device("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", 80 * GIB, 1 * GIB, busy=5.0)
GPU1 = Device("GPU-8932aaaa-1111-2222-3333-444455556666", 80 * GIB, 2 * GIB, busy=0.0)
MIG = Device("MIG-5c89852c-d268-c3f3-1b07-005d5ae1dc3f", 20 * GIB, 3 * GIB, busy=None, parent=GPU1)
GPU1.migs.append(MIG)


@pytest.fixture
def nvml(monkeypatch):
    module = fake_pynvml([GPU0, GPU1])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, [GPU0, GPU1]),
        ("", [GPU0, GPU1]),
        ("1", [GPU1]),
        ("1,0", [GPU1, GPU0]),
        (GPU1.uuid, [GPU1]),
        (f"{GPU1.uuid},{GPU0.uuid}", [GPU1, GPU0]),
        ("GPU-8932f", [GPU0]),  # an unambiguous start, as CUDA accepts
        (MIG.uuid, [MIG]),  # the MIG device's own handle, not its GPU's
        ("MIG-5c89", [MIG]),
        # CUDA hides an entry that names no device, and every entry after it
        ("GPU-8932", []),  # ambiguous: both GPUs start so
        ("0,GPU-ffff,1", [GPU0]),
        ("0,7,1", [GPU0]),
        ("0,cuda:1", [GPU0]),
    ],
)
def test_visible_gpus_resolve_indices_uuids_and_mig_devices(nvml, visible, expected):
    assert [handle for _, handle in visible_gpus(nvml, visible)] == expected


def test_gpu_others_by_uuid_and_mig(nvml):
    assert gpu_others("1,0") == [
        {"index": 1, "used_bytes": 2 * GIB, "utilization": 0.0},
        {"index": 0, "used_bytes": 1 * GIB, "utilization": 5.0},
    ]
    by_uuid = gpu_others(GPU0.uuid)
    assert by_uuid == [{"index": 0, "used_bytes": 1 * GIB, "utilization": 5.0, "device": GPU0.uuid}]
    # a MIG device: its own memory, on its GPU's index; NVML has no utilisation for it
    on_mig = gpu_others(MIG.uuid)
    assert on_mig == [{"index": 1, "used_bytes": 3 * GIB, "utilization": None, "device": MIG.uuid}]
    said = disturbance({"load": {"gpus": on_mig}})
    assert said == f"GPU 1 ({MIG.uuid}) had 3.0 GiB in use by others"


def test_gpu_watch_samples_the_slot_named_by_uuid_or_mig(nvml):
    watch = GpuWatch(MIG.uuid)
    assert watch.handles == [MIG] and watch.card_bytes == 20 * GIB and watch.baseline == [3 * GIB]
    MIG.used = 7 * GIB
    try:
        assert watch.used() == [7 * GIB]
    finally:
        MIG.used = 3 * GIB
    assert GpuWatch(f"{GPU1.uuid},{GPU0.uuid}").handles == [GPU1, GPU0]
    assert GpuWatch("GPU-ffff").handles == []  # nothing CUDA would show: nothing watched
