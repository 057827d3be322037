"""The verl backend's readers on text in verl 0.9.1's exact formats (fast tier: no process, no verl import).

Every sample below was written from verl's source (paths relative to the installed `site-packages/`; the
citations say which line produces the format). The console and file samples carry the same figures, made by
verl's own `concat_dict_to_str` and by orjson with OPT_SERIALIZE_NUMPY in `.venv-verl`. The failure samples
are realistic Ray/Hydra tracebacks assembled from the code that prints them; nothing here ran on a GPU.
"""

from __future__ import annotations

import pytest

from autotune.probe.verl.failures import classify_run, last_exception
from autotune.probe.verl.metrics import (
    clean_line,
    merge_steps,
    parse_console,
    parse_file_log,
    phase_of,
    summarise,
)
from autotune.status import OOM_PHASES, ROLLOUT_OOM, SCORING_OOM, UPDATE_OOM, Status
from autotune.units import GIB

CYAN, RESET_ALL, FORE_RESET = "\x1b[36m", "\x1b[0m", "\x1b[39m"

# The file logger: one `{"step": N, "data": metrics}` per `Tracking.log` call, written by
# `orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)` (verl/utils/tracking.py:543-545), the call at
# verl/trainer/ppo/v1/trainer_base.py:514. NaN and inf become null; strings are kept (and skipped by us).
FILE_LOG = (
    '{"step":1,"data":{"actor/pg_loss":0.0031,"actor/entropy":null,'
    '"actor/perf/max_memory_allocated_gb":30.5,"actor/perf/max_memory_reserved_gb":34.0,'
    '"timing_s/gen":40.0,"timing_s/old_log_prob":3.0,"timing_s/ref":2.0,"timing_s/adv":0.1,'
    '"timing_s/update_actor":5.0,"timing_s/update_weights":4.9,"timing_s/step":55.0,'
    '"perf/total_num_tokens":65536,"perf/time_per_step":55.0,"perf/throughput":1191.56,'
    '"training/global_step":1,"training/epoch":0}}\n'
    '{"step":2,"data":{"actor/pg_loss":-0.0123,"actor/entropy":null,'
    '"actor/perf/max_memory_allocated_gb":31.25,"actor/perf/max_memory_reserved_gb":36.5,'
    '"timing_s/gen":6.5,"timing_s/old_log_prob":1.25,"timing_s/ref":1.0,"timing_s/adv":0.05,'
    '"timing_s/update_actor":2.2,"timing_s/update_weights":0.75,"timing_s/step":11.75,'
    '"perf/total_num_tokens":65536,"perf/time_per_step":11.75,"perf/throughput":5577.53,'
    '"training/global_step":2,"training/epoch":0,"tag":"skipme"}}\n'
    '{"step":3,"data":{"actor/pg_loss":-0.02,"actor/entropy":1.9,'
    '"actor/perf/max_memory_allocated_gb":31.0,"actor/perf/max_memory_reserved_gb":36.5,'
    '"timing_s/gen":8.5,"timing_s/old_log_prob":1.75,"timing_s/ref":1.0,"timing_s/adv":0.15,'
    '"timing_s/update_actor":1.8,"timing_s/update_weights":0.75,"timing_s/step":14.25,'
    '"perf/total_num_tokens":65536,"perf/time_per_step":14.25,"perf/throughput":4599.02,'
    '"training/global_step":3,"training/epoch":0}}\n'
)

