import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ISSUE_EXAMPLE = [
    "--set",
    "train_batch_size=16",
    "--set",
    "rollout_batch_size=8",
    "--set",
    "micro_batch_size=4",
    "--set",
    "gradient_accumulation_steps=2",
    "--set",
    "max_prompt_length=32",
    "--set",
    "max_response_length=16",
]


def run_cli(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real command line, in a child process, as a user runs it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=REPO,
    )


def probe_json(*args: str, timeout: float = 600) -> tuple[int, dict]:
    proc = run_cli("probe", "--device", "cpu", "--json", *args, timeout=timeout)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture
def cli():
    return run_cli
