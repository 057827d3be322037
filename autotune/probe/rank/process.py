"""What every probe program does for itself as a process, whichever trainer it runs: read its job, write
its result atomically, hand freed memory back on CPU, tell an out-of-memory error from a crash, and die with
its tuner.

    if __name__ == "__main__":
        sys.exit(run_rank(measure))     # measure(job, rank, world_size) -> the rank's result dict

Imported by the programs in `runners/` (in the child), never needed by the tuner itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.probe.contract import MMAP_THRESHOLD, OOM_EXIT_CODE, PARENT_VARIABLE
from autotune.status import Status

__all__ = [
    "HEAP_MMAP_THRESHOLD",
    "die_with_parent",
    "is_out_of_memory",
    "return_freed_memory",
    "run_rank",
    "serve_from_heap",
    "write_result",
]

HEAP_MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: its dynamic rule's cap

Measure = Callable[[dict[str, Any], int, int], dict[str, Any]]


def run_rank(measure: Measure) -> int:
    """One rank of a probe program: `--job JOB.json` in, `--out DIR/result.rank<R>.json` out; the exit code
    is 0 (measured), OOM_EXIT_CODE (out of memory, result written) or a crash's (the exception propagates)."""
    die_with_parent()
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    started = time.time()
    job = {**json.loads(args.job.read_text()), "out": str(args.out)}  # where the rank may write files
    try:
        result = measure(job, rank, world_size)
    except BaseException as exc:
        if not is_out_of_memory(exc):
            raise
        write_result(args.out, rank, oom_result(exc, job["settings"]["device"]))
        print(f"rank {rank}: out of memory: {exc}", file=sys.stderr)
        return OOM_EXIT_CODE
    result["rank_seconds"] = time.time() - started
    write_result(args.out, rank, result)
    return 0


def oom_result(exc: BaseException, device: str) -> dict[str, Any]:
    from autotune.probe.rank.measure import peak_memory

    first_line = str(exc).splitlines()[0] if str(exc) else "out of memory"
    return {
        "status": Status.OOM,
        "oom_kind": "cuda" if device == "cuda" else "host",
        "message": f"{type(exc).__name__}: {first_line}",
        "peak": peak_memory(device, None),
    }


def write_result(out_dir: Path, rank: int, result: dict[str, Any]) -> None:
    """Atomic write, so the parent never reads half a result; each thread writes its own temporary file (the
    budget's watch writes from its own)."""
    path = out_dir / f"result.rank{rank}.json"
    tmp = path.with_name(f"{path.stem}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)


def return_freed_memory() -> None:
    """On CPU the resident set stands in for a device's memory: blocks above 64 KiB get their own mappings, so
    a freed tensor leaves the resident set as it leaves a GPU allocator's live bytes (glibc would otherwise
    keep small freed tensors on its heap, and the peak would count heap fragments, not tensors)."""
    import ctypes

    m_mmap_threshold = -3
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(m_mmap_threshold, MMAP_THRESHOLD)


def serve_from_heap() -> None:
    """Undo `return_freed_memory` for a process's timed rounds: glibc's heap again, with the thresholds its
    own dynamic rule reaches on a process that frees large blocks (mappings from 32 MiB, the heap's top
    trimmed past twice that), so the rounds run at the trainer's own speed (page faults for every freed
    block cost TRL about a fifth of it on CPU)."""
    import ctypes

    m_trim_threshold, m_mmap_threshold = -1, -3
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(m_mmap_threshold, HEAP_MMAP_THRESHOLD)
        libc.mallopt(m_trim_threshold, 2 * HEAP_MMAP_THRESHOLD)


def is_out_of_memory(exc: BaseException) -> bool:
    """By exception type, never by message: torch's allocator OOM or the host's MemoryError."""
    import torch

    return isinstance(exc, (torch.OutOfMemoryError, MemoryError))


def die_with_parent() -> None:
    """If the tuner is killed (even by SIGKILL), take this rank down too instead of leaving an orphan."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    # The parent died before prctl took effect. An orphan goes to the nearest subreaper (Ray's raylet, a
    # container's init), not always to pid 1: the launcher names the parent it expects where it knows it.
    expected = os.environ.get(PARENT_VARIABLE, "")
    if os.getppid() == 1 or (expected.isdigit() and os.getppid() != int(expected)):
        os._exit(1)
