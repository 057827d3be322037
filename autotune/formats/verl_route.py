"""The parts of verl's export table (autotune.formats.verl_table): the Job an export is made of, a Key with
its value and the condition it is written on, a knob's Route, and the sizes verl derives from a job."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.config.knobs import ProbeConfig

__all__ = [
    "ADV_ESTIMATORS",
    "AR",
    "CRITIC_ENGINE",
    "Job",
    "Key",
    "Route",
    "agent_workers",
    "always",
    "mini_batch_samples",
    "no_sync_as_probed",
]

AR = "actor_rollout_ref"
CRITIC_ENGINE = "critic.fsdp"  # the V1 critic's engine config (FSDPCriticConfig.__post_init__: engine = fsdp)
ADV_ESTIMATORS = {"ppo": "gae", "grpo": "grpo"}


@dataclass(frozen=True)
class Job:
    """What one export is made of: the configuration, the GPUs (all nodes'), the model's path as verl loads
    it, and the rollout engine's settings (autotune.formats.rollout.RolloutEngine)."""

    config: ProbeConfig
    gpus: int
    model_path: str | None
    engine: Any
    # the worker count the export writes: the configuration's own where verl measured it (--engine verl),
    # else verl's default (formats/rollout.py VERL_DEFAULT_WORKERS): the probing machine's cores are not
    # the training node's
    workers: int | None = None
    nodes: int = 1  # the machines `gpus` are spread over, as many on each (verl's trainer.nnodes)

    @property
    def worker_count(self) -> int:
        return self.config.num_rollout_workers if self.workers is None else self.workers

    @property
    def critic(self) -> bool:
        """GAE needs a value model; GRPO has none (verl's need_critic)."""
        return self.config.algorithm == "ppo"

    @property
    def reference(self) -> bool:
        """verl builds a reference policy only with KL (trainer/ppo/utils.py need_reference_policy)."""
        return self.config.use_kl

    @property
    def fixed_micro(self) -> bool:
        """Micro batches of fixed sizes: verl reads them only without dynamic batch size."""
        return not self.config.use_dynamic_bsz


def always(job: Job) -> bool:
    return True


@dataclass(frozen=True)
class Key:
    name: str  # as written: a leading `+` adds a field verl's YAML lacks but its dataclass has
    value: Callable[[Job], Any]
    when: Callable[[Job], bool] = always
    # what verl builds from it: entries (or prefixes of entries) of the digest tests/verl_objects.py makes of
    # verl's objects; () for a key only verl's config checks read, and `why` says which
    reaches: tuple[str, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class Route:
    knob: str  # a ProbeConfig field, or a setting of the job ("gpus", "model", "rollout engine")
    keys: tuple[Key, ...]
    reads: bool = True  # False: verl has no such knob; the export writes nothing for it
    why: str = ""

    def written(self, job: Job) -> list[Key]:
        return [key for key in self.keys if key.when(job)]


def mini_batch_samples(config: ProbeConfig, n_gpus: int) -> int:
    """Samples per optimizer step verl can express: m·g·W rounded up to a multiple of rollout_n (verl counts
    prompts per mini-batch and multiplies by n)."""
    return math.lcm(config.micro_batch_size * config.gradient_accumulation_steps * n_gpus, config.rollout_n)


def agent_workers(config: ProbeConfig, workers: int | None = None) -> int:
    """The largest divisor of the train batch (samples) not above `workers` (default num_rollout_workers):
    verl chunks a step's samples evenly over its agent-loop workers."""
    w, total = config.num_rollout_workers if workers is None else workers, config.train_batch_size
    return max(d for d in range(1, max(1, w) + 1) if total % d == 0)


def no_sync_as_probed(job: Job) -> bool:
    """verl reduces the gradients as the probe did. Replicated (DDP), the probe skips the all-reduce on all
    but the last micro batch of a step (probe/rank/ppo.py `_no_sync`), which verl does with
    use_no_sync_for_gradient_accumulation=true (engine/fsdp/transformer_impl.py `_gradient_sync_context`;
    fsdp_size 1: one replica per GPU). Sharded (FSDP2), the probe reduce-scatters every micro batch: verl's
    `false` (with `true` it would keep each micro batch's unsharded gradients until the last)."""
    return not job.config.sharded
