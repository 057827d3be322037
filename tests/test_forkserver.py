"""Warm start: ranks forked from the fork server behave as fresh processes do; anything wrong falls back."""

import json
import os
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from autotune.config.knobs import ProbeConfig
from autotune.probe import forkserver
from autotune.probe.contract import ProbeSettings
from autotune.probe.launcher import run_probe
from tests.conftest import ALL_CORES

pytestmark = pytest.mark.e2e  # starts processes

FAKES = Path(__file__).parent / "fake_runners"
ISSUE_EXAMPLE = ProbeConfig(
    train_batch_size=16,
    rollout_batch_size=8,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    max_prompt_length=32,
    max_response_length=16,
)
TINY = ProbeSettings(model="tiny-llama", iterations=1, timeout_seconds=300)
FAST = ProbeSettings(timeout_seconds=60)

# A fake runner that reports ok, and what it found about itself in FAKE_SEEN_DIR/seen.rank<R>.json.
OK_PROGRAM = """
import json, os, sys, threading
from pathlib import Path

out = Path(sys.argv[sys.argv.index("--out") + 1])
rank = os.environ["RANK"]
seen = {
    "torch_preloaded": "torch" in sys.modules,
    "ppid": os.getppid(), "pid": os.getpid(), "pgid": os.getpgid(0),
    "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT", "OMP_NUM_THREADS")},
    "argv": sys.argv, "cwd": os.getcwd(), "python_threads": threading.active_count(),
    "cpus": sorted(os.sched_getaffinity(0)),
}
if seen["torch_preloaded"]:
    import torch
    seen["cuda_initialized"] = torch.cuda.is_initialized()
(Path(os.environ["FAKE_SEEN_DIR"]) / f"seen.rank{rank}.json").write_text(json.dumps(seen))
result = {"status": "ok", "peak": {"bytes": 1, "source": "rss"}}
(out / f"result.rank{rank}.json").write_text(json.dumps(result))
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _program(tmp_path: Path, body: str, name: str = "program.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _seen_by(tmp_path: Path, monkeypatch) -> tuple[str, dict]:
    """Run OK_PROGRAM as a one-rank probe: its status, and what the rank saw."""
    seen = tmp_path / "seen"
    seen.mkdir(exist_ok=True)
    (seen / "seen.rank0.json").unlink(missing_ok=True)
    monkeypatch.setenv("FAKE_SEEN_DIR", str(seen))
    result = run_probe(ProbeConfig(), FAST, program=_program(tmp_path, OK_PROGRAM))
    return result.status, json.loads((seen / "seen.rank0.json").read_text())


@pytest.fixture
def server(monkeypatch) -> forkserver.ForkServer:
    """The tuner's server, warm; a test that kills it does not cost the following tests their warm start."""
    monkeypatch.delenv(forkserver.SWITCH, raising=False)
    monkeypatch.setattr(forkserver, "_starts", 0)
    live = forkserver.get() or forkserver.get()  # a dead one is dropped by the first call
    assert live is not None and live.alive
    return live


def test_server_is_warm_single_threaded_and_never_touched_cuda(server, tmp_path, monkeypatch):
    assert server.info["ready"] and server.info["os_threads"] == 1 and server.info["python_threads"] == 1
    assert server.info["cuda_initialized"] is False
    before = forkserver.ForkServer.forked_total
    status, seen = _seen_by(tmp_path, monkeypatch)
    assert status == "ok" and forkserver.ForkServer.forked_total == before + 1
    assert seen["torch_preloaded"] and seen["cuda_initialized"] is False
    assert seen["ppid"] == server.pid and seen["pgid"] == seen["pid"]  # rank 0 leads the probe's group
    assert seen["env"]["RANK"] == "0" and seen["env"]["WORLD_SIZE"] == "1" and seen["env"]["OMP_NUM_THREADS"]
    assert seen["argv"][0] == str(tmp_path / "program.py") and seen["argv"][1] == "--job"
    assert seen["cwd"] == os.getcwd() and seen["python_threads"] == 1


