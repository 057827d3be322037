"""How a finished verl run is judged: ok, oom, timeout or crashed, from what the tuner can see of it.

verl never catches an out-of-memory error itself (verl 0.9.1 has no handler for one); it reaches the driver
as a Ray error around the worker's exception, Hydra prints the traceback and the process exits 1
(hydra/_internal/utils.py:293,303). So the evidence is text: the output's tail, matched on specific exception
names and messages, never on vague words such as "memory". A run that exited 0 with all its steps is ok
whatever its output says.
"""

from __future__ import annotations

import re

from autotune.probe.classify import describe_exit
from autotune.probe.verl.metrics import clean_line
from autotune.status import SCORING_OOM, UPDATE_OOM, Status

__all__ = ["CUDA_OOM", "GPUS_REFUSED", "HOST_OOM", "VLLM_KV_CACHE", "classify_run", "last_exception"]

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
# Ray's own memory monitor killing a worker because the *host* ran low (ray/exceptions.py:655-667, the text
# from the raylet). Its class is also called OutOfMemoryError, so it is told apart before the wrapper above.
HOST_OOM = re.compile(
    r"ray\.exceptions\.OutOfMemoryError|Task was killed due to the node running low on memory"
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
TORCH_OOM_LINE = re.compile(r"torch(?:\.cuda)?\.OutOfMemoryError|CUDA (?:error: )?out of memory")


def _lines(tail: str) -> list[str]:
    return [line for line in (clean_line(raw) for raw in tail.splitlines()) if line]


def _short(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def last_exception(tail: str) -> str | None:
    """The last exception line in the output: the innermost cause of a (Ray-nested) traceback."""
    return next((line for line in reversed(_lines(tail)) if EXCEPTION_LINE.match(line)), None)


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


def _cuda_oom(lines: list[str]) -> tuple[str, str]:
    """(oom_kind, message): `UPDATE_OOM` or `SCORING_OOM` when raised in a training task, else "cuda"."""
    # Prefer torch's own line: it says how much was asked and how much was free.
    torch_line = _first_match(lines, TORCH_OOM_LINE)
    index = torch_line if torch_line is not None else _first_match(lines, CUDA_OOM)
    assert index is not None
    task = _task(lines, index)
    kind = "cuda"
    if task and UPDATE_TASK.search(task):
        kind = UPDATE_OOM
    elif task and SCORING_TASK.search(task):
        kind = SCORING_OOM
    where = f" in {task}" if task else ""
    return kind, _short(f"CUDA out of memory{where}: {_from_exception(lines[index])}")


def _oom(lines: list[str]) -> tuple[str, str] | None:
    """(oom_kind, message) when the output shows an out-of-memory error, else None."""
    index = _first_match(lines, VLLM_KV_CACHE)
    if index is not None:
        return "vllm_kv_cache", _short(
            f"vLLM could not reserve its KV cache: {_from_exception(lines[index])}"
        )
    index = _first_match(lines, HOST_OOM)
    if index is not None:
        return "host", _short(
            f"Ray's memory monitor killed a worker (host memory): {_from_exception(lines[index])}"
        )
    if _first_match(lines, CUDA_OOM) is not None:
        return _cuda_oom(lines)
    return None


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

    Order: a complete run that exited 0 is ok; else an OOM in the output wins over a timeout (a worker's OOM
    leaves the driver waiting on it); else the timeout (we killed it); else a crash, explained by verl's GPU
    refusal or the last exception line; else exit 0 short of its steps is a crash too.
    """
    if exit_code == 0 and not timed_out and steps_seen >= steps_expected:
        return Status.OK, None, ""
    lines = _lines(tail)
    oom = _oom(lines)
    if oom is not None:
        return Status.OOM, oom[0], oom[1]
    if timed_out:
        return (
            Status.TIMEOUT,
            None,
            f"verl exceeded its wall-clock timeout after {steps_seen} of {steps_expected} steps; "
            "the process group was killed",
        )
    refused = _gpus_refused(lines)
    if refused is not None:
        return Status.CRASHED, None, refused
    if exit_code != 0:
        # The innermost exception, else the last line (python's own "No module named verl" is not one)
        cause = last_exception(tail) or (lines[-1] if lines else None)
        return (
            Status.CRASHED,
            None,
            _short(f"verl: {describe_exit(exit_code)}" + (f": {cause}" if cause else "")),
        )
    return Status.CRASHED, None, f"verl exited 0 after {steps_seen} of {steps_expected} steps"
