# ruff: noqa: E501 - the failure texts are verl's own lines, verbatim
"""The stand-in's `python -m verl.trainer.main_ppo` (see verl/__init__.py here). Formats, as verl 0.9.1 writes
them (paths under site-packages/verl):
- file logger: one `{"step":N,"data":{...}}` line per step, orjson-compact, NaN as null
  (utils/tracking.py:529-548);
- console: `step:N - key:value - ...` (utils/logger/aggregate_logger.py:26-32,49-51) with numpy reprs, printed
  by the TaskRunnerV1 actor, so Ray prefixes it `(TaskRunnerV1 pid=N) ` (trainer/main_ppo.py:102-103);
- failures: a CUDA OOM in a worker reaches the driver as `ray.exceptions.RayTaskError(OutOfMemoryError)` and
  Hydra exits 1 (single_controller/ray/base.py:49-56, hydra/_internal/utils.py); no GPU: `ValueError: Total
  available GPUs 0 is less than total desired GPUs N` (single_controller/ray/base.py:226-241).
Scripted by AUTOTUNE_FAKE_VERL: "" (behave), "hang" (never finish, with a child process), "exit0-missing"
(exit 0 after one step), "gpus0" (verl's refusal on a CPU machine). A micro batch × sequence length (under
dynamic batch size: the token budget) above AUTOTUNE_FAKE_VERL_OOM_TOKENS (default 512) runs out of memory in
the actor update.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pandas as pd

OOM_TRACEBACK = """Error executing job with overrides: [{overrides}]
Traceback (most recent call last):
  File "/opt/verl/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 93, in run_ppo
    ray.get(runner.run.remote(config))
ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunnerV1.run() (pid={pid}, ip=127.0.0.1, actor_id=abc123)
  File "/opt/verl/lib/python3.11/site-packages/verl/single_controller/ray/base.py", line 56, in __call__
    output = ray.get(output)
ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_ref_update_actor() (pid={pid}, ip=127.0.0.1)
  File "/opt/verl/lib/python3.11/site-packages/torch/nn/functional.py", line 2140, in cross_entropy
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.72 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 138.70 GiB memory in use.

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""
GPUS0 = """Error executing job with overrides: [{overrides}]
ray.exceptions.RayTaskError(ValueError): ray::TaskRunnerV1.run() (pid={pid}, ip=127.0.0.1)
  File "/opt/verl/lib/python3.11/site-packages/verl/single_controller/ray/base.py", line 241, in _check_resource_available
ValueError: Total available GPUs 0 is less than total desired GPUs {gpus}

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""


def parse(argv: list[str]) -> dict[str, str]:
    return dict(arg.lstrip("+").split("=", 1) for arg in argv if "=" in arg)


def number(value: str) -> int:
    return int(value) if value not in ("null", "") else 0


def step_metrics(cfg: dict[str, str], step: int) -> dict[str, object]:
    """Made-up figures with a shape: larger micro batches are faster and take more memory."""
    micro = number(cfg["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"])
    prompts = number(cfg["data.train_batch_size"]) * number(cfg.get("actor_rollout_ref.rollout.n", "1"))
    tokens = number(cfg["data.max_prompt_length"]) + number(cfg["data.max_response_length"])
    gen, update = 0.02 + 0.0004 * prompts, 0.01 * prompts / max(1, micro)
    return {
        "training/global_step": step,
        "timing_s/gen": gen,
        "timing_s/old_log_prob": update / 3,
        "timing_s/ref": update / 3,
        "timing_s/values": update / 3,
        "timing_s/adv": 0.001,
        "timing_s/update_critic": update,
        "timing_s/update_actor": update,
        "timing_s/step": gen + 2 * update + update + 0.001,
        "perf/throughput": prompts * tokens / (gen + 3 * update),
        "perf/total_num_tokens": prompts * tokens,
        "actor/perf/max_memory_allocated_gb": 0.3 + micro * tokens / 4096,
        "actor/perf/max_memory_reserved_gb": 0.35 + micro * tokens / 4096,
        "critic/score/mean": float("nan"),
    }


def console_line(step: int, metrics: dict[str, object]) -> str:
    """`(TaskRunnerV1 pid=N) step:1 - key:value`, some values as numpy prints them (np.float64(...))."""
    parts = [f"step:{step}"]
    for key, value in metrics.items():
        shown = f"np.float64({value!r})" if key.startswith("perf/") else repr(value)
        parts.append(f"{key}:{shown}")
    return f"(TaskRunnerV1 pid={os.getpid()}) " + " - ".join(parts)


def main() -> int:
    cfg = parse(sys.argv[1:])
    script = os.environ.get("AUTOTUNE_FAKE_VERL", "")
    overrides = ", ".join(sys.argv[1:4])
    gpus = number(cfg.get("trainer.n_gpus_per_node", "1"))
    print("ray init kwargs: {'num_cpus': None}", flush=True)
    data = pd.read_parquet(cfg["data.train_files"])
    assert {"prompt", "data_source", "reward_model"} <= set(data.columns), data.columns
    print(f"(TaskRunnerV1 pid={os.getpid()}) dataset len: {len(data)}", flush=True)
    if script == "gpus0":
        sys.stderr.write(GPUS0.format(overrides=overrides, pid=os.getpid(), gpus=gpus))
        return 1
    if len(data) < number(cfg["data.train_batch_size"]):
        sys.stderr.write("ZeroDivisionError: integer division or modulo by zero\n")
        return 1
    if script == "hang":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])  # a Ray worker, say
        time.sleep(3600)
    path = (
        cfg.get("ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH")
        or os.environ["VERL_FILE_LOGGER_PATH"]
    )
    micro_tokens = (  # under dynamic batch size verl fills micro-batches up to the token budget instead
        number(cfg["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"])
        if cfg.get("actor_rollout_ref.actor.use_dynamic_bsz") == "true"
        else number(cfg["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"])
        * (number(cfg["data.max_prompt_length"]) + number(cfg["data.max_response_length"]))
    )
    limit = int(os.environ.get("AUTOTUNE_FAKE_VERL_OOM_TOKENS", "512"))
    steps = 1 if script == "exit0-missing" else number(cfg["trainer.total_training_steps"])
    with open(path, "wb", buffering=0) as log:
        for step in range(1, steps + 1):
            if micro_tokens > limit:
                sys.stderr.write(OOM_TRACEBACK.format(overrides=overrides, pid=os.getpid()))
                return 1
            metrics = step_metrics(cfg, step)
            time.sleep(float(metrics["timing_s/step"]))
            record = {"step": step, "data": {k: (None if v != v else v) for k, v in metrics.items()}}
            log.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
            print(console_line(step, metrics), flush=True)
    print(f"(TaskRunnerV1 pid={os.getpid()}) 'Final validation metrics: None'", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