# The console logger: `print(concat_dict_to_str(data, step=step), flush=True)`
# (verl/utils/logger/aggregate_logger.py:26-32,51): "step:N" then " - key:pformat(value)" for each
# numbers.Number, so numpy scalars read np.float64(...) (numpy 2) and NaN reads nan. It runs in the
# TaskRunnerV1 actor (verl/trainer/main_ppo.py:102-103), so Ray forwards it to the driver as
# f"{color_pre}({prefix_for(data)}{pid}{ip_prefix}){color_post} {message}" (ray/_private/worker.py:2404),
# CYAN ... RESET_ALL by default (worker.py:2390-2395). The other lines are the same actor's other output:
# tracking.py:540, the tqdm bar (trainer_base.py:451, stderr, carriage returns) and trainer_base.py:526.
CONSOLE = "\n".join(
    [
        "ray init kwargs: {'num_cpus': 8, 'runtime_env': {'env_vars': {'RAY_DEDUP_LOGS': '0'}}}",
        f"{CYAN}(TaskRunnerV1 pid=2134){RESET_ALL} Creating file logger at /tmp/probe/metrics.jsonl",
        f"{CYAN}(WorkerDict pid=2301){RESET_ALL} step:7 is not a step line: it comes from another actor",
        f"{CYAN}(TaskRunnerV1 pid=2134){RESET_ALL} step:1 - actor/pg_loss:np.float64(0.0031) - "
        "actor/entropy:nan - actor/perf/max_memory_allocated_gb:np.float64(30.5) - "
        "actor/perf/max_memory_reserved_gb:np.float64(34.0) - timing_s/gen:40.0 - "
        "timing_s/old_log_prob:3.0 - "
        "timing_s/ref:1.0 - timing_s/ref:2.0 - timing_s/adv:0.1 - timing_s/update_actor:5.0 - "
        "timing_s/update_weights:4.9 - timing_s/step:55.0 - perf/total_num_tokens:65536 - "
        "perf/time_per_step:55.0 - perf/throughput:np.float64(1191.56) - training/global_step:1 - "
        "training/epoch:0",
        f"{CYAN}(TaskRunnerV1 pid=2134){RESET_ALL} Training Progress:  33%|███▎      | 1/3 [00:55<01:50]",
        f"{CYAN}(TaskRunnerV1 pid=2134){RESET_ALL} step:2 - actor/pg_loss:np.float64(-0.0123) - "
        "actor/entropy:np.float64(nan) - actor/perf/max_memory_allocated_gb:np.float64(31.25) - "
        "actor/perf/max_memory_reserved_gb:np.float64(36.5) - timing_s/gen:6.5 - "
        "timing_s/old_log_prob:1.25 - "
        "timing_s/ref:1.0 - timing_s/adv:0.05 - timing_s/update_actor:2.2 - timing_s/update_weights:0.75 - "
        "timing_s/step:11.75 - perf/total_num_tokens:65536 - perf/time_per_step:11.75 - "
        "perf/throughput:np.float64(5577.53) - training/global_step:2 - training/epoch:0",
        # A line that shared the terminal with the progress bar's carriage-return updates.
        f"{CYAN}(TaskRunnerV1 pid=2134){RESET_ALL} Training Progress:  67%|██████▋   | 2/3\r"
        "step:3 - actor/pg_loss:np.float64(-0.02) - actor/entropy:np.float32(1.9) - "
        "actor/perf/max_memory_allocated_gb:np.float64(31.0) - "
        "actor/perf/max_memory_reserved_gb:np.float64(36.5) - "
        "timing_s/gen:8.5 - timing_s/old_log_prob:1.75 - timing_s/ref:1.0 - timing_s/adv:0.15 - "
        "timing_s/update_actor:1.8 - timing_s/update_weights:0.75 - timing_s/step:14.25 - "
        "perf/total_num_tokens:np.int64(65536) - perf/time_per_step:14.25 - "
        "perf/throughput:np.float64(4599.02) - "
        "training/global_step:3 - training/epoch:0",
        f"{CYAN}(TaskRunnerV1 pid=2134){RESET_ALL} 'Final validation metrics: None'",
    ]
)

T = 64  # data.train_batch_size 16 × rollout.n 4


# --- parsing -----------------------------------------------------------------------------------------------


def test_file_log_reads_each_step_with_nan_as_none_and_numbers_only():
    steps = parse_file_log(FILE_LOG)
    assert sorted(steps) == [1, 2, 3]
    assert steps[2]["timing_s/step"] == 11.75
    assert steps[2]["actor/entropy"] is None  # orjson wrote NaN as null
    assert steps[2]["perf/total_num_tokens"] == 65536
    assert "tag" not in steps[2]  # a string is no figure


def test_file_log_survives_a_line_cut_short_by_a_kill():
    cut = FILE_LOG + '{"step":4,"data":{"timing_s/gen":7.0,"timing_s/st'
    assert sorted(parse_file_log(cut)) == [1, 2, 3]
    assert parse_file_log('[1, 2]\n{"step": "x", "data": {}}\n\n') == {}


def test_console_reads_numpy_reprs_behind_ray_prefix_and_colours():
    steps = parse_console(CONSOLE)
    assert sorted(steps) == [1, 2, 3]  # not "step:7" of another line's text
    assert steps[2]["actor/pg_loss"] == -0.0123  # np.float64(-0.0123): a negative after ":" splits safely
    assert steps[2]["actor/entropy"] is None  # np.float64(nan)
    assert steps[1]["actor/entropy"] is None  # plain nan
    assert steps[3]["actor/entropy"] == pytest.approx(1.9)  # np.float32(1.9)
    assert steps[3]["perf/total_num_tokens"] == 65536  # np.int64(65536)
    assert steps[3]["timing_s/step"] == 14.25  # the line after a progress bar's carriage return
    assert steps[1]["timing_s/ref"] == 2.0  # a key printed twice: the last wins, as in a dict


