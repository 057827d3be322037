"""The verl backend's pieces that need no process (fast tier): the short run's isolation and sampler keys, the
output watch that stops a run whose generation failed, and where the probe's folder (and its Ray) goes."""

from __future__ import annotations

from pathlib import Path

from autotune.probe.verl import backend
from autotune.probe.verl.backend import LogWatch
from autotune.probe.verl.verl_run import RAY_DIR, short_run_overrides


def test_the_short_run_starts_its_own_ray_inside_the_probes_folder(tmp_path):
    keys = short_run_overrides(3, tmp_path)
    assert keys["+ray_kwargs.ray_init.address"] == "local"  # never a cluster `ray start` recorded
    assert keys["+ray_kwargs.ray_init._temp_dir"] == str(tmp_path / RAY_DIR)
    assert keys["trainer.v1.sampler.sync_refill_failed_groups"] is False  # no refill loop


def test_the_output_watch_sees_a_failed_generation_once_its_line_is_whole(tmp_path, monkeypatch):
    log = tmp_path / "verl.log"
    watch = LogWatch(log)
    watch.poll()  # no file yet
    log.write_bytes(
        b"(TaskRunnerV1 pid=1) step:1 - timing_s/step:1.0\n(AgentLoopWorkerTQ pid=2) Error in _run"
    )
    watch.poll()
    assert watch.failed_at is None
    with log.open("ab") as more:
        more.write(b"_prompt for uid=3f2a9c\n(AgentLoopWorkerTQ pid=2) Traceback (most recent call last):\n")
    watch.poll()
    assert watch.failed_at is not None and not watch.stop_now()  # its traceback still has time to arrive
    monkeypatch.setattr(backend, "GENERATION_GRACE_SECONDS", 0.0)
    assert watch.stop_now()


def test_an_ordinary_run_is_never_stopped(tmp_path):
    log = tmp_path / "verl.log"
    log.write_text("Error in something else\nValueError: _run_prompt is a name\nstep:1 - a:1\n")
    watch = LogWatch(log)
    watch.poll()
    assert watch.failed_at is None and not watch.stop_now()


def test_the_probes_folder_moves_to_tmp_when_rays_sockets_would_not_fit(monkeypatch):
    monkeypatch.setattr(backend.tempfile, "gettempdir", lambda: "/tmp")
    assert backend._probe_root() is None
    monkeypatch.setattr(
        backend.tempfile, "gettempdir", lambda: "/var/folders/xy/a-long-per-user-temp-folder/T"
    )
    assert backend._probe_root() == "/tmp"
    assert len(str(Path("/tmp") / "autotune-verl-xxxxxxxx" / RAY_DIR)) <= backend.RAY_SOCKET_ROOM
