"""The probe's contract, both sides of the process boundary: what goes in, what comes out.

The tuner writes a job file `{"config": ProbeConfig, "settings": ProbeSettings}`; each rank of the program in
`runners/` writes `result.rank<R>.json` and exits 0 (measured), `OOM_EXIT_CODE` (it caught an
out-of-memory exception and wrote its result) or anything else (a crash). The launcher turns those into one
`ProbeResult` (see `autotune.probe.classify` for who decides the status).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.units import GIB

if TYPE_CHECKING:
    from autotune.config.knobs import ProbeConfig

__all__ = ["MMAP_THRESHOLD", "OOM_EXIT_CODE", "PARENT_VARIABLE", "ProbeResult", "ProbeSettings"]


OOM_EXIT_CODE = 3  # a rank that caught an out-of-memory exception, after writing its result
PARENT_VARIABLE = "AUTOTUNE_RANK_PARENT"  # the pid a rank's parent has, named by the launcher that starts it
# CPU ranks serve allocations from this size up with their own mappings (glibc's M_MMAP_THRESHOLD): a freed
# tensor leaves the resident set, as it leaves a device allocator. The memory model knows the same number.
MMAP_THRESHOLD = 64 * 1024


@dataclass(frozen=True)
class ProbeSettings:
    """Everything about a probe that is not a batch knob."""

    model: str = "tiny-llama"
    reward_model: str = "function"
    weights: str = "random"
    device: str = "cpu"
    world_size: int = 1
    warmup_iterations: int = 1
    iterations: int = 2
    timeout_seconds: float = 600.0
    memory_budget_gib: float | None = None
    seed: int = 0
    trust_remote_code: bool = False
    prompts_file: str | None = None  # JSON list of prompt texts (autotune run --data); None: synthetic
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES for the ranks (a --parallel slot's GPUs)
    threads_per_rank: int | None = None  # CPU threads per rank (a --parallel slot's share of the cores)
    engine: str = "builtin"  # autotune.trainers.registry.ENGINES: the built-in probe, or verl or TRL
    # the python the engine's probes run under: its environment's (--verl-python, --trl-python); None: this
    # one (the built-in probe's and TRL's default; verl's engine needs one)
    engine_python: str | None = None
    # whose training passes the built-in probe runs (autotune.probe.rank.ppo.PASSES): verl's packed passes on
    # synthetic rollouts of the job's lengths, or TRL's generate and padded passes
    passes: str = "verl"
    # the job's token lengths (autotune.config.job_lengths.JobLengths.to_dict()); None: every sample at the
    # limits
    lengths: dict[str, Any] | None = None
    # A Ray cluster (--ray): its address as this tuner reached it; None: the ranks run on this machine
    ray_address: str | None = None
    nodes: int = 1  # machines a probe spans (--nodes); world_size = nodes × GPUs per node
    placement_timeout: float = 300.0  # how long a probe waits for the cluster to place its ranks

    @property
    def budget_bytes(self) -> int | None:
        """The memory budget per rank in bytes; None without one."""
        return int(self.memory_budget_gib * GIB) if self.memory_budget_gib else None

    @property
    def gpus_per_node(self) -> int:
        return self.world_size // self.nodes


@dataclass
class ProbeResult:
    """One probe's measurement; `status` is one of `autotune.status.PROBE_STATUSES`."""

    status: str
    # How an OOM was established: "cuda" (torch.OutOfMemoryError), "host" (MemoryError on CPU),
    # or "emulated" (peak above --memory-budget, which no hardware enforced).
    oom_kind: str | None = None
    samples_per_sec: float = 0.0
    tokens_per_sec: float = 0.0
    iteration_seconds: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    peak_memory_bytes: int = 0
    peak_memory_source: str = ""
    rank_peaks: list[dict[str, Any]] = field(default_factory=list)
    gpu_utilization: float | None = None
    memory_budget_bytes: int | None = None
    wall_seconds: float = 0.0
    measured_seconds: float = 0.0
    warmup_seconds: float = 0.0
    startup_seconds: float = 0.0
    world_size: int = 1
    device: str = "cpu"
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    stderr_tail: str = ""
    # verl's passes: per pass ("update", "forward", "critic update", "critic forward"), the micro batches and
    # tokens packed per iteration and the largest micro batch's tokens, per rank (rank 0's)
    packing: dict[str, dict[str, int]] = field(default_factory=dict)
    # True when the probe could not run for a reason outside the configuration (its fork server died):
    # the trial is retried, not recorded as a crash of the configuration.
    infrastructure: bool = False
    # On a Ray cluster: the node each rank ran on (by rank), and the node lost during the probe, if one was
    # (the trial is crashed and tried again once, on the nodes left)
    rank_nodes: list[str] = field(default_factory=list)
    lost_node: str | None = None

    @classmethod
    def classified(
        cls,
        config: ProbeConfig,
        settings: ProbeSettings,
        verdict: tuple[str, str | None, str],
        wall_seconds: float,
        **figures: Any,
    ) -> ProbeResult:
        """A probe's result as every engine starts it: its `verdict` (status, OOM kind, message), how long
        it ran and where, and the `figures` it measured."""
        status, oom_kind, message = verdict
        return cls(
            status=status,
            oom_kind=oom_kind,
            message=message,
            wall_seconds=wall_seconds,
            world_size=settings.world_size,
            device=settings.device,
            config=config.to_dict(),
            **figures,
        )

    @property
    def peak_memory_gib(self) -> float:
        return self.peak_memory_bytes / GIB

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["peak_memory_gib"] = round(self.peak_memory_gib, 4)
        return data