def test_console_and_file_logger_agree():
    console, file = parse_console(CONSOLE), parse_file_log(FILE_LOG)
    for step in (1, 2, 3):
        assert console[step] == pytest.approx(file[step])  # None (NaN) on both sides where verl had NaN


@pytest.mark.parametrize(
    "line",
    [
        # V0's runner (verl/trainer/main_ppo_v0.py:136-137), no colour (RAY_COLOR_PREFIX=0,
        # worker.py:2390-2392)
        "(TaskRunner pid=991) step:5 - timing_s/step:2.5 - x:True",
        # a remote node's actor: ", ip=..." (worker.py:2383)
        f"{CYAN}(TaskRunnerV1 pid=991, ip=10.0.0.7){RESET_ALL} step:5 - timing_s/step:2.5 - x:True",
        # RAY_DISABLE_WORKER_LOG_PREFIX=1: the bare line (worker.py:2396-2400)
        "step:5 - timing_s/step:2.5 - x:True",
        # Ray's dedup suffix (ray/_private/ray_logging/__init__.py:234), should it ever fold a step line
        f"(TaskRunnerV1 pid=991) step:5 - timing_s/step:2.5 - x:True{CYAN} [repeated 2x across cluster]"
        f"{RESET_ALL}",
    ],
)
def test_console_prefix_variants(line):
    assert parse_console(line) == {5: {"timing_s/step": 2.5, "x": 1.0}}


def test_clean_line_strips_prefix_and_colour_only():
    assert clean_line(f"{CYAN}(vLLMHttpServer pid=77){RESET_ALL} ValueError: boom\n") == "ValueError: boom"
    assert clean_line("(pid=77) hello - world") == "hello - world"


def test_merge_prefers_the_first_source_per_step():
    file = parse_file_log(FILE_LOG.splitlines()[0])
    merged = merge_steps(file, parse_console(CONSOLE))
    assert sorted(merged) == [1, 2, 3]
    assert merged[1]["timing_s/ref"] == 2.0 and "training/epoch" in merged[1]
    assert merged[1] is file[1]


# --- the summary -------------------------------------------------------------------------------------------


def test_first_step_is_warm_up_and_excluded():
    summary = summarise(parse_file_log(FILE_LOG), expected=3, batch_samples=T)
    assert summary.step_seconds == [11.75, 14.25]  # step 1's 55 s (vLLM start, CUDA graphs) left out
    assert summary.warmup_seconds == 55.0
    assert summary.iteration_seconds == 13.0
    assert summary.samples_per_sec == pytest.approx(T / 13.0)
    assert summary.tokens_per_sec == pytest.approx(2 * 65536 / 26.0)
    assert summary.missing == []


def test_phases_map_onto_autotunes_and_keep_the_others():
    summary = summarise(parse_console(CONSOLE), expected=3, batch_samples=T)
    assert summary.phase_seconds == pytest.approx(
        {
            "rollout": (6.5 + 8.5) / 2,  # gen
            "scoring": (1.25 + 1.0 + 1.75 + 1.0) / 2,  # old_log_prob + ref
            "advantages": (0.05 + 0.15) / 2,  # adv
            "update": (2.2 + 1.8) / 2,  # update_actor
            "update_weights": 0.75,  # no autotune phase: its own name
        }
    )
    assert phase_of("timing_s/values") == phase_of("timing_s/reward") == "scoring"
    assert phase_of("timing_s/update_critic") == "update"
    assert phase_of("timing_s/step") is None and phase_of("perf/time_per_step") is None


def test_allocator_peak_is_the_largest_over_steps_in_bytes():
    summary = summarise(parse_file_log(FILE_LOG), expected=3, batch_samples=T)
    assert summary.allocated_peak_bytes == round(31.25 * GIB)  # verl's "gb" is bytes / 1024**3
    assert summary.reserved_peak_bytes == round(36.5 * GIB)
    critic = {2: {"timing_s/step": 1.0, "critic/perf/max_memory_allocated_gb": 40.0}}
    assert summarise(critic, expected=2, batch_samples=T).allocated_peak_bytes == 40 * GIB
    assert summarise({}, expected=2, batch_samples=T).allocated_peak_bytes is None


