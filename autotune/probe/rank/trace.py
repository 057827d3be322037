"""A probe iteration's training phases traced under FakeTensorMode: the real architecture, no weights, no GPU.

    trace = trace_memory(resolve_model("llama-2-7b"), None, config, world_size=2)   # ~20 s on 2 cores
    trace.peak("update"), trace.phases[0].parts, trace.states

The probe's own code runs (`autotune.probe.rank.model_build.build_models`, then `ppo.score`'s forwards and
`ppo.train_epoch`, each pass on its largest micro batch: autotune.probe.rank.trace_passes), its per-token math
by `math` (autotune's functions, or verl's in verl's environment: `pass_math`), with every tensor fake:
shapes, dtypes and devices are real, storage is not. Torch's memory trackers (`FSDPMemTracker` for sharded
models, `MemTracker` otherwise) count every storage each phase allocates and frees. The layout is a GPU run's
by default: trainable fp32 weights, frozen bf16, FSDP2's bf16 mixed precision and autocast, over a fake
process group of W ranks (the tensors sit on the host, so the reference's shards, which a GPU run keeps on the
host, are left out of the device's bytes). `layout="cpu"` is the CPU probe's (everything fp32): the one a CPU
probe can check.

What is not traced, and why:
- rollout: Hugging Face `generate` stops on tensor values (end of sequence, stopping criteria), which a fake
  tensor does not have; the analytic model's rollout phase stands.
- DDP (replicate over W > 1): its C++ reducer cannot run on fake tensors; the rank's work is traced without
  it and DDP's gradient buckets (one fp32 copy of the gradients) are the analytic model's, labelled so.
- offload's moves: the passes run with every state in place; each pass's resident bytes are then what a
  GPU run keeps on the device during it (autotune.probe.rank.trace_resident).
- the allocator: the trace counts tensor bytes; a GPU's caching allocator rounds and fragments on top (the
  analytic model's calibrated factor), and the CUDA context is the calibrated constant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

from autotune.config.job_lengths import JobLengths
from autotune.config.knobs import ProbeConfig
from autotune.probe.rank.pass_math import AUTOTUNE, PassMath
from autotune.probe.rank.ppo import Models, StepContext
from autotune.probe.rank.trace_passes import HOST, rollout_buffer, training_passes
from autotune.probe.rank.trace_resident import (
    device_side,
    on_device,
    resident_states,
    trained_states,
)
from autotune.probe.traced import BUILT, PROGRESS_KEY, MathSource, MemoryTrace, PhasePeak, TraceUnavailable
from autotune.swap import swapped

__all__ = ["LAYOUTS", "main", "trace_memory", "traced_pass", "warm_up"]

LAYOUTS = ("cuda", "cpu")
# the tracker's categories (FSDPMemTracker's and MemTracker's names), folded into the report's terms
CATEGORIES = {
    "weights": ("Sharded Param", "Parameter", "Buffer"),
    "gradients": ("Sharded Grad", "Gradient"),
    "optimizer_step": ("OptState", "Optstate"),  # over the resident states: the step's temporaries
    "gathered": ("Unsharded Param", "All Gather"),
    "reduce_scatter": ("Unsharded Grad", "Reduce Scatter"),
    "activations": ("Activation", "Inputs", "Other"),
    "temporaries": ("Temp",),
}
DDP_NOTE = "DDP's gradient buckets are the analytic model's: its C++ reducer cannot run on fake tensors"
HOST_REFERENCE_NOTE = (
    "the reference's shards live on the host in a GPU run (verl's forward-only engine): not counted"
)
NOT_TRACED = "rollout is not traced: verl generates in vLLM's own pool (the rollout engine's share)"


# --- the fake world ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """A fake process group of `world_size` ranks (this process is rank 0) for the block; collectives return
    at once. Refused when a real group is up: the trace must not join it."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autotune.probe.rank.sharding import device_mesh

    if dist.is_initialized():
        raise TraceUnavailable("a process group is already running in this process: trace in a fresh one")
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        device_mesh.cache_clear()
        dist.destroy_process_group()


