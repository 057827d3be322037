"""A CPU platform for verl 0.9.1, registered from outside verl through its own plugin API (issue 48).

With it and hf_cpu_rollout.py (imported at the bottom of this file), `python -m verl.trainer.main_ppo` runs
GRPO steps on CPU: the FSDP2 actor on gloo, generation by Hugging Face `generate` in a Ray actor. autotune's
verl probe loads it on `--device cpu` (autotune/probe/verl/cpu.py); docs/verl-cpu.md has the chain of
blockers and what gets past each. verl is not patched; torch is, twice, below, each with its reason.

Load with VERL_USE_EXTERNAL_MODULES=cpu_platform (this folder on PYTHONPATH) and VERL_PLATFORM=cpu:
verl/__init__.py:49-52 imports the modules named there in every process that imports verl (Ray's too).
"""

from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


class _CPUDeviceModule(ModuleType):
    """torch.cpu plus no-op stand-ins for the torch.cuda calls verl makes through get_torch_device()."""

    def __init__(self):
        super().__init__("verl_cpu_device")

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    def empty_cache(self):
        return None

    def ipc_collect(self):
        return None

    def set_device(self, *a, **k):
        return None

    def set_per_process_memory_fraction(self, *a, **k):
        return None

    def mem_get_info(self, *a, **k):
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    # CPU has no device allocator to ask. So that verl's perf/max_memory_* metrics (engine_workers.py:219,
    # profiler/performance.py:49) mean something, they report this process's resident memory: current RSS for
    # memory_allocated/reserved, peak RSS (getrusage, not resettable) for max_memory_allocated/reserved.
    def memory_allocated(self, *a, **k):
        import psutil

        return psutil.Process().memory_info().rss

    memory_reserved = memory_allocated

    def max_memory_allocated(self, *a, **k):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux

    max_memory_reserved = max_memory_allocated

    def reset_peak_memory_stats(self, *a, **k):
        return None

    def get_rng_state(self, *a, **k):
        return torch.get_rng_state()

    def set_rng_state(self, state, *a, **k):
        torch.set_rng_state(state)

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def get_device_name(self, *a, **k):
        return "cpu"

    class Event:
        def __init__(self, *a, **k):
            pass

        def record(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def wait(self, *a, **k):
            pass


_CPU_DEVICE_MODULE = _CPUDeviceModule()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return True

    def current_device(self):
        # verl passes get_device_id() straight to .to()/device= (e.g. utils/fsdp_utils.py:507); an int 0 means
        # "accelerator 0" to torch, which fails on a CPU-only build. A torch.device("cpu") works there.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # declared, fake GPUs via ray.init(num_gpus=N)

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


# --- workaround 1: verl/utils/distributed.py:89 builds f"cpu:gloo,{device}:{backend}", which on device "cpu"
# is "cpu:gloo,cpu:gloo" and torch rejects a duplicate device type. Dedupe it in torch (verl untouched).
_orig_init_pg = torch.distributed.init_process_group


def _init_process_group(*args, **kwargs):
    backend = kwargs.get("backend")
    if isinstance(backend, str) and "," in backend:
        parts = list(dict.fromkeys(p.strip() for p in backend.split(",")))
        kwargs["backend"] = ",".join(parts)
    return _orig_init_pg(*args, **kwargs)


torch.distributed.init_process_group = _init_process_group


# --- workaround 2: FSDP2's CPUOffloadPolicy, which verl gives every forward-only engine (the reference) and
# an engine with offload_policy on, hard-coded as CPUOffloadPolicy(pin_memory=True)
# (workers/engine/fsdp/transformer_impl.py:462), pins each shard (torch/distributed/fsdp/_fully_shard/
# _fsdp_param.py:315); pinning page-locks host memory for copies to an accelerator, and torch refuses it
# where there is none. With no accelerator the tensor stays as it is: there is nothing to copy it to.
_orig_pin_memory = torch.Tensor.pin_memory


def _pin_memory(self, *args, **kwargs):
    if not torch.accelerator.is_available():
        return self
    return _orig_pin_memory(self, *args, **kwargs)


torch.Tensor.pin_memory = _pin_memory


# --- the rollout: verl 0.9.1 has none that runs on CPU. hf_cpu_rollout registers one named "hf_cpu" in verl's
# rollout registries; imported here, after the platform above is registered, so one env var loads both.
import hf_cpu_rollout  # noqa: E402,F401