def test_a_missing_step_is_named_and_the_rest_still_measured():
    lines = FILE_LOG.splitlines()
    steps = parse_file_log("\n".join([lines[0], lines[2]]))  # step 2 never logged, and 4 never came
    summary = summarise(steps, expected=4, batch_samples=T)
    assert summary.missing == [2, 4]
    assert summary.step_seconds == [14.25]
    assert summary.samples_per_sec == pytest.approx(T / 14.25)


def test_only_a_warm_up_step_measures_nothing():
    summary = summarise(parse_file_log(FILE_LOG.splitlines()[0]), expected=3, batch_samples=T)
    assert summary.step_seconds == [] and summary.samples_per_sec == 0.0 and summary.phase_seconds == {}
    assert summary.missing == [2, 3]


# --- failures ----------------------------------------------------------------------------------------------

# A CUDA OOM in the actor update, as the driver's stderr shows it. Hydra writes "Error executing job with
# overrides" (hydra/core/utils.py:261), the traceback with its own frames stripped, then the HYDRA_FULL_ERROR
# hint (hydra/_internal/utils.py:293) and exits 1 (:303). The driver waits at main_ppo.py:93; Ray re-raises
# with `raise value.as_instanceof_cause()` (ray/_private/worker.py:3021), whose class is named after the root
# cause at every level (ray/exceptions.py:249) and whose str starts with the task header in CYAN ... RESET
# (ray/exceptions.py:347-357). The worker call is `self.actor_rollout_wg.update_actor(batch)`
# (trainer_base.py:1860), blocking in `ray.get` (verl/single_controller/ray/base.py:54), run on the colocated
# WorkerDict as `<role>_<method>` (base.py:958-959, role "actor_rollout_ref": verl/trainer/ppo/utils.py:53).
CUDA_OOM_TAIL = f"""\
{CYAN}(TaskRunnerV1 pid=2134){RESET_ALL} step:1 - timing_s/step:55.0
Error executing job with overrides: ['algorithm.adv_estimator=grpo', 'data.train_batch_size=16']
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 184, in main
    run_ppo(config, task_runner_class=TaskRunnerV1)
  File "/venv/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 93, in run_ppo
    ray.get(runner.run.remote(config))
  File "/venv/lib/python3.11/site-packages/ray/_private/auto_init_hook.py", line 22, in auto_init_wrapper
    return fn(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/ray/_private/client_mode_hook.py", line 134, in wrapper
    return func(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/ray/_private/worker.py", line 3021, in get
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(OutOfMemoryError): {CYAN}ray::TaskRunnerV1.run(){FORE_RESET} (pid=2134, \
ip=10.0.0.5, actor_id=5f1a0c, repr=<verl.trainer.main_ppo.TaskRunnerV1 object at 0x7f2c1c2b1f10>)
  File "/venv/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 155, in run
    self.trainer.fit(self.agent_loop_manager)
  File "/venv/lib/python3.11/site-packages/verl/trainer/ppo/v1/trainer_base.py", line 477, in fit
    batch = self.step(metrics, self.timing_raw)
  File "/venv/lib/python3.11/site-packages/verl/trainer/ppo/v1/trainer_base.py", line 610, in _step_once
    batch = self._update_actor(batch, metrics=metrics)
  File "/venv/lib/python3.11/site-packages/verl/trainer/ppo/v1/trainer_base.py", line 1860, in _update_actor
    output: TensorDict = self.actor_rollout_wg.update_actor(batch)
  File "/venv/lib/python3.11/site-packages/verl/single_controller/ray/base.py", line 54, in __call__
    output = ray.get(output)
ray.exceptions.RayTaskError(OutOfMemoryError): {CYAN}ray::WorkerDict.actor_rollout_ref_update_actor()\
{FORE_RESET} (pid=2301, ip=10.0.0.5, actor_id=9be2d4, \
repr=<verl.single_controller.ray.base.WorkerDict object at 0x7f3a2c0d5e50>)
  File "/venv/lib/python3.11/site-packages/verl/single_controller/ray/base.py", line 935, in func
    return getattr(self.worker_dict[key], name)(*args, **kwargs)
  File "/venv/lib/python3.11/site-packages/verl/single_controller/base/decorator.py", line 431, in inner
    return func(*args, **kwargs)
  File "/venv/lib/python3.11/site-packages/verl/workers/engine_workers.py", line 714, in update_actor
    output = self.actor.train_mini_batch(data=data)
  File "/venv/lib/python3.11/site-packages/verl/workers/engine_workers.py", line 314, in train_mini_batch
    actor_output = self.train_batch(mini_batch_td)
  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward
    torch.autograd.backward(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of \
139.72 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 138.69 GiB memory in \
use. Of the allocated memory 120.31 GiB is allocated by PyTorch, and 4.87 GiB is reserved by PyTorch but \
unallocated. If reserved but unallocated memory is large try setting \
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory \
Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""

# A worker that ran out of memory while loading the model: the OOM is raised in WorkerDict's creation task,
# so Ray reports the actor dead with the creation task's error inside (ray/exceptions.py:487-494); older
# torch names the class torch.cuda.OutOfMemoryError.
ACTOR_DIED_TAIL = f"""\
  File "/venv/lib/python3.11/site-packages/verl/single_controller/ray/base.py", line 54, in __call__
    output = ray.get(output)
ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, \
{CYAN}ray::WorkerDict.__init__(){FORE_RESET} (pid=2301, ip=10.0.0.5, actor_id=9be2d4, \
repr=<verl.single_controller.ray.base.WorkerDict object at 0x7f3a2c0d5e50>)
  File "/venv/lib/python3.11/site-packages/transformers/modeling_utils.py", line 4012, in from_pretrained
    model = cls(config, *model_args, **model_kwargs)
torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.45 GiB. GPU 0 has a total capacity of \
79.15 GiB of which 612.00 MiB is free.

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""

# vLLM's refusals come from its EngineCore process, forwarded under the vLLMHttpServer actor's prefix
# (verl/workers/rollout/vllm_rollout/vllm_async_server.py:87). vLLM is not installed here: the wording is
# from vLLM's public source (vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory), not from a run.
VLLM_NO_BLOCKS_TAIL = f"""\
{CYAN}(vLLMHttpServer pid=3012){RESET_ALL} (EngineCore_DP0 pid=3201) ERROR 05-02 10:11:12 [core.py:708] \
EngineCore failed to start.
{CYAN}(vLLMHttpServer pid=3012){RESET_ALL} (EngineCore_DP0 pid=3201) ERROR 05-02 10:11:12 [core.py:708] \
ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when \
initializing the engine.
ray.exceptions.RayTaskError(RuntimeError): {CYAN}ray::vLLMHttpServer.launch_server(){FORE_RESET} (pid=3012)
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}
"""
VLLM_TOO_LONG_TAIL = (
    "(vLLMHttpServer pid=3012) (EngineCore_DP0 pid=3201) ValueError: To serve at least one request with the "
    "model's max seq len (4096), (1.50 GiB KV cache is needed, which is larger than the available KV cache "
    "memory (0.88 GiB). Based on the available memory, the estimated maximum model length is 2400. Try "
    "increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\n"
    "RuntimeError: Engine core initialization failed. See root cause above.\n"
)
VLLM_STARTUP_TAIL = (
    "(vLLMHttpServer pid=3012) (EngineCore_DP0 pid=3201) ValueError: Free memory on device cuda:0 "
    "(60.1/139.7 GiB) on startup is less than desired GPU memory utilization (0.6, 83.8 GiB). Decrease GPU "
    "memory utilization or reduce GPU memory used by other processes.\n"
)

# verl's resource check before any worker (verl/single_controller/ray/base.py:239-241), reached on a machine
# whose Ray cluster has no GPU.
GPUS_ZERO_TAIL = f"""\
ray.exceptions.RayTaskError(ValueError): {CYAN}ray::TaskRunnerV1.run(){FORE_RESET} (pid=2134, ip=10.0.0.5)
  File "/venv/lib/python3.11/site-packages/verl/single_controller/ray/base.py", line 239, in \
_check_resource_available
    raise ValueError(
ValueError: Total available GPUs 0 is less than total desired GPUs 1

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""

# Ray's memory monitor killing a worker because the host ran low (ray/exceptions.py:655-667): also a class
# named OutOfMemoryError, so the wrapper reads RayTaskError(OutOfMemoryError) as torch's does.
HOST_OOM_TAIL = f"""\
ray.exceptions.RayTaskError(OutOfMemoryError): {CYAN}ray::TaskRunnerV1.run(){FORE_RESET} (pid=2134)
  File "/venv/lib/python3.11/site-packages/verl/single_controller/ray/base.py", line 54, in __call__
    output = ray.get(output)
ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.
Memory on the node (IP: 10.0.0.5, ID: 4c1e) where the task (actor ID: 9be2d4, name=WorkerDict.__init__) was \
running was 120.51GB / 125.80GB (0.957952), which exceeds the memory usage threshold of 0.95.
"""

# TaskRunnerV1.run imports TransferQueue first (verl/trainer/main_ppo.py:137): a verl without it.
NO_TQ_TAIL = f"""\
ray.exceptions.RayTaskError(ModuleNotFoundError): {CYAN}ray::TaskRunnerV1.run(){FORE_RESET} (pid=2134)
  File "/venv/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 137, in run
    import transfer_queue as tq
