"""How a finished verl run is judged: ok, oom, timeout or crashed, from what the tuner can see of it.

verl never catches an out-of-memory error itself (verl 0.9.1 has no handler for one); it reaches the driver
as a Ray error around the worker's exception, Hydra prints the traceback and the process exits 1
(hydra/_internal/utils.py:293,303). So the evidence is text: the output's tail, matched on specific exception
names and messages, never on vague words such as "memory". A run that exited 0 with all its steps is ok
whatever its output says, unless one of its generations failed: verl's sync trainer then trains on the
samples that remain (see GENERATION_FAILED), so its figures are not the configuration's.
"""

from __future__ import annotations

import re

from autotune.probe.classify import describe_exit
from autotune.probe.verl.metrics import ANSI, RAY_PREFIX, clean_line
from autotune.status import ROLLOUT_OOM, SCORING_OOM, UPDATE_OOM, Status

__all__ = [
    "CUDA_OOM",
    "GENERATION_FAILED",
    "GPUS_REFUSED",
    "HOST_OOM",
    "VLLM_CUMEM_OOM",
    "VLLM_KV_CACHE",
    "classify_run",
    "last_exception",
    "reports_failed_generation",
]

MESSAGE_CHARS = 400

# torch's caching allocator: `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...` (torch
# >= 2.5; before, `torch.cuda.OutOfMemoryError`), and a CUDA API call that failed allocating (`CUDA error:
# out of memory`, cudaErrorMemoryAllocation). Through Ray the class reads `RayTaskError(OutOfMemoryError)` at
# every level (ray/exceptions.py:249 names the dual class after the root cause), and a worker that died in
# its constructor reads `ActorDiedError: ... creation task, ray::WorkerDict.__init__() ...` with the torch
# line inside, which the first patterns find.
CUDA_OOM = re.compile(
    r"torch(?:\.cuda)?\.OutOfMemoryError|CUDA out of memory|CUDA error: out of memory"
    r"|RayTaskError\(OutOfMemoryError\)"
)
# vLLM's sleep-mode allocator (the cumem allocator verl's colocated rollout sleeps and wakes with). Its C
# extension formats every failed CUDA driver call as `CUDA Error: %s at %s:%d` with cuGetErrorString's text
# ("out of memory" for CUDA_ERROR_OUT_OF_MEMORY) and prints it to stderr (vLLM csrc/cumem_allocator.cpp, the
# CUDA_CHECK macro, ll. 62-73 at vllm-project/vllm 0035e224); python_create_and_map raises it as a
# RuntimeError (same file, python_create_and_map), which CuMemAllocator.wake_up logs as "Failed to wake up
# allocator: ..." and re-raises (vllm/device_allocator/cumem.py, CuMemAllocator.wake_up). Capital E: torch's
# own text is `CUDA error: out of memory`. The pool is the rollout engine's, so it is a rollout OOM.
VLLM_CUMEM_OOM = re.compile(r"CUDA Error: out of memory")
# Ray's own memory monitor killing a worker because the *host* ran low (ray/exceptions.py:655-667, the text
# from the raylet). Its class is also called OutOfMemoryError, so it is told apart before the wrapper above.
# Ray < 2.55 says "Task was killed due to the node running low on memory"; Ray >= 2.55 says
# "N worker(s) were killed due to the node running low on memory. <details>" (the raylet's format string
# `%d worker(s) were killed due to the node running low on memory. %s`, in ray 2.60.0's
# ray/core/src/ray/raylet/raylet, from src/ray/raylet/node_manager.cc; the example in Ray's
# doc/source/ray-core/scheduling/ray-oom-prevention.rst). For an actor (verl's WorkerDict, vLLMHttpServer) it
# arrives inside `ActorDiedError` (ray/exceptions.py:456-522 appends the death cause's message) after the
# GCS's "The actor is dead because its worker process has died. Worker exit type: NODE_OUT_OF_MEMORY Worker
# exit detail: " (ray 2.60.0's gcs_server), so only the kill's own words are matched.
HOST_OOM = re.compile(
    r"ray\.exceptions\.OutOfMemoryError|Task was killed due to the node running low on memory"
    r"|worker\(s\) were killed due to the node running low on memory"
)
# vLLM refusing its memory pool at start-up. vLLM is not installed here: these texts are from vLLM's public
# source (vllm/v1/core/kv_cache_utils.py `check_enough_kv_cache_memory`, vllm/v1/worker/gpu_worker.py) and
# have varied between versions ("models's"/"model's", "device"/"device cuda:0", an appended docs URL), so
# only the stable middle of each is matched:
#   ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` ...
#   ValueError: To serve at least one request with the model's max seq len (N), (X GiB KV cache is needed,
#     which is larger than the available KV cache memory (Y GiB). ...
#   ValueError: Free memory on device (A/B GiB) on startup is less than desired GPU memory utilization
#     (U, C GiB). ...
# The last is the pool itself not fitting beside what the colocated trainer holds: the configuration's
# gpu_memory_utilization does not fit, so it is an OOM of the same kind.
VLLM_KV_CACHE = re.compile(
    r"No available memory for the cache blocks"
    r"|KV cache is needed, which is larger than the available KV cache memory"
    r"|on startup is less than desired GPU memory utilization"
)
# verl's resource check before any worker starts (verl/single_controller/ray/base.py:226-241).
GPUS_REFUSED = re.compile(
    r"Total available GPUs (?P<available>[\d.]+) is less than total desired GPUs (?P<desired>\d+)"
)
# A generation that failed: verl's V1 agent loop worker logs `Error in _run_prompt for uid=<uid>` with the
# session's exception when one of a prompt's sessions raised, or `Error in _run_prompt: <e>` when the prompt
# itself failed, and marks the prompt's group "failure" (verl/trainer/ppo/v1/agent_loop_tq.py:133-148, logger
# at ERROR, forwarded by Ray with the `(AgentLoopWorkerTQ pid=N)` prefix). The sync ReplayBuffer then pads
# the missing samples and trains on the rest (trainer.v1.sampler.sync_refill_failed_groups off, its default
# and the probe's: replay_buffer.py:111-113, 330-334), or, with it on, refills the failed prompts in a loop
# that ends only when one succeeds (replay_buffer.py:465-467; verl logs nothing of its own per refill, only
# the next failure). Either way the run no longer measures the configuration.
GENERATION_FAILED = re.compile(r"Error in _run_prompt(?: for uid=\S+|: )")
# A traceback's last line: `module.Name: message`, `RayTaskError(Cause): ...` included.
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception)(?:\([\w.]+\))?(?::|$)")
EXCEPTION_NAME = re.compile(r"(?<![\w.])(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?:\([\w.]+\))?: ")
# A Ray task header, `ray::WorkerDict.actor_rollout_ref_update_actor()` (ray/exceptions.py:347-357).
RAY_TASK = re.compile(r"ray::[\w.]+\(\)")
# verl 0.9.1's training tasks, as Ray names them (`WorkerDict.<role>_<method>`; workers/engine_workers.py:
# ActorRolloutRefWorker.update_actor, compute_log_prob, compute_ref_log_prob; TrainingWorker.train_batch,
# train_mini_batch, infer_batch): while they run, the rollout engine sleeps, its KV cache freed
# (rollout.free_cache_engine, true by default: vllm_async_server.py `sleep`). Updates, then forward passes.
UPDATE_TASK = re.compile(r"_(?:update_actor|update_critic|train_batch|train_mini_batch)\(\)")
SCORING_TASK = re.compile(r"_(?:compute_log_prob|compute_ref_log_prob|compute_values|infer_batch)\(\)")
# The rollout's processes and tasks: verl's vLLM server actor (workers/rollout/vllm_rollout/
# vllm_async_server.py, class vLLMHttpServer), vLLM's engine core process under it (its lines carry
# "(EngineCore_DP0 pid=N)"), and verl's agent loop workers (agent_loop_tq.py, AgentLoopWorkerTQ).
ROLLOUT_TASK = re.compile(r"ray::(?:vLLMHttpServer|AgentLoopWorker\w*)\.")
ROLLOUT_ORIGIN = re.compile(r"\((?:vLLMHttpServer|EngineCore\w*|AgentLoopWorker\w*) pid=")
TORCH_OOM_LINE = re.compile(r"torch(?:\.cuda)?\.OutOfMemoryError|CUDA (?:error: )?out of memory")


