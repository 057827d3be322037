"""Start a probe in its own process group (W ranks), enforce a wall-clock timeout, and always return a result.

The tuner and the probe talk through files: a job JSON in, one result JSON per rank out. Ranks are started
directly (not through torchrun) so that they all share one process group that we own: a timeout or a
failure kills the whole group — ranks and their DataLoader workers — with one `killpg`.

Ranks are forked from a warm fork server that has already imported torch and transformers (see
`autotune.probe.forkserver`; AUTOTUNE_FORKSERVER=0 disables it), or, when it is disabled or unavailable,
spawned as fresh processes; either way they behave the same to this module.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.config.knobs import ProbeConfig, usable_cores
from autotune.probe import forkserver
from autotune.probe.classify import classify
from autotune.probe.conditions import gpu_others, load_average, other_cores
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.probe.forkserver import ForkedRank, ForkServerError
from autotune.status import Status
from autotune.units import GIB

# After one rank fails, the others usually hang in a collective: give them this long to exit on their own.
FAILURE_GRACE_SECONDS = 5.0
POLL_SECONDS = 0.05
STDERR_TAIL_CHARS = 4000

__all__ = ["kill_group", "run_probe", "run_ranks", "runner_path", "summarize"]

log = logging.getLogger(__name__)
Rank = subprocess.Popen | ForkedRank  # both: pid, poll(), wait(), returncode


def runner_path(name: str = "ppo_probe.py") -> Path:
    """The runner program, from the checkout's `runners/` or the installed `autotune.runners` package."""
    return Path(str(resources.files("autotune.runners").joinpath(name)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_env(rank: int, settings: ProbeSettings, port: int) -> dict[str, str]:
    world_size = settings.world_size
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    if settings.visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = settings.visible_devices  # LOCAL_RANK indexes into this slot's GPUs
    if settings.device == "cpu":
        # Split the cores between ranks (and concurrent probes) so a small machine is not oversubscribed.
        threads = settings.threads_per_rank or max(1, usable_cores() // world_size)
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _spawn_ranks(
    job_path: Path,
    out_dir: Path,
    settings: ProbeSettings,
    program: Path,
    server: forkserver.ForkServer | None = None,
    python: str = sys.executable,
) -> list[Rank]:
    port = free_port()
    argv = [str(program), "--job", str(job_path), "--out", str(out_dir)]
    ranks = range(settings.world_size)
    envs = [_rank_env(rank, settings, port) for rank in ranks]
    logs = [out_dir / f"stderr.rank{rank}.txt" for rank in ranks]
    forked = _fork_ranks(server, argv, envs, logs) if server else None
    return [*forked] if forked else [*_popen_ranks(python, argv, envs, logs)]


def _fork_ranks(
    server: forkserver.ForkServer, argv: list[str], envs: list[dict[str, str]], logs: list[Path]
) -> list[ForkedRank] | None:
    """Fork the ranks from the warm server, rank 0 leading their group; None: spawn them afresh instead."""
    ranks: list[ForkedRank] = []
    try:
        for env, stderr in zip(envs, logs, strict=True):
            ranks.append(server.fork(argv, env, stderr, pgid=ranks[0].pid if ranks else 0))
    except ForkServerError as exc:
        log.debug("%s; spawning this probe's ranks as fresh processes", exc)
        if ranks:
            kill_group(ranks[0].pid)
        return None
    return ranks


def _popen_ranks(
    python: str, argv: list[str], envs: list[dict[str, str]], logs: list[Path]
) -> list[subprocess.Popen]:
    procs: list[subprocess.Popen] = []
    for env, path in zip(envs, logs, strict=True):
        stderr = open(path, "wb")  # noqa: SIM115 - closed by the child's exit
        # Own process group, not the terminal's: Ctrl-C reaches the tuner, not the probe; killpg reaches all.
        procs.append(
            subprocess.Popen(
                [python, *argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                process_group=0 if not procs else procs[0].pid,
            )
        )
        stderr.close()
    return procs


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _wait(procs: list[Rank], timeout: float, cancel: threading.Event | None) -> bool:
    """Wait for every rank; returns True when the deadline passed. One failed rank starts a short grace."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        if all(code is not None for code in codes) or (cancel is not None and cancel.is_set()):
            return False
        if any(code not in (None, 0) for code in codes):
            deadline = min(deadline, time.monotonic() + FAILURE_GRACE_SECONDS)
            if time.monotonic() >= deadline:
                return False
        elif time.monotonic() >= deadline:
            return True
        time.sleep(POLL_SECONDS)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _stderr_tail(out_dir: Path, world_size: int) -> str:
    parts = []
    for rank in range(world_size):
        path = out_dir / f"stderr.rank{rank}.txt"
        text = path.read_text(errors="replace") if path.exists() else ""
        if text.strip():
            parts.append(f"[rank {rank}] {text[-STDERR_TAIL_CHARS:]}")
    return "\n".join(parts)[-STDERR_TAIL_CHARS:]


def run_probe(
    config: ProbeConfig,
    settings: ProbeSettings,
    program: Path | None = None,
    cancel: threading.Event | None = None,
) -> ProbeResult:
    """Run one probe to completion, timeout or failure, and return its classified result.

    Setting `cancel` (a second Ctrl-C) kills the probe at once; the caller records it as interrupted.
    """
    if settings.engine == "verl":
        from autotune.probe.verl.backend import run_verl_probe

        return run_verl_probe(config, settings, cancel)
    if settings.engine == "trl":
        from autotune.probe.trl import trl_job, trl_python

        program = runner_path("trl_probe.py")
        return run_ranks(config, settings, program, cancel, trl_python(settings), trl_job(config, settings))
    return run_ranks(config, settings, program or runner_path(), cancel)


def run_ranks(
    config: ProbeConfig,
    settings: ProbeSettings,
    program: Path,
    cancel: threading.Event | None = None,
    python: str | None = None,
    job: dict[str, Any] | None = None,
) -> ProbeResult:
    """Run `program`'s ranks with `python` (default this interpreter, forked from the warm server) on a job
    of the config, the settings and `job`'s entries, and classify what they leave."""
    with tempfile.TemporaryDirectory(prefix="autotune-probe-") as tmp:
        out_dir = Path(tmp)
        job_path = out_dir / "job.json"
        job_path.write_text(
            json.dumps({"config": config.to_dict(), "settings": asdict(settings), **(job or {})})
        )
        own_python = python in (None, sys.executable)
        server = forkserver.get() if own_python else None  # started once per tuner, before the clock
        load_start, gpus = (
            load_average(),
            gpu_others(settings.visible_devices) if settings.device == "cuda" else None,
        )
        started = time.monotonic()
        procs = _spawn_ranks(job_path, out_dir, settings, program, server, python or sys.executable)
        forked = [p for p in procs if isinstance(p, ForkedRank)]
        try:
            timed_out = _wait(procs, settings.timeout_seconds, cancel)
        finally:
            kill_group(procs[0].pid)  # also reaps DataLoader workers and anything a rank left behind
            for proc in procs:
                proc.wait()
        wall = time.monotonic() - started
        rank_results = [_read_json(out_dir / f"result.rank{r}.json") for r in range(settings.world_size)]
        # A rank we killed after the deadline has a meaningless exit code: only the timeout counts then.
        codes = [p.returncode for p in procs]
        result = summarize(
            config, settings, rank_results, codes, timed_out, wall, _stderr_tail(out_dir, len(procs))
        )
        result.environment = {
            **result.environment,
            "load": {
                "other_cores": other_cores([r.get("cpu") if r else None for r in rank_results]),
                "cores": usable_cores(),
                "load_1m_start": load_start,
                "load_1m_end": load_average(),
                **({"gpus": gpus} if gpus is not None else {}),
            },
        }
        if result.status == Status.CRASHED and server is not None and not server.alive and procs[0] in forked:
            # The fork server died (killed, or out of memory itself) and its ranks with it: no verdict on
            # the configuration. The next probe gets a new server.
            result.infrastructure = True
            result.message = f"the fork server exited during the probe and took its ranks: {result.message}"
        return result


def summarize(
    config: ProbeConfig,
    settings: ProbeSettings,
    rank_results: list[dict[str, Any] | None],
    exit_codes: list[int | None],
    timed_out: bool,
    wall_seconds: float,
    stderr_tail: str,
) -> ProbeResult:
    budget = int(settings.memory_budget_gib * GIB) if settings.memory_budget_gib else None
    peaks = [r["peak"] for r in rank_results if r and r.get("peak")]
    peak_bytes = max((p["bytes"] for p in peaks), default=0)
    status, oom_kind, message = classify(
        exit_codes, rank_results, timed_out, peak_bytes, budget, settings.device
    )
    result = ProbeResult(
        status=status,
        oom_kind=oom_kind,
        message=message,
        memory_budget_bytes=budget,
        wall_seconds=wall_seconds,
        world_size=settings.world_size,
        device=settings.device,
        config=config.to_dict(),
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