ModuleNotFoundError: No module named 'transfer_queue'

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""


def test_complete_run_is_ok_whatever_its_output_says():
    assert classify_run(0, False, 3, 3, CUDA_OOM_TAIL) == (Status.OK, None, "")


def test_cuda_oom_wrapped_in_nested_ray_task_errors():
    status, kind, message = classify_run(1, False, 1, 3, CUDA_OOM_TAIL)
    assert (status, kind) == (Status.OOM, UPDATE_OOM)  # raised in the actor's update: a training task
    assert "ray::WorkerDict.actor_rollout_ref_update_actor()" in message  # where: the innermost task
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in message
    assert "\x1b" not in message


def test_cuda_oom_in_a_dead_actors_creation_task():
    status, kind, message = classify_run(1, False, 0, 3, ACTOR_DIED_TAIL)
    assert (status, kind) == (Status.OOM, "cuda")
    assert "ray::WorkerDict.__init__()" in message and "torch.cuda.OutOfMemoryError" in message


def test_cuda_oom_wins_over_the_timeout_it_caused():
    assert classify_run(None, True, 1, 3, CUDA_OOM_TAIL)[:2] == (Status.OOM, UPDATE_OOM)


def test_ray_wrapper_alone_is_a_cuda_oom():
    # The tail kept only the wrapper's line: a GPU run's OutOfMemoryError is torch's unless Ray says host.
    tail = (
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_ref_compute_log_prob()"
    )
    assert classify_run(1, False, 1, 3, tail)[:2] == (Status.OOM, SCORING_OOM)  # a forward pass


@pytest.mark.parametrize("tail", [VLLM_NO_BLOCKS_TAIL, VLLM_TOO_LONG_TAIL, VLLM_STARTUP_TAIL])
def test_vllm_kv_cache_refusals(tail):
    status, kind, message = classify_run(1, False, 0, 3, tail)
    assert (status, kind) == (Status.OOM, "vllm_kv_cache")
    assert message.startswith("vLLM could not reserve its KV cache: ValueError: ")
    assert "EngineCore_DP0" not in message and "vLLMHttpServer" not in message


def test_vllm_refusal_that_hung_the_driver_is_still_an_oom():
    assert classify_run(None, True, 0, 3, VLLM_NO_BLOCKS_TAIL)[:2] == (Status.OOM, "vllm_kv_cache")


def test_host_memory_kill_is_not_a_cuda_oom():
    status, kind, message = classify_run(1, False, 0, 3, HOST_OOM_TAIL)
    assert (status, kind) == (Status.OOM, "host")
    assert "node running low on memory" in message


def test_no_gpus_is_a_crash_that_says_so():
    status, kind, message = classify_run(1, False, 0, 3, GPUS_ZERO_TAIL)
    assert (status, kind) == (Status.CRASHED, None)
    assert message.startswith("verl found 0 GPUs in its Ray cluster but needs 1")
    assert "CUDA_VISIBLE_DEVICES" in message


def test_timeout():
    status, kind, message = classify_run(None, True, 2, 4, CONSOLE)
    assert (status, kind) == (Status.TIMEOUT, None)
    assert "after 2 of 4 steps" in message


def test_exit_zero_short_of_its_steps_is_a_crash():
    assert classify_run(0, False, 2, 4, CONSOLE) == (Status.CRASHED, None, "verl exited 0 after 2 of 4 steps")


def test_other_crash_names_the_exit_and_the_innermost_exception():
    status, kind, message = classify_run(1, False, 0, 3, NO_TQ_TAIL)
    assert (status, kind) == (Status.CRASHED, None)
    assert message == "verl: exit code 1: ModuleNotFoundError: No module named 'transfer_queue'"
    assert classify_run(-9, False, 1, 3, "")[2] == "verl: killed by SIGKILL"


def test_last_exception_skips_source_lines_and_hydras_hint():
    assert (
        last_exception(GPUS_ZERO_TAIL)
        == "ValueError: Total available GPUs 0 is less than total desired GPUs 1"
    )
    assert last_exception("all good\n") is None


def test_vague_words_are_not_evidence():
    tail = "WARNING: low memory on the host; CPU memory is at 90%\nRuntimeError: NCCL error in: init.cpp:1\n"
    assert classify_run(1, False, 0, 3, tail)[:2] == (Status.CRASHED, None)


