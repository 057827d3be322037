"""The Ray actor that hosts one rank of a probe on the node Ray placed it (autotune.probe.cluster.ray_probe).

The rank itself is the same program as on one machine (`runners/ppo_probe.py`), started by the actor as a
child in a process group of its own, with the same job file, result file, exit codes and stderr file: its
peak memory is a plain process's, not a Ray worker's, and one `killpg` ends it with its DataLoader workers.
The rank asks the kernel to kill it when its parent dies, so a Ray worker that dies (its node lost, Ray's
memory monitor, `ray.kill`) takes its rank along. Nothing here imports torch: a Ray worker starts quickly.

Every node needs autotune installed in the Python Ray runs there, as verl's workers need verl.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from autotune.config.knobs import usable_cores
from autotune.probe.conditions import load_average
from autotune.probe.contract import PARENT_VARIABLE
from autotune.probe.launching import free_port, kill_group, read_json, runner_path

__all__ = ["RankHost"]

STDERR_TAIL_CHARS = 4000


class RankHost:
    """One rank on its node: where it is, start it, wait for it, end it and hand back what it left."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.folder: Path | None = None
        self.rank = 0
        self.load_start: float | None = None

    def where(self) -> dict[str, Any]:
        """This node's id and address, a free port on it (rank 0's rendezvous) and its cores."""
        import ray

        return {
            "id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "port": free_port(),
            "cores": usable_cores(),
        }

    def start(self, program: str, job: dict[str, Any], variables: dict[str, str], rank: int) -> None:
        """Start the rank: `program` is the driver's path to it, or (absent here) a runner of that name;
        `job` the probe's job file, with --data's prompts (`prompt_texts`) when it has them."""
        self.rank, self.folder = rank, Path(tempfile.mkdtemp(prefix="autotune-rank-"))
        if "prompt_texts" in job:  # --data's prompts, written here for the rank to read
            prompts = self.folder / "prompts.json"
            prompts.write_text(json.dumps(job.pop("prompt_texts")))
            job = {**job, "settings": {**job["settings"], "prompts_file": str(prompts)}}
        job_path = self.folder / "job.json"
        job_path.write_text(json.dumps(job))
        path = program if Path(program).is_file() else str(runner_path(Path(program).name))
        argv = [sys.executable, path, "--job", str(job_path), "--out", str(self.folder)]
        self.load_start = load_average()
        with open(self.folder / f"stderr.rank{rank}.txt", "wb") as stderr:
            self.proc = subprocess.Popen(
                argv,
                env={**os.environ, **variables, PARENT_VARIABLE: str(os.getpid())},
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                process_group=0,
            )

    def wait(self, seconds: float) -> int | None:
        """The rank's exit code, or None if it is still running after `seconds`."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def finish(self) -> dict[str, Any]:
        """End the rank's process group (finished or not) and hand back its exit code, result and stderr."""
        code = None
        if self.proc is not None:
            kill_group(self.proc.pid)
            code = self.proc.wait()
        folder = self.folder or Path(tempfile.gettempdir())
        path = folder / f"stderr.rank{self.rank}.txt"
        tail = path.read_text(errors="replace")[-STDERR_TAIL_CHARS:] if path.exists() else ""
        left = {
            "code": code,
            "result": read_json(folder / f"result.rank{self.rank}.json"),
            "stderr": tail,
            "load_1m_start": self.load_start,
            "load_1m_end": load_average(),
        }
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        return left
