"""The verl run a probe launches: the job autotune exports for the configuration (autotune.formats.verl, the
same overrides a user hands to verl), plus the settings of a short run.

    run = verl_run(config, world_size=1, steps=3, model_path="/models/qwen2.5-0.5b", run_dir=tmp,
                   verl_python="/opt/verl/bin/python", card_bytes=141 * GIB, resident_bytes=0)
    subprocess.Popen(run.argv, env={**os.environ, **run.env}, start_new_session=True)

The short-run keys, each with where verl 0.9.1 reads it (paths under site-packages/verl):
- `trainer.total_training_steps` = `trainer.total_epochs` = steps: exactly `steps` logged steps, numbered
  from 1 (trainer/ppo/v1/trainer_base.py:467-468, 767-771); the dataset holds one step's prompts, so an
  epoch is a step;
- `trainer.val_before_train=False`, `trainer.test_freq=-1`: no validation (trainer_base.py:439, 491-492);
- `trainer.save_freq=-1`, `trainer.resume_mode=disable`: no checkpoint written or resumed (:481-482,
  :850-877);
- `trainer.logger=[console,file]` and the file logger's path through the Ray job's environment
  (`VERL_FILE_LOGGER_PATH`, utils/tracking.py:529-548; the TaskRunner actor does not run in our folder);
- `actor_rollout_ref.rollout.ignore_eos=True`: every response runs to max_response_length, as the built-in
  probe's do (workers/rollout/vllm_rollout/vllm_async_server.py:624);
- `data.filter_overlong_prompts=False`: without the model's tokenizer the prompts are longer than
  max_prompt_length on purpose; the agent loop cuts each to exactly that length
  (experimental/agent_loop/agent_loop.py:437-446; autotune.probe.verl.dataset);
- `trainer.v1.sampler.sync_refill_failed_groups=False` (its default, ppo_trainer.yaml:305-306), pinned: with
  it on, verl's sync ReplayBuffer refills the prompts of a failed generation in a loop until one succeeds
  (trainer/ppo/v1/replay_buffer.py:330-334, 465-467); off, it trains on what is left, which the backend
  stops and classifies (autotune.probe.verl.failures.GENERATION_FAILED);
- `+ray_kwargs.ray_init.address=local` and `+ray_kwargs.ray_init._temp_dir=<probe folder>/ray`, passed to
  `ray.init` (trainer/main_ppo.py:57-74): "local" always starts a new Ray instance (ray/_private/
  services.py:686-707, `canonicalize_bootstrap_address`, ray 2.60), where no address would join the cluster
  a `ray start` recorded in `<temp dir>/ray_current_cluster` (services.py:413-464, ray/_common/utils.py:
  327-349: the temp dir is $RAY_TMPDIR/ray, else $TMPDIR/ray, else /tmp/ray), whose workers the slot's
  CUDA_VISIBLE_DEVICES and the probe's kill would miss; the temp dir keeps its sockets, logs and
  session_latest link out of the machine's /tmp/ray and goes with the probe's folder;
- `hydra.run.dir`: Hydra's output folder inside the probe's, not the working directory.
On the user's Ray cluster (`autotune run --ray`), `+ray_kwargs.ray_init.address` is the cluster's address
instead (the one the tuner joined and checked: `ray.init` connects to it, and verl's own placement groups
take the GPUs of `trainer.nnodes` nodes there) and no temp dir is given (a joined cluster keeps its own);
the export's `trainer.nnodes` and `trainer.n_gpus_per_node` are the probe's nodes and GPUs per node, and no
CUDA_VISIBLE_DEVICES is set (Ray gives each worker its GPUs).
The environment: `RAY_DEDUP_LOGS=0` and `RAY_COLOR_PREFIX=0` (every worker's line, without colour codes),
`RAY_ADDRESS` removed too (the address above already overrides it), the slot's `CUDA_VISIBLE_DEVICES`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from autotune.config.knobs import ProbeConfig
from autotune.formats.rollout import rollout_engine
from autotune.formats.verl import format_value, verl_overrides
from autotune.probe.verl.cpu import cpu_environment, cpu_overrides

__all__ = ["METRICS_FILE", "RAY_DIR", "TRAIN_FILE", "VerlRun", "short_run_overrides", "verl_run"]

METRICS_FILE = "metrics.jsonl"
TRAIN_FILE = "train.parquet"
RAY_DIR = "ray"  # the probe's own Ray instance's temp dir, inside the probe's folder


@dataclass(frozen=True)
class VerlRun:
    """What to launch and where its figures land."""

    argv: list[str]
    env: dict[str, str]  # set over the tuner's environment (None values: removed)
    unset: tuple[str, ...]  # variables to remove from the tuner's environment
    metrics_path: Path
    train_path: Path
    steps: int
    prompts: int  # rows of the dataset: one step's prompts


def short_run_overrides(steps: int, run_dir: Path, ray_address: str | None = None) -> dict[str, object]:
    """The keys that make verl's run a probe: `steps` steps, nothing else (see the module docstring);
    `ray_address`: the cluster verl runs in, else a Ray instance of its own."""
    train = str(run_dir / TRAIN_FILE)
    return {
        "data.train_files": train,
        "data.val_files": train,  # always loaded, never used with validation off (trainer_base.py:718-725)
        "data.filter_overlong_prompts": False,
        "trainer.v1.sampler.sync_refill_failed_groups": False,
        "actor_rollout_ref.rollout.ignore_eos": True,
        "trainer.total_training_steps": steps,
        "trainer.total_epochs": steps,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.resume_mode": "disable",
        "trainer.logger": ["console", "file"],
        "trainer.project_name": "autotune",
        "trainer.experiment_name": "probe",
        "trainer.default_local_dir": str(run_dir / "checkpoints"),
        "hydra.run.dir": str(run_dir / "hydra"),
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH": str(run_dir / METRICS_FILE),
        **(
            {"+ray_kwargs.ray_init.address": ray_address}
            if ray_address
            else {
                "+ray_kwargs.ray_init.address": "local",
                "+ray_kwargs.ray_init._temp_dir": str(run_dir / RAY_DIR),
            }
        ),
    }


def verl_run(
    config: ProbeConfig,
    *,
    world_size: int,
    steps: int,
    model_path: str,
    run_dir: Path,
    verl_python: str,
    card_bytes: float,
    resident_bytes: float | None,
    rollout_name: str = "vllm",
    model_parameters: int | None = None,
    visible_devices: str | None = None,
    nodes: int = 1,
    ray_address: str | None = None,
    device: str = "cuda",
) -> VerlRun:
    """The command of one verl probe: the export for `config` on `world_size` GPUs (ValueError when the
    configuration breaks a rule), the rollout engine sized by the export's rules for a card of `card_bytes`
    with `resident_bytes` of training states, and the short-run settings; on a Ray cluster (`ray_address`)
    `world_size` GPUs over `nodes` nodes; on `device` "cpu" through autotune's CPU plugin (verl/cpu.py)."""
    engine = rollout_engine(config, world_size, rollout_name, card_bytes, resident_bytes, model_parameters)
    values = dict(verl_overrides(config, world_size, model_path, engine, nodes=nodes).values)
    values.update(short_run_overrides(steps, run_dir, ray_address))
    if device == "cpu":
        values.update(cpu_overrides(world_size))
    argv = [
        verl_python,
        "-m",
        "verl.trainer.main_ppo",
        *(f"{key}={format_value(v)}" for key, v in values.items()),
    ]
    env = {"RAY_DEDUP_LOGS": "0", "RAY_COLOR_PREFIX": "0", "PYTHONUNBUFFERED": "1"}
    env["VERL_FILE_LOGGER_PATH"] = str(run_dir / METRICS_FILE)  # also the driver's, for Ray's own copy
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    if device == "cpu":
        env.update(cpu_environment(os.environ.get("PYTHONPATH")))
    prompts = config.train_batch_size // config.rollout_n  # data.train_batch_size: one step's prompts
    return VerlRun(
        argv=argv,
        env=env,
        unset=("RAY_ADDRESS",),
        metrics_path=run_dir / METRICS_FILE,
        train_path=run_dir / TRAIN_FILE,
        steps=steps,
        prompts=prompts,
    )