def test_a_cuda_oom_outside_a_training_task_is_not_a_training_oom():
    """Where the rollout engine holds its pool (generation, the vLLM server), the share counts: a rollout
    OOM, which names no training phase (study.oom_phase reads None for it, as for "cuda")."""
    tail = (
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::vLLMHttpServer.generate() "
        "(pid=7, ip=10.0.0.1)\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB."
    )
    assert classify_run(1, False, 1, 3, tail)[:2] == (Status.OOM, ROLLOUT_OOM)
    assert ROLLOUT_OOM not in OOM_PHASES
    outside = tail.replace("ray::vLLMHttpServer.generate()", "ray::RewardLoopWorker.compute_score()")
    assert classify_run(1, False, 1, 3, outside)[:2] == (Status.OOM, "cuda")


# vLLM's sleep-mode allocator failing to map the rollout's memory back as verl wakes the engine for a step
# (vllm_async_server.py:832-849 wake_up -> AsyncLLM.wake_up -> the engine core's CuMemAllocator.wake_up).
# The C extension's CUDA_CHECK macro formats `CUDA Error: %s at %s:%d` with cuGetErrorString's "out of
# memory" and prints it to stderr, and python_create_and_map raises it as a RuntimeError (vLLM
# csrc/cumem_allocator.cpp, CUDA_CHECK ll. 62-73 and create_and_map's cuMemCreate at l. 111, vllm-project/vllm
# 0035e224); CuMemAllocator.wake_up logs "Failed to wake up allocator: %s. Rolling back %d successfully mapped
# allocations." and re-raises (vllm/device_allocator/cumem.py); the engine core logs "Invocation of %s method
# failed" and answers "Call to {method_name} method failed: {e}", which the client raises as an Exception
# (vllm/v1/engine/core.py, _handle_client_request), through verl's vLLMHttpServer.wake_up and Ray.
WAKE_UP_OOM_TAIL = f"""\
(vLLMHttpServer pid=3012) (EngineCore_DP0 pid=3201) CUDA Error: out of memory at \
/workspace/csrc/cumem_allocator.cpp:111
(vLLMHttpServer pid=3012) (EngineCore_DP0 pid=3201) ERROR 05-02 10:11:12 [cumem.py:262] Failed to wake \
up allocator: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:111. Rolling back 37 \
successfully mapped allocations.
(vLLMHttpServer pid=3012) (EngineCore_DP0 pid=3201) ERROR 05-02 10:11:12 [core.py:1187] Invocation of \
wake_up method failed
(vLLMHttpServer pid=3012) (EngineCore_DP0 pid=3201) RuntimeError: CUDA Error: out of memory at \
/workspace/csrc/cumem_allocator.cpp:111
Error executing job with overrides: ['algorithm.adv_estimator=grpo']
ray.exceptions.RayTaskError(Exception): {CYAN}ray::TaskRunnerV1.run(){FORE_RESET} (pid=2134, ip=10.0.0.5)
ray.exceptions.RayTaskError(Exception): ray::vLLMHttpServer.wake_up() (pid=3012, ip=10.0.0.5)
Exception: Call to wake_up method failed: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:111
"""

# Ray >= 2.55's memory monitor killing an actor's worker (verl's WorkerDict): the raylet's format string
# `%d worker(s) were killed due to the node running low on memory. %s` (ray 2.60.0's raylet binary, from
# src/ray/raylet/node_manager.cc; the example in Ray's doc/source/ray-core/scheduling/ray-oom-prevention.rst)
# is the worker's exit detail, which the GCS wraps as "The actor is dead because its worker process has died.
# Worker exit type: NODE_OUT_OF_MEMORY Worker exit detail: ..." (ray 2.60.0's gcs_server) and the driver
# raises as ActorDiedError, the class name and the death cause's message on their own lines
# (ray/exceptions.py:456-522, ray/_private/serialization.py:409-422).
ACTOR_HOST_OOM_TAIL = f"""\
ray.exceptions.RayTaskError(ActorDiedError): {CYAN}ray::TaskRunnerV1.run(){FORE_RESET} (pid=2134, ip=10.0.0.5)
  File "/venv/lib/python3.11/site-packages/verl/single_controller/ray/base.py", line 56, in __call__
    output = ray.get(output)
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
\tclass_name: create_colocated_worker_cls.<locals>.WorkerDict
\tactor_id: 9be2d4c1e0a7f3b2c9d8e7f601000000
\tpid: 2301
\tip: 10.0.0.5
The actor is dead because its worker process has died. Worker exit type: NODE_OUT_OF_MEMORY Worker exit \
detail: 1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 10.0.0.5, ID: \
4c1e) was 120.51GB / 125.80GB (0.957952), which exceeds the memory usage threshold of 0.95.
"""


