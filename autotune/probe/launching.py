"""What the launchers of a probe share, on one machine (autotune.probe.launcher) and on a Ray cluster
(autotune.probe.cluster): the rank program's path, a rank's environment, the wait's verdict over the ranks'
exit codes, their result files, and the probe's result from what the ranks left (classified by
autotune.probe.classify)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.config.knobs import ProbeConfig, usable_cores
from autotune.probe.classify import classify
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.status import Status

# After one rank fails, the others usually hang in a collective: give them this long to exit on their own.
FAILURE_GRACE_SECONDS = 5.0

__all__ = [
    "FAILURE_GRACE_SECONDS",
    "free_port",
    "kill_group",
    "look",
    "rank_variables",
    "read_json",
    "runner_path",
    "summarize",
]


def runner_path(name: str = "ppo_probe.py") -> Path:
    """The runner program, from the checkout's `runners/` or the installed `autotune.runners` package."""
    return Path(str(resources.files("autotune.runners").joinpath(name)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_variables(
    rank: int, settings: ProbeSettings, port: int, master: str = "127.0.0.1", local_rank: int | None = None
) -> dict[str, str]:
    """What a rank's environment adds to its machine's: torch.distributed's rendezvous (rank 0 at
    `master`:`port`), its slot's GPUs, and on CPU its share of the cores."""
    world_size = settings.world_size
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(settings.gpus_per_node),
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    if settings.visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = settings.visible_devices  # LOCAL_RANK indexes into this slot's GPUs
    if settings.device == "cpu":
        # Split the cores between ranks (and concurrent probes) so a small machine is not oversubscribed.
        threads = settings.threads_per_rank or max(1, usable_cores() // world_size)
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def look(codes: list[int | None], deadline: float, now: float) -> tuple[str | None, float]:
    """One look at the ranks' exit codes: "done", "timeout" or None (wait on), and the deadline, cut to a
    short grace once one rank failed (the others usually hang in a collective then)."""
    if all(code is not None for code in codes):
        return "done", deadline
    if any(code not in (None, 0) for code in codes):
        deadline = min(deadline, now + FAILURE_GRACE_SECONDS)
        return ("done" if now >= deadline else None), deadline
    return ("timeout" if now >= deadline else None), deadline


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summarize(
    config: ProbeConfig,
    settings: ProbeSettings,
    rank_results: list[dict[str, Any] | None],
    exit_codes: list[int | None],
    timed_out: bool,
    wall_seconds: float,
    stderr_tail: str,
    gone: dict[int, str] | None = None,
) -> ProbeResult:
    """The probe's result from its ranks' files and exit codes (`gone`: ranks whose host went away with
    them, on a Ray cluster; see classify)."""
    budget = settings.budget_bytes
    peaks = [r["peak"] for r in rank_results if r and r.get("peak")]
    peak_bytes = max((p["bytes"] for p in peaks), default=0)
    verdict = classify(exit_codes, rank_results, timed_out, peak_bytes, budget, settings.device, gone)
    status = verdict[0]
    result = ProbeResult.classified(
        config,
        settings,
        verdict,
        wall_seconds,
        memory_budget_bytes=budget,
        rank_peaks=peaks,
        peak_memory_bytes=peak_bytes,
        peak_memory_source=peaks[0]["source"] if peaks else "",
    )
    if status != Status.OK:
        result.stderr_tail = stderr_tail
    lead = rank_results[0] if rank_results and rank_results[0] else None
    if lead and lead.get("timing"):
        _fill_timing(result, lead, config, rank_results)
    return result


def _fill_timing(result: ProbeResult, lead: dict[str, Any], config: ProbeConfig, ranks: list) -> None:
    """Throughput from rank 0's wall times: every iteration ends on a barrier, so all ranks agree."""
    timing = lead["timing"]
    iterations = timing["iterations"]
    mean_seconds = sum(iterations) / len(iterations)
    result.iteration_seconds = mean_seconds
    # train_batch_size samples per iteration; their tokens as packed (verl's passes: each rank's share once,
    # in its forward pass), else every sample at prompt + response length, counted over all ranks
    result.samples_per_sec = config.train_batch_size / mean_seconds
    packed = [r["packing"]["forward"]["tokens"] for r in ranks if r and r.get("packing", {}).get("forward")]
    tokens = sum(packed) if len(packed) == len(ranks) else config.train_batch_size * config.sequence_length
    result.tokens_per_sec = tokens / mean_seconds
    result.packing = lead.get("packing") or {}
    result.phase_seconds = {k: sum(v) / len(v) for k, v in timing["phases"].items()}
    result.measured_seconds = sum(iterations)
    result.warmup_seconds = sum(timing.get("warmup", []))
    # Start-up: interpreter, imports, process group, model build — everything but the iterations.
    result.startup_seconds = max(0.0, result.wall_seconds - result.measured_seconds - result.warmup_seconds)
    result.environment = lead.get("environment", {})
    utils = [r["gpu_utilization"] for r in ranks if r and r.get("gpu_utilization") is not None]
    result.gpu_utilization = sum(utils) / len(utils) if utils else None
