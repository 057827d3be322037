"""verl 0.9.1 on a machine without a GPU: what a verl probe adds to its run on `--device cpu`.

    values.update(cpu_overrides(world_size=1))   # the run's Hydra overrides
    env.update(cpu_environment())                # its environment

verl has no CPU platform and no rollout that runs on CPU. autotune brings both through verl's own extension
points, from `runners/verl_cpu/` (shipped as `autotune/runners/verl_cpu/`), which every verl process imports
through `VERL_USE_EXTERNAL_MODULES` (verl/__init__.py:49): a CPU platform registered in verl's platform
registry (cpu_platform.py), and a Hugging Face `generate` rollout registered as `hf_cpu` in its rollout
registries (hf_cpu_rollout.py). verl itself is not patched. The keys, each with where verl 0.9.1 reads it
(paths under site-packages/verl):
- `trainer.device=cpu` with `VERL_PLATFORM=cpu`: the platform the plugin registers (plugin/platform/
  platform_manager.py:114; without it utils/device.py:151 turns "cpu" into "cuda");
- `VERL_ENGINE_DEVICE=cuda`: the FSDP engine is registered for accelerator names only (workers/engine/
  base.py:405,426); only the lookup's name, the engine runs on the platform's device;
- `+ray_kwargs.ray_init.num_gpus=W` and `++ray_kwargs.ray_init.num_cpus=16`: verl's bundles ask Ray for
  `{"GPU": 1}` each (single_controller/ray/base.py:240), which Ray grants from declared resources; the
  task runner, TransferQueue and the bundles need more logical CPUs than a small machine has cores, or Ray
  waits for ever (base.py:146);
- `actor_rollout_ref.rollout.name=hf_cpu`: the plugin's rollout (workers/rollout/base.py:89,
  workers/rollout/replica.py:318), one request at a time: its speed says nothing of vLLM's on a GPU;
- `+actor_rollout_ref.model.override_config.attn_implementation=sdpa`: flash-attn 2 is verl's default
  (workers/config/model.py:185) and needs CUDA;
- one agent-loop worker, one reward worker and no dataloader workers: verl starts 8 of each by default;
- `trainer.v1.sampler.custom_sampler`: quick_poll.py's replay buffer polls every 50 ms instead of a fixed
  2 s sleep (trainer/ppo/v1/replay_buffer.py:144, :409), which would otherwise be most of `timing_s/gen`.
The run needs TransferQueue, cachetools, fastapi and uvicorn in verl's environment (install.py) and no vLLM.
"""

from __future__ import annotations

from pathlib import Path

from autotune.probe.launching import runner_path

__all__ = ["CPU_ROLLOUT", "cpu_environment", "cpu_overrides", "plugin_folder"]

CPU_ROLLOUT = "hf_cpu"  # the rollout runners/verl_cpu/hf_cpu_rollout.py registers
RAY_CPUS = 16  # logical: enough for the task runner, TransferQueue and the bundles on any machine
# set in verl's driver and, through Ray's runtime environment, in every worker it starts
PLUGIN_VARIABLES = {
    "VERL_USE_EXTERNAL_MODULES": "cpu_platform",
    "VERL_PLATFORM": "cpu",
    "VERL_ENGINE_DEVICE": "cuda",
}


def plugin_folder() -> Path:
    """The folder of verl's CPU plugin modules, for PYTHONPATH."""
    return runner_path("verl_cpu")


def cpu_overrides(world_size: int) -> dict[str, object]:
    """The Hydra overrides that run verl's job on CPU (module docstring), over `world_size` declared GPUs."""
    folder = plugin_folder()
    ray_env = "+ray_kwargs.ray_init.runtime_env.env_vars"
    return {
        "trainer.device": "cpu",
        "++ray_kwargs.ray_init.num_cpus": RAY_CPUS,
        "+ray_kwargs.ray_init.num_gpus": world_size,
        **{f"{ray_env}.{name}": value for name, value in PLUGIN_VARIABLES.items()},
        "actor_rollout_ref.rollout.name": CPU_ROLLOUT,
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.rollout.agent.num_workers": 1,
        "reward.num_workers": 1,
        "data.dataloader_num_workers": 0,
        "trainer.v1.sampler.custom_sampler.path": str(folder / "quick_poll.py"),
        "trainer.v1.sampler.custom_sampler.name": "QuickPollReplayBuffer",
    }


def cpu_environment(pythonpath: str | None = None) -> dict[str, str]:
    """verl's driver's environment on CPU: the plugin importable and selected (`pythonpath`: the caller's,
    kept after the plugin). The Ray instance the driver starts passes it on to its workers."""
    path = str(plugin_folder()) + (f":{pythonpath}" if pythonpath else "")
    return {**PLUGIN_VARIABLES, "PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false"}