def test_switch_off_spawns_fresh_processes(tmp_path, monkeypatch):
    monkeypatch.setenv(forkserver.SWITCH, "0")
    assert forkserver.get() is None
    before = forkserver.ForkServer.forked_total
    status, seen = _seen_by(tmp_path, monkeypatch)
    assert status == "ok" and forkserver.ForkServer.forked_total == before
    assert seen["ppid"] == os.getpid() and not seen["torch_preloaded"]


def test_issue_example_forked_measures_like_a_fresh_process(server, monkeypatch):
    before = forkserver.ForkServer.forked_total
    forked = run_probe(ISSUE_EXAMPLE, TINY)
    assert forked.status == "ok", forked.message + forked.stderr_tail
    assert forkserver.ForkServer.forked_total == before + 1
    assert forked.samples_per_sec > 0 and forked.tokens_per_sec > 0 and forked.measured_seconds > 0
    assert set(forked.phase_seconds) == {"rollout", "scoring", "advantages", "update"}
    assert forked.peak_memory_source == "rss" and forked.environment["torch"]
    assert 0 < forked.startup_seconds < forked.wall_seconds

    monkeypatch.setenv(forkserver.SWITCH, "0")
    # A spawning process's own high-water mark must not reach the rank's peak. ru_maxrss carries it over an
    # exec: in a long test session the worker held 800 MiB, and fresh ranks read that instead of their ~570.
    spawner = bytearray(b"\1") * (1 << 30)  # 1 GiB, every page written: resident
    fresh = run_probe(ISSUE_EXAMPLE, TINY)
    del spawner
    assert fresh.status == "ok" and forkserver.ForkServer.forked_total == before + 1
    # A forked rank starts from the server's resident pages, as a fresh one from its own imports (+2-3%).
    seen = {name: r.rank_peaks for name, r in (("forked", forked), ("fresh", fresh))}
    assert forked.peak_memory_bytes == pytest.approx(fresh.peak_memory_bytes, rel=0.06), seen


def test_two_gloo_ranks_share_one_group(server):
    before = forkserver.ForkServer.forked_total
    result = run_probe(ISSUE_EXAMPLE, ProbeSettings(model="tiny-llama", world_size=2, iterations=1))
    assert result.status == "ok", result.message + result.stderr_tail
    assert forkserver.ForkServer.forked_total == before + 2
    assert len(result.rank_peaks) == 2 and result.samples_per_sec > 0


def test_hang_ends_as_timeout_and_leaves_no_process(server, tmp_path, monkeypatch):
    pids_file = tmp_path / "pids.txt"
    monkeypatch.setenv("FAKE_PIDS_FILE", str(pids_file))
    before, started = forkserver.ForkServer.forked_total, time.monotonic()
    result = run_probe(
        ProbeConfig(), ProbeSettings(world_size=2, timeout_seconds=3), program=FAKES / "hang.py"
    )
    assert result.status == "timeout" and time.monotonic() - started < 3 + 10
    assert forkserver.ForkServer.forked_total == before + 2
    pids = [int(line) for line in pids_file.read_text().split()]
    assert len(pids) == 4
    time.sleep(0.2)
    assert not [pid for pid in pids if _alive(pid)]
    assert server.alive


def test_crash_ends_as_crashed_with_the_programs_traceback(server):
    before = forkserver.ForkServer.forked_total
    result = run_probe(ProbeConfig(), FAST, program=FAKES / "crash.py")
    assert forkserver.ForkServer.forked_total == before + 1
    assert result.status == "crashed" and "exit code 1" in result.message
    assert "loading the model" in result.stderr_tail and "probe exploded on purpose" in result.stderr_tail
    assert "Traceback" in result.stderr_tail and "runpy" not in result.stderr_tail


@pytest.mark.parametrize(
    ("body", "message"),
    [("raise SystemExit(3)", "exit code 3"), ("os.kill(os.getpid(), signal.SIGTERM)", "killed by SIGTERM")],
)
def test_exit_codes_are_the_programs(server, tmp_path, body, message):
    program = _program(tmp_path, f"import os, signal\n{body}\n")
    result = run_probe(ProbeConfig(), FAST, program=program)
    assert result.status == "crashed" and message in result.message