def _refuse(config: ProbeConfig, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, but got {layout!r}.")
    if config.offloaded and not (layout == "cuda" and config.sharded):
        raise TraceUnavailable(
            "offload is verl's FSDP move on a GPU: a replicated or CPU-layout config with offload is not "
            "traced; the analytic model stands"
        )


@contextlib.contextmanager
def _attention_without_packing_masks() -> Iterator[None]:
    """Hugging Face finds packed sequences by reading the position ids' values (a fake tensor has none) and
    then builds a block-diagonal mask of tokens² bytes; a GPU run of verl attends within each sequence with
    flash-attn's varlen kernels, which hold no mask. The trace attends over the packed row as one causal
    sequence: the same bytes as the varlen kernels (none in scores), other numbers (which it never reads)."""
    import transformers.masking_utils as masking

    # transformers' masking_utils._preprocess_mask_arguments calls the module's
    # `find_packed_sequence_indices(position_ids)` whenever a forward has position ids and no attention mask
    # (verl's packed forward, and the probe's: ppo.PackedLayout); no argument of the model turns that off.
    with swapped(masking, "find_packed_sequence_indices", lambda *_, **__: None):
        yield


@contextlib.contextmanager
def _conversions_that_rebind() -> Iterator[None]:
    """`Module.to` swaps each fake parameter for its converted self, which torch refuses for fake tensors
    (swap_tensors needs the only reference). In the trace a conversion builds new parameters and rebinds
    them instead: the same result for modules no optimizer holds yet (peft casts each new adapter to its
    base layer's dtype, then back to fp32)."""

    def to(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        device, dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)  # Module.to's own argument parsing

        def convert(t: torch.Tensor) -> torch.Tensor:
            cast = dtype if dtype is not None and t.is_floating_point() else t.dtype
            return t.to(device=device or t.device, dtype=cast)

        for sub in module.modules():
            for name, param in sub._parameters.items():
                if param is not None:
                    sub._parameters[name] = torch.nn.Parameter(convert(param), param.requires_grad)
            for name, buffer in sub._buffers.items():
                if buffer is not None:
                    sub._buffers[name] = convert(buffer)
        return module

    # torch.nn.Module._apply swaps every FakeTensor parameter by torch.utils.swap_tensors whatever
    # torch.__future__'s flags say (`or isinstance(param, FakeTensor)` in its p_should_use_swap_tensors,
    # torch 2.13), and peft calls `.to` itself on each adapter it builds: no argument reaches those calls.
    with swapped(torch.nn.Module, "to", to):
        yield


def _fsdp_lazy_init(root: FSDPModule) -> None:
    """FSDP2's lazy initialisation of a root module (the root state marked, its context shared with the other
    states, each parameter group initialised), which torch runs in the root's first forward; the warm-up
    steps the optimizer before any forward, on models as an iteration leaves them. torch has no public call
    for it (FSDPModule offers unshard and reshard, which skip the root's part), so this calls torch's private
    one: `FSDPState._lazy_init` (torch/distributed/fsdp/_fully_shard/_fsdp_state.py)."""
    root._get_fsdp_state()._lazy_init()


def warm_up(models: Models, layout: str) -> None:
    """FSDP's lazy initialisation done, and one optimizer step on zero gradients: Adam's states exist and the
    gradients stay allocated, as after the previous iteration's last step (the steady state a probe
    measures). The GPU layout steps AdamW as torch does on CUDA, all tensors at once (foreach); the host's
    tensors would otherwise take torch's CPU default, one tensor at a time."""
    from autotune.probe.rank.sharding import hf_model

    for model in (models.actor, models.ref, models.critic):
        root = hf_model(model) if model is not None else None
        if isinstance(root, FSDPModule):
            _fsdp_lazy_init(root)
    for optimizer in (models.actor_optimizer, models.critic_optimizer):
        if optimizer is None:
            continue
        for group in optimizer.param_groups:
            group["foreach"] = layout == "cuda"
            for param in group["params"]:
                param.grad = torch.zeros_like(param)
        optimizer.step()


# --- tracking one pass ------------------------------------------------------------------------------------


def _tracker(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None):
    """torch's tracker for the model: FSDPMemTracker for a sharded one, MemTracker otherwise; both keep only
    the peak over all modules (their per-module peaks, which the trace does not read, cost half its time)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    from autotune.probe.rank.sharding import hf_model

    class PeakOnly:
        _curr_mem_snap: dict[torch.device, dict[str, int]]  # torch's tracker state (MemTracker)
        _peak_mem: dict[torch.device, int]
        _peak_mem_snap: dict[torch.device, dict[str, int]]

        def _update_peak_stats(self, peak_state: Any) -> None:
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot["Total"]:
                    self._peak_mem[device] = snapshot["Total"]
                    self._peak_mem_snap[device] = dict(snapshot)

    class ShardedTracker(PeakOnly, FSDPMemTracker):
        pass

    class FrozenAwareTracker(PeakOnly, MemTracker):
        """MemTracker hooks the gradient of every parameter of each module it sees run, and a frozen one (a
        LoRA base, the reward model) refuses the hook: a module is hooked only when all its parameters
        train; a frozen base's adapters are hooked when their own layers run."""

        def _track_module_params_and_buffers(
            self, module: torch.nn.Module, install_grad_hooks: bool = True
        ) -> tuple[int, int]:
            trains = all(p.requires_grad for p in module.parameters())
            return super()._track_module_params_and_buffers(module, install_grad_hooks and trains)

    root = hf_model(model)
    if isinstance(root, FSDPModule):
        return ShardedTracker(root, optimizer)
    tracker = FrozenAwareTracker()
    tracker.track_external(model, *([optimizer] if optimizer is not None else []))
    return tracker


def _by_term(snapshot: dict[str, int]) -> dict[str, int]:
    return {term: sum(snapshot.get(c, 0) for c in names) for term, names in CATEGORIES.items()}


def _parts(resident: dict[str, int], start: dict[str, int], snapshot: dict) -> dict[str, int]:
    at_peak = _by_term(snapshot.get(HOST, {}))
    parts = dict(resident)
    for term in CATEGORIES:
        parts[term] = parts.get(term, 0) + at_peak[term] - start[term]
    return parts


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    """Each pass's gc.collect then scans only what the trace makes: what the process held before (torch's
    and transformers' modules, most of the heap) is frozen, and holds none of the trace's tensors. A full
    scan cost 0.2 s per pass on tiny-llama."""
    frozen_before = gc.get_freeze_count() > 0  # a freeze the caller made is the caller's to undo
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()


def traced_pass(
    name: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    run: Callable[[], Any],
    resident: dict[str, int],
) -> tuple[list[PhasePeak], dict[str, int]]:
    """Run one pass under the tracker: its peak is what is resident plus what the pass adds over its start.
    A training pass also gives its peak before the optimizer steps (forward and backward alone). Also
    returns what the pass leaves alive, by term (a forward-only pass under shard_grad_op leaves its model
    gathered): the next passes start with it."""
    tracker = _tracker(model, optimizer)
    before_step: list[dict] = []
    hook = None
    if optimizer is not None:
        hook = optimizer.register_step_pre_hook(
            lambda *_: before_step.append(tracker.get_tracker_snapshot("peak"))
        )
    try:
        with tracker:
            start = _by_term(tracker.get_tracker_snapshot("current").get(HOST, {}))
            run()
            gc.collect()  # what only a reference cycle keeps is not left alive
            end = _by_term(tracker.get_tracker_snapshot("current").get(HOST, {}))
    finally:
        if hook is not None:
            hook.remove()
    peaks = []
    if before_step:
        backward = _parts(resident, start, before_step[0])
        peaks.append(PhasePeak(name.replace("update", "backward"), sum(backward.values()), backward))
    parts = _parts(resident, start, tracker.get_tracker_snapshot("peak"))
    left = {term: end[term] - start[term] for term in CATEGORIES}
    return [*peaks, PhasePeak(name, sum(parts.values()), parts)], left


def _traced_passes(
    passes: Iterator[tuple],
    resident_of: Callable[[Any, bool], dict[str, int]],
    on_host: set[int],
    on_pass: Callable[[str, float], None] = lambda name, seconds: None,
) -> list[PhasePeak]:
    """Every pass in the probe's order, each starting with what the other models' passes left alive (a pass's
    own tracker finds its model's leftovers itself: they are counted when it gathers them again).
    `resident_of(model, updating)`: the states on the device during the pass; `on_host`: the models whose
    gradients and Adam's step stay on the host (offload_policy); `on_pass(name, seconds)` after each pass."""
    peaks: list[PhasePeak] = []
    left: dict[int, dict[str, int]] = {}  # id(model) -> what its latest pass left alive, by term
    for name, model, optimizer, run in passes:
        started = time.perf_counter()
        resident = resident_of(model, optimizer is not None)
        others = [kept for owner, kept in left.items() if owner != id(model)]
        terms = {*resident, *CATEGORIES}
        start = {term: resident.get(term, 0) + sum(k.get(term, 0) for k in others) for term in terms}
        found, left[id(model)] = traced_pass(name, model, optimizer, run, start)
        peaks += device_side(found, resident) if id(model) in on_host else found
        on_pass(name, time.perf_counter() - started)
    return peaks


# --- the trace --------------------------------------------------------------------------------------------


def trace_memory(
    actor_spec: Any,
    reward_spec: Any,
    config: ProbeConfig,
    world_size: int = 1,
    layout: str = "cuda",
    lengths: JobLengths | None = None,
    math: PassMath = AUTOTUNE,
    on_pass: Callable[[str, float], None] = lambda name, seconds: None,
) -> MemoryTrace:
    """Trace the probe's scoring and update passes of `config` on one rank of `world_size`, their per-token
    math done by `math`'s functions (autotune's by default; verl's in verl's environment), each pass's micro
    batch packed from the job's `lengths` as the memory model prices it (None: every sample at the limits).

    Raises TraceUnavailable (one line) for what the tracer does not handle: offload outside FSDP's GPU
    layout, an architecture whose code reads tensor values, a process group already running here."""
    from autotune.probe.rank.sharding import device_mesh

    _refuse(config, layout)
    lengths = lengths or JobLengths()
    started = time.perf_counter()
    compute = torch.bfloat16 if layout == "cuda" else None
    ctx = StepContext(config, HOST, world_size, 0, compute, lengths=lengths, math=math)
    built: dict[str, int] = {}  # the tokens of each pass's micro batch, as made
    with fake_world(world_size), warnings.catch_warnings(), _heap_frozen():
        warnings.simplefilter("ignore")  # torch and transformers warn about fake tensors' data pointers
        if config.sharded:
            device_mesh(HOST.type, world_size)  # a mesh reads real rank tensors: made before the fake mode
        with _fake_mode(), _failures_unavailable():
            states, phases = _traced(actor_spec, reward_spec, ctx, layout, started, on_pass, built)
    notes = [NOT_TRACED, *math.notes]
    if world_size > 1 and not config.sharded:
        buckets = _ddp_buckets(actor_spec, reward_spec, config, world_size, layout)
        states = {**states, "ddp_buckets": buckets}
        phases = [
            dataclasses.replace(p, peak=p.peak + buckets, parts={**p.parts, "ddp_buckets": buckets})
            for p in phases
        ]
        notes.append(DDP_NOTE)
    if layout == "cuda" and config.sharded and config.use_kl and not config.use_lora:
        notes.append(HOST_REFERENCE_NOTE)
    seconds = time.perf_counter() - started
    functions = dict(math.functions)
    return MemoryTrace(world_size, layout, states, phases, seconds, notes, functions, lengths.label, built)


@contextlib.contextmanager
def _fake_mode() -> Iterator[None]:
    """Every tensor made in the block fake, and the two library calls that cannot take one done otherwise."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with (
        FakeTensorMode(allow_non_fake_inputs=True),
        _conversions_that_rebind(),
        _attention_without_packing_masks(),
    ):
        yield


@contextlib.contextmanager
def _failures_unavailable() -> Iterator[None]:
    """An architecture or op the fake mode cannot run ends the trace as TraceUnavailable, in one line."""
    try:
        yield
    except TraceUnavailable:
        raise
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise TraceUnavailable(f"the trace failed: {type(error).__name__}: {first[:200]}") from error


def _traced(
    actor_spec: Any,
    reward_spec: Any,
    ctx: StepContext,
    layout: str,
    started: float,
    on_pass: Callable[[str, float], None],
    built: dict[str, int],
) -> tuple[dict[str, int], list[PhasePeak]]:
    """Under the fake mode: the probe's models built as a rank of `ctx`'s world builds them and warmed up,
    then each pass traced. Returns the states on the device between passes, and every pass's peaks."""
    from autotune.probe.rank.model_build import build_models

    config, world_size = ctx.config, ctx.world_size
    models = build_models(
        actor_spec,
        reward_spec,
        config,
        HOST,
        world_size if config.sharded else 1,  # DDP cannot wrap fake tensors: see the docstring
        precision=layout == "cuda",
    )
    warm_up(models, layout)
    everything = resident_states(models, rollout_buffer(config, world_size), layout, config.sharded)
    trained = trained_states(models)
    resident = on_device(config, everything, trained, None, False)
    passes = training_passes(models, ctx, built)
    on_pass(BUILT, time.perf_counter() - started)
    phases = _traced_passes(
        passes,
        lambda model, updating: on_device(config, everything, trained, model, updating),
        set(trained) if config.offload_policy else set(),
        on_pass,
    )
    return resident, phases


def _ddp_buckets(actor_spec: Any, reward_spec: Any, config: ProbeConfig, world_size: int, layout: str) -> int:
    """DDP's gradient buckets per rank, the analytic model's (its reducer cannot run on fake tensors)."""
    from autotune.memory.architecture import Architecture
    from autotune.memory.breakdown import predict_components

    arch = Architecture.from_specs(actor_spec, reward_spec)
    return predict_components(arch, config, world_size, layout).ddp_buckets


def _say_pass(name: str, seconds: float) -> None:
    """A pass done, for the parent's progress: one JSON line on stderr (PROGRESS_KEY)."""
    import json
    import sys

    print(json.dumps({PROGRESS_KEY: name, "seconds": round(seconds, 1)}), file=sys.stderr, flush=True)


def _pass_math(whose: MathSource) -> PassMath:
    """The table of `whose` functions; verl's imports verl (this process must be verl's python)."""
    if whose is MathSource.VERL:
        from autotune.probe.rank.verl_math import verl_math

        return verl_math()
    return AUTOTUNE


def main(argv: list[str] | None = None) -> int:
    """runners/memory_trace.py JOB: JOB is JSON {"model", "reward", "trust_remote_code", "config",
    "world_size", "layout", "pass_math", "lengths"}; prints the trace as JSON, or {"failed": why} when it
    cannot run. "lengths" (JobLengths' dict; null: the limits) are what the micro batches are packed from;
    "pass_math" (MathSource's value): "verl" runs verl's functions (this process must be verl's python),
    "autotune" (or none) autotune's."""
    import json
    import sys

    from autotune.models.catalog import resolve_model

    job = json.loads((sys.argv[1:] if argv is None else argv)[0])
    trusted = bool(job.get("trust_remote_code", False))
    try:
        spec = resolve_model(job["model"], trust_remote_code=trusted)
        reward = resolve_model(job["reward"], trust_remote_code=trusted) if job.get("reward") else None
        config = ProbeConfig(**job["config"])
        lengths = JobLengths.from_dict(job.get("lengths"))
        math = _pass_math(MathSource(job.get("pass_math", MathSource.AUTOTUNE)))
        world, layout = int(job["world_size"]), job["layout"]
        trace = trace_memory(spec, reward, config, world, layout, lengths, math, _say_pass)
    except TraceUnavailable as error:
        print(json.dumps({"failed": str(error)}))
        return 0
    print(json.dumps(trace.to_dict()))
    return 0
