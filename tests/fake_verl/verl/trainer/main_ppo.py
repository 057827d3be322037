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
- a failed generation: verl's agent loop worker logs `Error in _run_prompt for uid=<uid>` with the session's
  traceback (trainer/ppo/v1/agent_loop_tq.py:133-140); with trainer.v1.sampler.sync_refill_failed_groups off
  the sync ReplayBuffer pads the missing samples and the step goes on (replay_buffer.py:111-113), with it on
  it refills the prompts in a loop that fails again and again (replay_buffer.py:465-467);
- Ray: `ray.init(**ray_kwargs.ray_init)` (trainer/main_ppo.py:57-74) decides as Ray 2.60 does whether to join
  a cluster (ray/_private/services.py:413-464, 686-707; ray/_common/utils.py:327-349): address "local" starts
  a new instance; no address (or "auto") takes $RAY_ADDRESS, else the address a `ray start` wrote to
  `<temp dir>/ray_current_cluster`, the temp dir being `_temp_dir`, else $RAY_TMPDIR/ray, else $TMPDIR/ray,
  else /tmp/ray. Joining prints Ray's "Connecting to existing Ray cluster at address: ..." (ray/_private/
  worker.py:1841) and then fails as Ray does when nothing answers there; where a real Ray cluster answers
  (autotune run --ray, the tests' two-node cluster) it joins it with Ray's own `ray.init` and fails as verl
  does when the cluster has fewer nodes than `trainer.nnodes`; starting one makes
  `<temp dir>/session_<date>_<pid>` and its `session_latest` link (ray/_private/node.py:206, 775).
$AUTOTUNE_FAKE_VERL_ARGV, when set, names a file the stand-in writes its arguments to (one per line): what
verl was asked to run.
Scripted by AUTOTUNE_FAKE_VERL, comma-separated: "" (behave), "hang" (never finish, with a child process),
"exit0-missing" (exit 0 after one step), "gpus0" (verl's refusal on a CPU machine), "gen-fail" (a generation
fails in step 1, then as the sampler setting says), "gen-fail,oom" (its cause is the vLLM engine's CUDA OOM),
"gen-fail,stuck" (refill in a loop whatever the setting: a verl whose sampler refills). A micro batch ×
sequence length (under dynamic batch size: the token budget) above AUTOTUNE_FAKE_VERL_OOM_TOKENS (default
512) runs out of memory in the actor update.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
import uuid

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
# A generation whose vLLM engine died: the engine core's fatal error (vllm/v1/engine/core.py, run_engine_core)
# and the agent loop's report of the request it failed, EngineDeadError's own words
# (vllm/v1/engine/exceptions.py), through Ray's task error (ray/exceptions.py:249).
ENGINE_OOM = """(vLLMHttpServer pid={pid}) (EngineCore_DP0 pid={pid}) ERROR 05-02 10:11:12 [core.py:710] EngineCore encountered a fatal error.
(vLLMHttpServer pid={pid}) (EngineCore_DP0 pid={pid}) ERROR 05-02 10:11:12 [core.py:710] Traceback (most recent call last):
(vLLMHttpServer pid={pid}) (EngineCore_DP0 pid={pid}) ERROR 05-02 10:11:12 [core.py:710]   File "/opt/verl/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 701, in run_engine_core
(vLLMHttpServer pid={pid}) (EngineCore_DP0 pid={pid}) ERROR 05-02 10:11:12 [core.py:710] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB. GPU 0 has a total capacity of 139.72 GiB of which 0.81 GiB is free.
"""
GENERATION_FAILED = """(AgentLoopWorkerTQ pid={pid}) Error in _run_prompt for uid={uid}
(AgentLoopWorkerTQ pid={pid}) Traceback (most recent call last):
(AgentLoopWorkerTQ pid={pid})   File "/opt/verl/lib/python3.11/site-packages/verl/experimental/agent_loop/single_turn_agent_loop.py", line 67, in run
(AgentLoopWorkerTQ pid={pid})     output: TokenOutput = await self.server_manager.generate(
(AgentLoopWorkerTQ pid={pid}) {cause}
"""
CAUSES = {
    "oom": "ray.exceptions.RayTaskError(EngineDeadError): ray::vLLMHttpServer.generate() (pid={pid}, ip=127.0.0.1)\n"
    "(AgentLoopWorkerTQ pid={pid}) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause.",
    "": "ValueError: the stand-in's generation failed",
}


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


def ray_temp_dir(cfg: dict[str, str]) -> str:
    """Ray's temp dir: `_temp_dir`, else $RAY_TMPDIR/ray, else $TMPDIR/ray (Linux), else /tmp/ray."""
    if cfg.get("ray_kwargs.ray_init._temp_dir"):
        return cfg["ray_kwargs.ray_init._temp_dir"]
    return os.path.join(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp", "ray")


def ray_init(cfg: dict[str, str]) -> str | None:
    """Ray's choice for ray.init(address=...): the address it would join, None to start a new instance."""
    address = cfg.get("ray_kwargs.ray_init.address") or None
    if address not in (None, "auto"):
        return None if address == "local" else address
    address = os.environ.get("RAY_ADDRESS") or address
    if address not in (None, "auto"):
        return address
    recorded = os.path.join(ray_temp_dir(cfg), "ray_current_cluster")
    if os.path.exists(recorded):
        with open(recorded) as f:
            return f.read().strip()
    return None


def answers(address: str) -> bool:
    """Something listens at host:port (a Ray cluster's GCS, in the tests that start one)."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except (OSError, ValueError):
        return False
    return True


def join_cluster(address: str, cfg: dict[str, str]) -> str | None:
    """Join a real cluster as verl's ray.init does; its error when it has fewer nodes than verl's resource
    pool asks for (single_controller/ray/base.py:226-241 counts GPUs; on CPU, nodes stand in for them)."""
    import ray

    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    try:
        alive = [node for node in ray.nodes() if node.get("Alive")]
        workers = [node for node in alive if node["Resources"].get("CPU", 0) >= 1]
        nodes = number(cfg.get("trainer.nnodes", "1"))
        print(f"(TaskRunnerV1 pid={os.getpid()}) cluster: {len(workers)} nodes with a CPU", flush=True)
        if len(workers) < nodes:
            return (
                f"ValueError: Total available nodes {len(workers)} is less than total desired nodes {nodes}\n"
            )
        return None
    finally:
        ray.shutdown()


def start_ray(cfg: dict[str, str]) -> None:
    """A new local instance's session folder and `session_latest` link in the temp dir."""
    temp_dir = ray_temp_dir(cfg)
    session = f"session_{datetime.datetime.today().strftime('%Y-%m-%d_%H-%M-%S_%f')}_{os.getpid()}"
    os.makedirs(os.path.join(temp_dir, session, "logs"), exist_ok=True)
    latest = os.path.join(temp_dir, "session_latest")
    if os.path.lexists(latest):
        os.remove(latest)
    os.symlink(session, latest)


def fail_generation(cause: str) -> None:
    pid = os.getpid()
    if cause == "oom":
        print(ENGINE_OOM.format(pid=pid), end="", flush=True)
    text = GENERATION_FAILED.format(pid=pid, uid=uuid.uuid4().hex, cause=CAUSES[cause].format(pid=pid))
    print(text, end="", flush=True)


def main() -> int:
    cfg = parse(sys.argv[1:])
    if os.environ.get("AUTOTUNE_FAKE_VERL_ARGV"):
        with open(os.environ["AUTOTUNE_FAKE_VERL_ARGV"], "w") as argv:
            argv.write("\n".join(sys.argv[1:]) + "\n")
    script = set(os.environ.get("AUTOTUNE_FAKE_VERL", "").split(","))
    overrides = ", ".join(sys.argv[1:4])
    gpus = number(cfg.get("trainer.n_gpus_per_node", "1"))
    print("ray init kwargs: {'num_cpus': None}", flush=True)
    joined = ray_init(cfg)
    if joined is not None:
        print(f"Connecting to existing Ray cluster at address: {joined}...", flush=True)
        if not answers(joined):
            sys.stderr.write(
                f"ConnectionError: Failed to connect to GCS at address {joined} (the stand-in)\n"
            )
            return 1
        refused = join_cluster(joined, cfg)
        if refused:
            sys.stderr.write(refused)
            return 1
    else:
        start_ray(cfg)
    data = pd.read_parquet(cfg["data.train_files"])
    assert {"prompt", "data_source", "reward_model"} <= set(data.columns), data.columns
    print(f"(TaskRunnerV1 pid={os.getpid()}) dataset len: {len(data)}", flush=True)
    if "gpus0" in script:
        sys.stderr.write(GPUS0.format(overrides=overrides, pid=os.getpid(), gpus=gpus))
        return 1
    if len(data) < number(cfg["data.train_batch_size"]):
        sys.stderr.write("ZeroDivisionError: integer division or modulo by zero\n")
        return 1
    if "hang" in script:
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
    steps = 1 if "exit0-missing" in script else number(cfg["trainer.total_training_steps"])
    refills = (
        cfg.get("trainer.v1.sampler.sync_refill_failed_groups", "false").lower() == "true"
        or "stuck" in script
    )
    with open(path, "wb", buffering=0) as log:
        for step in range(1, steps + 1):
            if "gen-fail" in script and step == 1:
                fail_generation("oom" if "oom" in script else "")
                while refills:  # each refilled prompt fails again
                    time.sleep(1.0)
                    fail_generation("oom" if "oom" in script else "")
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
