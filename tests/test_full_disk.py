"""Nothing measured is lost to a full disk, a torn journal record or a damaged pending file.

The full-disk tests mount a 1 MiB tmpfs (root only, through the mount system call: no process started) and
fill it while the tuner works; elsewhere they skip and say why. The torn and damaged files are written by the
tests themselves.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import Unavailable
from autotune.study.outage import PENDING_PREFIX, PendingFile, append_line
from autotune.study.plan import StudyPlan
from autotune.study.storage import file_guard
from autotune.study.trials import finished_trials, trial_status
from tests.test_study import BUDGET, FakeProbe, make_tuner


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "1m"):
    """A tmpfs of `size` at `path`, unmounted afterwards; skips where this process may not mount."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is emulated with a tmpfs, which needs root (CI runs as root)")
    libc = ctypes.CDLL(None, use_errno=True)
    path.mkdir(parents=True, exist_ok=True)
    if libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", 0, f"size={size}".encode()) != 0:
        pytest.skip(f"cannot mount a tmpfs here: {os.strerror(ctypes.get_errno())}")
    try:
        yield path
    finally:
        libc.umount2(str(path).encode(), 2)  # MNT_DETACH


def fill(folder: Path) -> Path:
    """Fill the file system of `folder` to the last byte; returns the filler to delete to free it."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as handle:
        for block in (4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0" * block)
    return filler


def journal_tuner(tmp_path: Path, folder: Path):
    storage = f"journal:{folder / 'study.journal'}"
    tuner = make_tuner(tmp_path, FakeProbe(), storage=storage)
    tuner.patience, tuner.storage_url = 1.0, storage
    tuner.pending = PendingFile(folder / "pending.jsonl")
    return tuner


def test_a_full_disk_mid_study_loses_nothing_and_the_study_reads_back(tmp_path, capsys):
    with small_tmpfs(tmp_path / "disk") as disk:
        tuner = journal_tuner(tmp_path, disk)
        tuner.step()  # one trial recorded while there is room
        filler = fill(disk)
        with pytest.raises(Unavailable, match="kept in memory"):
            tuner.step()  # measured, but neither the journal nor the pending file can take it
        printed = [line for line in capsys.readouterr().err.splitlines() if line.startswith(PENDING_PREFIX)]
        assert len(printed) == 1 and json.loads(printed[0].removeprefix(PENDING_PREFIX))["trial_number"] == 1
        filler.unlink()
        assert tuner.pending.flush() and tuner.pending.unwritten == []  # retried while the tuner lives
        again = journal_tuner(tmp_path, disk)  # the next run: the journal is whole, the measurement replayed
        assert again.replay_pending().trials == [1] and again.probe.launched == []
        assert len(finished_trials(again.study)) == 2
        assert again.step() is not None  # and the study goes on


def test_a_full_disk_never_leaves_half_a_pending_line(tmp_path):
    with small_tmpfs(tmp_path / "disk", size="64k") as disk:
        pending = disk / "pending.jsonl"
        append_line(pending, json.dumps({"first": True}))
        filler = fill(disk)
        with pytest.raises(OSError):
            append_line(pending, json.dumps({"second": "x" * 100_000}))
        assert pending.read_text() == '{"first": true}\n'
        filler.unlink()


def test_a_torn_last_journal_record_is_cut_off_and_kept_and_the_study_goes_on(tmp_path):
    folder = tmp_path / "store"
    folder.mkdir()
    tuner = journal_tuner(tmp_path, folder)
    for _ in range(2):
        tuner.step()
    journal = folder / "study.journal"
    with journal.open("ab") as handle:
        handle.write(b'{"op_code": 5, "worker_id": "torn')  # a process died in the middle of a write
    again = journal_tuner(tmp_path, folder)
    assert len(finished_trials(again.study)) == 2
    assert again.step() is not None
    assert len(finished_trials(again.study)) == 3
    kept = list(folder.glob("study.journal.torn-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == b'{"op_code": 5, "worker_id": "torn'
    assert journal.read_bytes().endswith(b"\n")


def test_a_damaged_journal_record_is_refused_with_how_to_repair_it(tmp_path, capsys):
    folder = tmp_path / "store"
    folder.mkdir()
    tuner = journal_tuner(tmp_path, folder)
    StudyPlan(model="tiny-llama", budget_bytes=BUDGET.bytes).save(tuner.study)
    tuner.step()
    journal = folder / "study.journal"
    lines = journal.read_bytes().split(b"\n")
    lines[2] = lines[2][:10]  # a record torn in the middle of the file
    journal.write_bytes(b"\n".join(lines))
    storage = f"journal:{journal}"
    assert main(["report", "--study", "t", "--storage", storage, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 3 of" in err and "head -n 2" in err and "Traceback" not in err


def test_a_damaged_pending_file_never_stops_a_run(tmp_path):
    tuner = journal_tuner(tmp_path, tmp_path)
    measured = tuner.study.ask()
    outcome = tuner.decide(tuner._claims.sample(measured))
    tuner.pending.keep(measured.number, measured.params, outcome)
    with tuner.pending.path.open("a") as handle:
        handle.write("not json at all\n")
        handle.write('{"trial_number": 7, "params": {}}\n')  # no outcome
        handle.write('{"trial_number": 1, "par')  # torn
    replay = tuner.replay_pending()
    assert replay.trials == [0] and replay.damaged_lines == 3
    assert len(replay.damaged.read_text().splitlines()) == 3
    assert trial_status(tuner.study.trials[0]) in ("ok", "oom")


def test_a_study_file_deleted_mid_run_keeps_the_measurement_for_the_next_run(tmp_path):
    database = tmp_path / "study.db"
    tuner = make_tuner(tmp_path, FakeProbe())
    tuner.guard, tuner.patience = file_guard(f"sqlite:///{database}"), 1.0
    tuner.pending = PendingFile(tmp_path / "pending.jsonl")
    tuner.step()

    def probe_then_lose_the_file(config, settings, cancel=None):
        database.unlink()  # an operator cleans up the wrong folder while the probe runs
        return FakeProbe()(config, settings, cancel)

    tuner.probe = probe_then_lose_the_file
    with pytest.raises(Unavailable, match=r"deleted or replaced.*kept in .*pending\.jsonl"):
        tuner.step()
    with pytest.raises(Unavailable, match="deleted or replaced"):
        tuner.step()  # and nothing more is asked of a file nobody will read
    again = make_tuner(tmp_path, FakeProbe())  # the next run: a new study.db
    again.pending = PendingFile(tmp_path / "pending.jsonl")
    assert again.replay_pending().trials == [1]
    recorded = again.step()  # the kept measurement, recorded without a probe
    assert recorded.user_attrs["replay_of"] == 1 and again.probe.launched == []