def test_vllm_wake_up_oom_is_a_rollout_oom():
    status, kind, message = classify_run(1, False, 1, 3, WAKE_UP_OOM_TAIL)
    assert (status, kind) == (Status.OOM, ROLLOUT_OOM)
    assert message.startswith("vLLM's sleep-mode allocator ran out of GPU memory")
    assert message.endswith("CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:111")
    assert classify_run(None, True, 1, 3, WAKE_UP_OOM_TAIL)[:2] == (Status.OOM, ROLLOUT_OOM)


def test_ray_kills_an_actor_for_host_memory_inside_actor_died_error():
    status, kind, message = classify_run(1, False, 0, 3, ACTOR_HOST_OOM_TAIL)
    assert (status, kind) == (Status.OOM, "host")
    assert "1 worker(s) were killed due to the node running low on memory" in message


# verl's V1 agent loop worker on a failed generation (verl/trainer/ppo/v1/agent_loop_tq.py:133-140,
# `logger.error(f"Error in _run_prompt for uid={uid}", exc_info=...)`), forwarded by Ray, after the vLLM
# engine core died of a CUDA OOM (vllm/v1/engine/core.py, run_engine_core: "EngineCore encountered a fatal
# error."; EngineDeadError's message from vllm/v1/engine/exceptions.py).
GENERATION_OOM_TAIL = f"""\
(vLLMHttpServer pid=3012) (EngineCore_DP0 pid=3201) ERROR 05-02 10:11:12 [core.py:710] EngineCore \
encountered a fatal error.
(vLLMHttpServer pid=3012) (EngineCore_DP0 pid=3201) ERROR 05-02 10:11:12 [core.py:710] \
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB. GPU 0 has a total capacity of \
139.72 GiB of which 0.81 GiB is free.
{CYAN}(AgentLoopWorkerTQ pid=2410){RESET_ALL} Error in _run_prompt for uid=3f2a9c
{CYAN}(AgentLoopWorkerTQ pid=2410){RESET_ALL} Traceback (most recent call last):
{CYAN}(AgentLoopWorkerTQ pid=2410){RESET_ALL}   File "/venv/lib/python3.11/site-packages/verl/experimental/\
agent_loop/single_turn_agent_loop.py", line 67, in run
{CYAN}(AgentLoopWorkerTQ pid=2410){RESET_ALL} ray.exceptions.RayTaskError(EngineDeadError): \
ray::vLLMHttpServer.generate() (pid=3012, ip=10.0.0.5)
{CYAN}(AgentLoopWorkerTQ pid=2410){RESET_ALL} vllm.v1.engine.exceptions.EngineDeadError: EngineCore \
encountered an issue. See stack trace (above) for the root cause.
"""
GENERATION_FAILED_TAIL = """\
(AgentLoopWorkerTQ pid=2410) Error in _run_prompt for uid=3f2a9c
(AgentLoopWorkerTQ pid=2410) Traceback (most recent call last):
(AgentLoopWorkerTQ pid=2410)   File "/venv/lib/python3.11/site-packages/verl/experimental/agent_loop/\
agent_loop.py", line 470, in _run_agent_loop
(AgentLoopWorkerTQ pid=2410) ValueError: the prompt's tools are not registered
"""


def test_a_failed_generation_is_a_crash_even_when_the_run_completes():
    """verl pads the missing samples and trains on (replay_buffer.py:111-113): its figures are not the
    configuration's, so exit 0 with every step is still not ok."""
    complete = GENERATION_FAILED_TAIL + CONSOLE
    status, kind, message = classify_run(0, False, 3, 3, complete)
    assert (status, kind) == (Status.CRASHED, None)
    assert message == (
        "verl: a generation failed, so its step would not train on every sample: "
        "ValueError: the prompt's tools are not registered"
    )
    assert classify_run(None, False, 0, 3, GENERATION_FAILED_TAIL)[0] == Status.CRASHED  # stopped by us
    said = classify_run(1, False, 0, 3, "(AgentLoopWorkerTQ pid=1) Error in _run_prompt: KeyError: 'uid'")[2]
    assert said.endswith("every sample: KeyError: 'uid'")


def test_a_generation_that_failed_of_an_oom_is_a_rollout_oom():
    status, kind, message = classify_run(None, False, 0, 3, GENERATION_OOM_TAIL)
    assert (status, kind) == (Status.OOM, ROLLOUT_OOM)  # the OOM line came from vLLM's engine core
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.20 GiB" in message
