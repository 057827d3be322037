"""Start a probe in its own process group (W ranks), enforce a wall-clock timeout, and always return a result.

The tuner and the probe talk through files: a job JSON in, one result JSON per rank out. Ranks are started
directly (not through torchrun) so that they all share one process group that we own: a timeout or a
failure kills the whole group — ranks and their DataLoader workers — with one `killpg`.

Ranks are forked from a warm fork server that has already imported torch and transformers (see
`autotune.probe.forkserver`; AUTOTUNE_FORKSERVER=0 disables it), or, when it is disabled or unavailable,
spawned as fresh processes; either way they behave the same to this module.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autotune.config.knobs import ProbeConfig, usable_cores
from autotune.probe import forkserver
from autotune.probe.conditions import gpu_others, load_average, other_cores
from autotune.probe.contract import PARENT_VARIABLE, ProbeResult, ProbeSettings
from autotune.probe.forkserver import ForkedRank, ForkServerError
from autotune.probe.launching import (
    free_port,
    kill_group,
    look,
    rank_variables,
    read_json,
    runner_path,
    summarize,
)
from autotune.status import Status

POLL_SECONDS = 0.05
STDERR_TAIL_CHARS = 4000

__all__ = ["kill_group", "run_probe", "run_ranks", "runner_path", "summarize"]

log = logging.getLogger(__name__)
Rank = subprocess.Popen | ForkedRank  # both: pid, poll(), wait(), returncode


def _rank_env(rank: int, settings: ProbeSettings, port: int) -> dict[str, str]:
    return {**os.environ, **rank_variables(rank, settings, port)}


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
                env={**env, PARENT_VARIABLE: str(os.getpid())},
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                process_group=0 if not procs else procs[0].pid,
            )
        )
        stderr.close()
    return procs


def _wait(procs: list[Rank], timeout: float, cancel: threading.Event | None) -> bool:
    """Wait for every rank; returns True when the deadline passed. One failed rank starts a short grace."""
    deadline = time.monotonic() + timeout
    while not (cancel is not None and cancel.is_set()):
        verdict, deadline = look([p.poll() for p in procs], deadline, time.monotonic())
        if verdict is not None:
            return verdict == "timeout"
        time.sleep(POLL_SECONDS)
    return False


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
    """Run one built-in probe to completion, timeout or failure, and return its classified result: on this
    machine's ranks, or as Ray actors on the cluster's nodes (`settings.ray_address`). A trainer's own probe
    is its engine's (autotune.trainers.run_probe).

    Setting `cancel` (a second Ctrl-C) kills the probe at once; the caller records it as interrupted.
    """
    if settings.ray_address is not None:
        from autotune.probe.cluster.ray_probe import run_cluster_probe

        return run_cluster_probe(config, settings, program or runner_path(), cancel)
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
        rank_results = [read_json(out_dir / f"result.rank{r}.json") for r in range(settings.world_size)]
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
