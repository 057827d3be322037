"""A CPU rank stops itself where its resident set passes the emulated budget (probe.rank.memory_wall),
as a device's allocator fails there, instead of running all its rounds to be judged after them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import pytest

from autotune.probe.contract import OOM_EXIT_CODE
from autotune.probe.rank.memory_wall import over_budget_result, watch_budget
from autotune.units import GIB

# A rank's life in miniature: the watch starts, then the rank takes 256 MiB more than its budget allows and
# would go on for a minute. Only the watch can end it sooner.
RANK = textwrap.dedent(
    """
    import json, sys, time
    from autotune.probe.rank.memory_wall import watch_budget
    from autotune.probe.rank.measure import peak_rss_bytes
    budget_gib = (peak_rss_bytes() + 64 * 2**20) / 2**30
    job = {{"settings": {{"device": "cpu", "memory_budget_gib": budget_gib}}, "out": sys.argv[1]}}
    watch_budget(job, rank={rank})
    held = b"x" * (256 * 2**20)  # written, so resident
    time.sleep(60)
    """
)


@pytest.mark.e2e
def test_a_rank_over_its_budget_stops_with_an_emulated_oom(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", RANK.format(rank=1), str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert run.returncode == OOM_EXIT_CODE, run.stderr
    result = json.loads((tmp_path / "result.rank1.json").read_text())
    assert result["status"] == "oom" and result["oom_kind"] == "emulated"
    assert "passed the emulated budget" in result["message"] and result["peak"]["source"] == "rss"
    assert "rank 1: out of memory: peak" in run.stderr


def test_nothing_is_watched_on_cuda_or_without_a_budget(tmp_path):
    assert (
        watch_budget({"settings": {"device": "cuda", "memory_budget_gib": 1.0}, "out": str(tmp_path)}, 0)
        is None
    )
    assert (
        watch_budget({"settings": {"device": "cpu", "memory_budget_gib": None}, "out": str(tmp_path)}, 0)
        is None
    )


def test_the_result_says_where_the_wall_was():
    result = over_budget_result(int(1.25 * GIB), GIB)
    assert result["peak"]["bytes"] == int(1.25 * GIB)
    assert result["message"].startswith("peak 1.250 GiB passed the emulated budget 1.000 GiB")


def test_a_watch_ended_while_it_reads_writes_nothing(tmp_path, monkeypatch):
    """The rank ended the watch (the timed rounds begin) while it read a peak past the budget: that peak may
    be from after the rounds it watches, so no OOM is written and the process goes on."""
    from autotune.probe.rank import memory_wall

    done = threading.Event()

    def read_then_end() -> int:
        done.set()
        return 2 * GIB

    def stopped(code: int) -> None:
        raise AssertionError(f"the watch stopped the rank (exit {code})")

    monkeypatch.setattr(memory_wall, "peak_rss_bytes", read_then_end)
    monkeypatch.setattr(memory_wall.os, "_exit", stopped)  # what would end the rank ends only this test
    memory_wall._watch(GIB, 0, tmp_path, done)
    assert not list(tmp_path.iterdir())