def test_server_dying_mid_probe_then_fallback_then_a_new_server(server, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SERVER_PID", str(server.pid))
    killer = _program(
        tmp_path,
        "import os, signal, time\n"
        "os.kill(int(os.environ['FAKE_SERVER_PID']), signal.SIGKILL)\n"
        "time.sleep(60)\n",
        "killer.py",
    )
    started = time.monotonic()
    result = run_probe(ProbeConfig(), FAST, program=killer)
    assert time.monotonic() - started < 20  # the rank died with the server: no waiting for the timeout
    assert result.status == "crashed" and "SIGKILL" in result.message
    assert result.infrastructure and "fork server exited during the probe" in result.message
    assert "fork server exited" in result.stderr_tail
    assert not server.alive

    before = forkserver.ForkServer.forked_total
    status, seen = _seen_by(tmp_path, monkeypatch)
    assert status == "ok" and forkserver.ForkServer.forked_total == before and seen["ppid"] == os.getpid()

    status, seen = _seen_by(tmp_path, monkeypatch)
    assert status == "ok" and forkserver.ForkServer.forked_total == before + 1
    assert seen["ppid"] not in (server.pid, os.getpid())


def test_a_server_started_from_a_probe_thread_outlives_it(monkeypatch):
    """A study probes from its own threads, and re-measures and gains after they end: the server must not
    die with the thread that asked for it (PR_SET_PDEATHSIG follows the thread that started a process)."""
    monkeypatch.delenv(forkserver.SWITCH, raising=False)
    monkeypatch.setattr(forkserver, "_starts", 0)
    forkserver.shutdown()
    found: list[forkserver.ForkServer | None] = []
    asking = threading.Thread(target=lambda: found.append(forkserver.get()))
    asking.start()
    asking.join()
    (started,) = found
    assert started is not None
    time.sleep(0.5)  # the signal, were it sent at the thread's end, has been delivered by now
    assert started.alive and forkserver.get() is started


def test_a_forked_rank_has_the_cores_of_the_thread_that_asked(server, tmp_path, monkeypatch):
    """As a fresh process started from the asking thread would: the server has the cores of the thread that
    started it, and a thread's cores can change (the tests pin and widen theirs)."""
    everything = ALL_CORES  # this process's cores before the test run pinned its threads
    if len(everything) < 2:
        pytest.skip("needs two cores to tell the server's from the asking thread's")
    served = set(psutil.Process(server.pid).cpu_affinity() or [])
    asked = [core for core in everything if core not in served] or everything[:1]
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, asked)
    try:
        status, seen = _seen_by(tmp_path, monkeypatch)
    finally:
        os.sched_setaffinity(0, mine)
    assert status == "ok" and seen["ppid"] == server.pid and seen["cpus"] == asked


def test_shutdown_takes_the_server_and_its_ranks_down(server, tmp_path):
    sleeper = _program(tmp_path, "import time\ntime.sleep(60)\n")
    rank = server.fork([str(sleeper)], dict(os.environ), tmp_path / "stderr.txt", pgid=0)
    assert _alive(rank.pid) and psutil.Process(rank.pid).ppid() == server.pid
    forkserver.shutdown()
    assert server.proc.returncode is not None
    time.sleep(0.2)
    assert not _alive(rank.pid)


def test_a_server_that_cannot_start_means_fresh_processes(tmp_path, monkeypatch):
    monkeypatch.delenv(forkserver.SWITCH, raising=False)
    monkeypatch.setattr(forkserver, "_starts", 0)
    forkserver.shutdown()
    broken = _program(tmp_path, "import sys\nsys.exit('no server today')\n", "broken.py")
    with pytest.raises(forkserver.ForkServerError, match="did not start"):
        forkserver.ForkServer(broken)
    monkeypatch.setattr(forkserver, "server_program", lambda: broken)
    before = forkserver.ForkServer.forked_total
    status, seen = _seen_by(tmp_path, monkeypatch)
    assert status == "ok" and forkserver.ForkServer.forked_total == before and seen["ppid"] == os.getpid()
    assert forkserver.get() is None  # and it is not tried again for every probe
