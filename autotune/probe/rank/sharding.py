"""Training states held as verl holds them: DDP replicas, or FSDP2 shards, and verl's offload between phases.

- `replicate`: every rank holds every state; DDP all-reduces the gradients (the last micro-batch of a step).
- `full_shard` / `shard_grad_op`: torch FSDP2 (`fully_shard`) per transformer block (and per untied embedding
  and LM head), then the root — verl's `strategy: fsdp2` with its wrap rule. Parameters, gradients and Adam's
  states are split over the W ranks; a unit's parameters are gathered for its compute and freed after the
  forward (full_shard, verl's `reshard_after_forward: true`) or kept until the backward (shard_grad_op).
  Gradients are reduce-scattered every micro-batch (verl's `use_no_sync_for_gradient_accumulation: false`).
  On CUDA, verl's mixed precision: bf16 compute, fp32 reduction. With LoRA the root is the Hugging Face
  model inside peft's wrapper (the module `generate` runs: sharding the wrapper fails in `generate` with
  "mixed torch.Tensor and DTensor").
- The reference model (forward only) is sharded like the actor; on CUDA its shards live on the host and are
  streamed in layer by layer (verl's `forward_only` engines use FSDP2's CPUOffloadPolicy). `offload_policy`
  (CUDA only, verl's key of that name) does the same for the actor and the critic: their parameters,
  gradients and Adam's states stay on the host, and the optimizer steps there.
- Rollout gathers the actor's whole weights once, as the rollout engine holds a whole copy to generate from.
- `param_offload` / `optimizer_offload` (CUDA only): the sharded parameters and gradients, or Adam's states,
  stay on the host outside the phases that use them (verl's `offload_fsdp_model_to_cpu` and
  `offload_fsdp_optimizer` around each phase). Not FSDP2's CPUOffloadPolicy: that is `offload_policy`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from autotune.config.knobs import ProbeConfig

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule

__all__ = ["device_mesh", "distribute", "gathered", "hf_model", "offloaded", "park", "place", "wrap_targets"]


def hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model itself: inside peft's wrapper when there is one."""
    base = getattr(model, "base_model", None)
    if base is not None and hasattr(base, "model") and hasattr(model, "peft_config"):
        return base.model
    return model


def wrap_targets(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules sharded as units of their own, as verl's FSDP2 does: every transformer block (the classes
    Hugging Face lists in `_no_split_modules`) and, when the embeddings are not tied, the input embedding and
    the LM head; everything else (final norm, a value head) belongs to the root."""
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    targets = []
    for name, module in model.named_modules():
        leaf = name.rpartition(".")[2]
        embedding = not tied and (
            isinstance(module, torch.nn.Embedding)
            or (leaf in ("embed_tokens", "lm_head") and hasattr(module, "weight"))
        )
        if type(module).__name__ in blocks or embedding:
            targets.append(module)
    if not any(type(m).__name__ in blocks for m in targets):
        raise ValueError(f"no transformer blocks found in {type(model).__name__}: cannot shard it per layer")
    return targets


def place(config: ProbeConfig, device: torch.device) -> torch.device:
    """Where a model is built: on the host when FSDP will shard it (fully_shard moves each layer's shard to
    the device, so no rank ever holds the whole model there), on the device for DDP."""
    return torch.device("cpu") if config.sharded else device


@functools.cache
def device_mesh(device_type: str, world_size: int) -> DeviceMesh:
    """One mesh per process for every model it shards; made before a fake-tensor trace enters its mode
    (building a mesh reads real rank tensors)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (world_size,))


def distribute(
    model: torch.nn.Module,
    config: ProbeConfig,
    device: torch.device,
    world_size: int,
    trainable: bool = True,
    mixed: bool | None = None,
) -> torch.nn.Module:
    """The model held as `config.sharding` says: trainable models DDP-wrapped (W > 1) or sharded, frozen
    ones (the reference) replicated or sharded — on CUDA with its shards on the host. `mixed`: verl's mixed
    precision (bf16 compute, fp32 reduction); default on CUDA only."""
    if not config.sharded:
        if not trainable or world_size == 1:
            return model
        device_ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    options: dict[str, Any] = {  # fully_shard's keyword arguments
        "mesh": device_mesh(device.type, world_size),
        "reshard_after_forward": config.sharding == "full_shard",
    }
    if (device.type == "cuda") if mixed is None else mixed:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if device.type == "cuda" and (not trainable or config.offload_policy):
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    inner = hf_model(model)
    for module in wrap_targets(inner):
        fully_shard(module, **options)
    fully_shard(inner, **options)
    return model


def _fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: torch.nn.Module, config: ProbeConfig) -> Iterator[None]:
    """The whole weights gathered on every rank for the block (generation runs hundreds of forwards: one
    all-gather instead of one per token and layer), resharded after; a no-op without FSDP."""
    modules = _fsdp_modules(model)
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module in modules:
            module.reshard()
        for module in modules:
            module.set_reshard_after_forward(config.sharding == "full_shard", recurse=False)


def park(config: ProbeConfig, device: torch.device, *models: torch.nn.Module | None) -> None:
    """With param_offload on CUDA, trainable models wait on the host until a phase needs them."""
    if config.param_offload and device.type == "cuda":
        for model in models:
            if model is not None:
                model.to("cpu")
        torch.cuda.empty_cache()


def _move_optimizer(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)


@contextlib.contextmanager
def offloaded(
    config: ProbeConfig,
    device: torch.device,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None = None,
) -> Iterator[None]:
    """The model's states on the device for the block, on the host outside it (verl's offload); a no-op
    without offload (and on CPU, where the rules refuse it). `optimizer`: the block steps it, so Adam's states
    come too."""
    moving = model if config.param_offload else None  # the model whose states move, if any
    stepping = optimizer if config.optimizer_offload else None  # the optimizer whose states move, if any
    if (moving is None and stepping is None) or device.type != "cuda":
        yield
        return
    if moving is not None:
        moving.to(device)
    if stepping is not None:
        _move_optimizer(stepping, device)
    try:
        yield
    finally:
        if moving is not None:
            moving.to("cpu")
        if stepping is not None:
            _move_optimizer(stepping, "cpu")
        torch.cuda.empty_cache()