def _lines(tail: str) -> list[tuple[str, str]]:
    """(the line as the process printed it, its Ray prefixes) of every non-empty line of the output."""
    found = []
    for raw in tail.splitlines():
        line = clean_line(raw)
        if line:
            found.append((line, _origin(raw)))
    return found


def _origin(raw: str) -> str:
    """The Ray prefixes a forwarded line carries, `(vLLMHttpServer pid=1) (EngineCore_DP0 pid=2) `."""
    text = ANSI.sub("", raw).rsplit("\r", 1)[-1].lstrip()
    prefixes = ""
    while match := RAY_PREFIX.match(text):
        prefixes += match.group(0)
        text = text[match.end() :]
    return prefixes


def _texts(lines: list[tuple[str, str]]) -> list[str]:
    return [line for line, _ in lines]


def _short(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def last_exception(tail: str) -> str | None:
    """The last exception line in the output: the innermost cause of a (Ray-nested) traceback."""
    return next((line for line in reversed(_texts(_lines(tail))) if EXCEPTION_LINE.match(line)), None)


def reports_failed_generation(line: str) -> bool:
    """Whether one output line is verl's report of a failed generation (GENERATION_FAILED)."""
    return GENERATION_FAILED.search(line) is not None


def _from_exception(line: str) -> str:
    """`line` from its exception name on: a logger's "ERROR <date> [core.py:708]" before it is noise."""
    match = EXCEPTION_NAME.search(line)
    return line[match.start() :] if match else line


def _first_match(lines: list[str], pattern: re.Pattern[str]) -> int | None:
    return next((i for i, line in enumerate(lines) if pattern.search(line)), None)


def _task(lines: list[str], before: int) -> str | None:
    """The innermost Ray task named up to line `before`: where the error was raised."""
    tasks = [m.group(0) for line in lines[: before + 1] for m in RAY_TASK.finditer(line)]
    return tasks[-1] if tasks else None


def _cuda_kind(task: str | None, origin: str) -> str:
    """UPDATE_OOM or SCORING_OOM when raised in a training task, ROLLOUT_OOM in the rollout's, else cuda."""
    if task and UPDATE_TASK.search(task):
        return UPDATE_OOM
    if task and SCORING_TASK.search(task):
        return SCORING_OOM
    if (task and ROLLOUT_TASK.search(task)) or ROLLOUT_ORIGIN.search(origin):
        return ROLLOUT_OOM
    return "cuda"


def _cuda_oom(lines: list[tuple[str, str]]) -> tuple[str, str]:
    """(oom_kind, message) of a CUDA OOM (see `_cuda_kind`)."""
    texts = _texts(lines)
    # Prefer torch's own line: it says how much was asked and how much was free.
    torch_line = _first_match(texts, TORCH_OOM_LINE)
    index = torch_line if torch_line is not None else _first_match(texts, CUDA_OOM)
    assert index is not None
    task = _task(texts, index)
    where = f" in {task}" if task else ""
    return _cuda_kind(task, lines[index][1]), _short(
        f"CUDA out of memory{where}: {_from_exception(texts[index])}"
    )


def _oom(lines: list[tuple[str, str]]) -> tuple[str, str] | None:
    """(oom_kind, message) when the output shows an out-of-memory error, else None."""
    texts = _texts(lines)
    index = _first_match(texts, VLLM_KV_CACHE)
    if index is not None:
        return "vllm_kv_cache", _short(
            f"vLLM could not reserve its KV cache: {_from_exception(texts[index])}"
        )
    index = _first_match(texts, HOST_OOM)
    if index is not None:
        return "host", _short(
            f"Ray's memory monitor killed a worker (host memory): {_from_exception(texts[index])}"
        )
    index = _first_match(texts, VLLM_CUMEM_OOM)
    if index is not None:
        found = VLLM_CUMEM_OOM.search(texts[index])
        assert found is not None  # _first_match found it on this line
        said = texts[index][found.start() :]  # not a logger's date and file
        return ROLLOUT_OOM, _short(
            f"vLLM's sleep-mode allocator ran out of GPU memory (the rollout engine mapping its memory "
            f"beside the trainer's): {said}"
        )
    if _first_match(texts, CUDA_OOM) is not None:
        return _cuda_oom(lines)
    return None


def _generation_failure(lines: list[str]) -> str | None:
    """The message for verl's first failed generation (GENERATION_FAILED), with the innermost exception
    of its traceback; None when no generation failed."""
    index = _first_match(lines, GENERATION_FAILED)
    if index is None:
        return None
    after = lines[index + 1 :]
    end = _first_match(after, GENERATION_FAILED)
    block = after[:end] if end is not None else after
    cause = next((line for line in reversed(block) if EXCEPTION_LINE.match(line)), None)
    if cause is None:  # `Error in _run_prompt: <e>` says it on the line itself
        cause = GENERATION_FAILED.split(lines[index], maxsplit=1)[-1].strip()
    return _short(
        "verl: a generation failed, so its step would not train on every sample"
        + (f": {cause}" if cause else "")
    )


def _gpus_refused(lines: list[str]) -> str | None:
    index = _first_match(lines, GPUS_REFUSED)
    if index is None:
        return None
    match = GPUS_REFUSED.search(lines[index])
    assert match is not None
    return (
        f"verl found {match['available']} GPUs in its Ray cluster but needs {match['desired']} "
        "(trainer.n_gpus_per_node × trainer.nnodes): check CUDA_VISIBLE_DEVICES and that this is a GPU "
        "machine"
    )


def classify_run(
    exit_code: int | None, timed_out: bool, steps_seen: int, steps_expected: int, tail: str
) -> tuple[str, str | None, str]:
    """Decide (status, oom_kind, message) for a finished verl run, as `autotune.probe.classify.classify` does
    for the built-in probe. Pure, so it is tested on text alone.

    Order: a complete run that exited 0 is ok, unless a generation failed; else an OOM in the output wins
    (a worker's OOM leaves the driver waiting on it, a failed generation's cause is often one); else a failed
    generation is a crash (the backend stops such a run early); else the timeout (we killed it); else a
    crash, explained by verl's GPU refusal or the last exception line; else exit 0 short of its steps is a
    crash too.
    """
    lines = _lines(tail)
    texts = _texts(lines)
    generation = _generation_failure(texts)
    if exit_code == 0 and not timed_out and steps_seen >= steps_expected and generation is None:
        return Status.OK, None, ""
    oom = _oom(lines)
    if oom is not None:
        return Status.OOM, oom[0], oom[1]
    if generation is not None:
        return Status.CRASHED, None, generation
    if timed_out:
        return (
            Status.TIMEOUT,
            None,
            f"verl exceeded its wall-clock timeout after {steps_seen} of {steps_expected} steps; "
            "the process group was killed",
        )
    refused = _gpus_refused(texts)
    if refused is not None:
        return Status.CRASHED, None, refused
    if exit_code != 0:
        # The innermost exception, else the last line (python's own "No module named verl" is not one)
        cause = last_exception(tail) or (texts[-1] if texts else None)
        return (
            Status.CRASHED,
            None,
            _short(f"verl: {describe_exit(exit_code)}" + (f": {cause}" if cause else "")),
        )
    return Status.CRASHED, None, f"verl exited 0 after {steps_seen} of {steps_expected} steps"
