"""The live view (trial lines, ETA, run.log), the machine-conditions figures, and the back-to-back gain with
the figures every file states — no probe runs: the probe is a function here."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from autotune.probe import conditions
from autotune.probe.conditions import CpuWindow, disturbance, other_cores, worst_disturbance
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.report import gain
from autotune.report.lines import short_config, trial_line
from autotune.report.write import write_report
from autotune.run.live import Narrator, eta_text
from autotune.run.slots import plan_slots
from autotune.status import StudyAttr
from autotune.study.plan import StudyPlan
from autotune.study.trials import trial_config
from autotune.units import GIB
from tests.report_studies import BUDGET, knobs, new_study, record, result_attrs

BUSY = {"load": {"other_cores": 1.3, "cores": 2}}
QUIET = {"load": {"other_cores": 0.02, "cores": 2}}


# --- conditions -----------------------------------------------------------------------------------------


def test_other_cores_is_the_machines_busy_time_less_the_ranks_own_over_the_window():
    windows = [
        {"wall_seconds": 10.0, "own_cpu_seconds": 12.0, "machine_busy_seconds": 21.0},
        {"wall_seconds": 10.0, "own_cpu_seconds": 4.0, "machine_busy_seconds": None},
    ]
    assert other_cores(windows) == 0.5  # (21 - 12 - 4) / 10
    assert other_cores([*windows[:1], None]) is None  # a rank that did not report: unknown, not zero
    assert other_cores([{"wall_seconds": 5.0, "own_cpu_seconds": 9.0, "machine_busy_seconds": 8.0}]) == 0.0


def test_disturbance_speaks_only_when_other_work_matters():
    assert disturbance(QUIET) == "" and disturbance({}) == ""
    assert disturbance(BUSY) == "other work kept 1.3 of 2 cores busy"
    gpu = {
        "load": {
            "other_cores": 0.0,
            "cores": 64,
            "gpus": [{"index": 1, "used_bytes": 3 * GIB, "utilization": 40.0}],
        }
    }
    assert disturbance(gpu) == "GPU 1 had 3.0 GiB and 40% in use by others"
    assert worst_disturbance([QUIET, BUSY, {"load": {"other_cores": 0.5, "cores": 2}}]) == (
        "other work kept up to 1.3 of 2 cores busy"
    )


def test_a_probe_whose_ranks_reported_nothing_is_judged_by_the_load_average():
    """A timeout leaves no rank's CPU window: the load average beside the probe is what shows the busy
    machine (a probe keeps at most its cores busy; a core more is other work)."""
    timed_out = {"load": {"other_cores": None, "cores": 2, "load_1m_start": 7.2, "load_1m_end": 8.9}}
    assert disturbance(timed_out) == "the load average reached 8.9 on 2 cores (other work beside the probe)"
    alone = {"load": {"other_cores": None, "cores": 2, "load_1m_start": 1.1, "load_1m_end": 2.4}}
    assert disturbance(alone) == ""
    assert "8.9 on 2 cores" in worst_disturbance([alone, timed_out])


def test_busy_time_counts_only_the_cores_the_probe_may_run_on(tmp_path, monkeypatch):
    """Work pinned to another core (taskset, a second probe slot) does not slow this probe: not counted."""
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice, in ticks
    stat.write_text(
        "cpu  700 0 300 900 0 0 0 0 0 0\ncpu0 100 0 100 800 0 0 0 0 0 0\ncpu1 600 0 200 100 0 0 0 0 0 0\n"
    )
    monkeypatch.setattr(conditions, "Path", lambda path: stat if path == "/proc/stat" else Path(path))
    monkeypatch.setattr(conditions, "TICKS", 100)
    monkeypatch.setattr(conditions.os, "sched_getaffinity", lambda pid: {0})
    assert conditions.machine_busy_seconds() == 2.0  # cpu0's 200 busy ticks; cpu1's 800 are not ours
    monkeypatch.setattr(conditions.os, "sched_getaffinity", lambda pid: {0, 1})
    assert conditions.machine_busy_seconds() == 10.0
    assert plan_slots(2, 1, "cpu")[0].threads == 1  # two cores, two slots: one thread each


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc (Linux)")
def test_a_window_counts_its_own_cpu_time_and_the_machines():
    window = CpuWindow()
    total = 0
    for number in range(2_000_000):
        total += number
    figures = window.stop()
    assert (
        figures["own_cpu_seconds"] > 0 and figures["machine_busy_seconds"] >= figures["own_cpu_seconds"] * 0.5
    )


# --- live view ------------------------------------------------------------------------------------------


def test_a_trial_line_has_the_configuration_figures_and_what_else_matters():
    study = new_study()
    seed = record(study, "ok", knobs(), 12.5, 0.5, seed_config="hand")
    seed_line = trial_line(seed)
    assert seed_line.startswith("#0   ok") and "R8 m2 g4 lm" in seed_line and "12.500 samples/s" in seed_line
    assert "0.500 GiB" in seed_line and "hand-made 'hand'" in seed_line and "T32" not in seed_line
    busy = result_attrs(knobs(), 10.0, int(0.6 * GIB))
    busy["environment"] = BUSY
    loaded = record(
        study, "ok", knobs(micro_batch_size=4, gradient_accumulation_steps=2), 10.0, 0.6, result=busy
    )
    assert "[other work kept 1.3 of 2 cores busy]" in trial_line(loaded)
    oom = record(study, "oom", knobs(micro_batch_size=8, gradient_accumulation_steps=1), 0.0, 1.0)
    assert "samples/s" not in trial_line(oom) and "oom" in trial_line(oom)
    assert short_config(trial_config(seed), ["train_batch_size"]).startswith("T32 ")  # searched: shown


def test_a_trial_line_names_verls_own_knobs_when_set():
    import dataclasses

    from autotune.config.knobs import ProbeConfig

    base = ProbeConfig(rollout_batch_size=8, train_batch_size=16, micro_batch_size=2)
    assert "gmu" not in short_config(base) and "dyn" not in short_config(base)
    share = dataclasses.replace(base, gpu_memory_utilization=0.4, max_num_seqs=256)
    verl = dataclasses.replace(share, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=4096)
    assert short_config(verl).endswith(" gmu0.4 seqs256 dyn4096")
    # the forward passes' and the critic's budgets where set: trials that differ there read apart
    budgets = dataclasses.replace(
        verl, log_prob_max_token_len_per_gpu=8192, critic_max_token_len_per_gpu=2048
    )
    assert short_config(budgets).endswith(" dyn4096 lp8192 cr2048")


def test_eta_goes_by_this_runs_pace_else_by_the_studys_earlier_probes():
    assert eta_text(done_now=2, remaining=3, elapsed=60.0, past_walls=[], slots=1) == "ETA 0:01:30"
    assert eta_text(0, 4, 5.0, [30.0, 50.0], slots=2) == "ETA 0:01:20"
    assert eta_text(0, 4, 5.0, [], 1) == "ETA after the first trial" and eta_text(3, 0, 9.0, [], 1) == ""


def test_the_narrator_logs_plain_lines_and_survives_a_log_it_cannot_write(tmp_path):
    console = Console(file=io.StringIO(), width=200)
    narrator = Narrator(console, tmp_path / "run.log")
    narrator.say("[yellow]stopped[/yellow] after 3 s")
    assert (tmp_path / "run.log").read_text().rstrip().endswith(" stopped after 3 s")
    broken = Narrator(console, tmp_path / "missing" / "run.log")
    broken.say("still printed")  # no exception: the study, not the log, holds the measurements
    assert broken.log_path is None


# --- the back-to-back gain ------------------------------------------------------------------------------


def _study_with_a_winner_and_a_hand_made_config():
    study = new_study()
    seed = record(study, "ok", knobs(), 10.0, 0.5, seed_config="hand")
    winner = record(study, "ok", knobs(micro_batch_size=4, gradient_accumulation_steps=2), 30.0, 0.6)
    return study, seed, winner


def _probe(speeds: dict[str, list[float]], order: list[str]):
    """A probe that answers each configuration's next speed, and notes the order it was asked in."""

    def probe(config, settings, cancel=None) -> ProbeResult:
        key = str(config.micro_batch_size)
        order.append(key)
        speed = speeds[key].pop(0)
        return ProbeResult(
            status="ok", samples_per_sec=speed, peak_memory_bytes=int(0.61 * GIB), wall_seconds=1.0
        )

    return probe


def test_the_gain_is_measured_in_turn_and_the_headline_is_the_mean_of_every_measurement(tmp_path):
    study, seed, winner = _study_with_a_winner_and_a_hand_made_config()
    assert gain.hand_made_rivals(study.trials, winner) == [seed]
    order: list[str] = []
    probe = _probe({"2": [12.0, 8.0], "4": [20.0, 24.0]}, order)
    comparison = gain.compare(study, winner, [seed], probe, ProbeSettings())
    assert order == ["2", "4", "2", "4"]  # hand-made, recommended, hand-made, recommended
    assert comparison.ratio(seed.number) == pytest.approx(22.0 / 10.0)
    figures = gain.headline(study, study.trials[winner.number])
    assert figures.samples_per_sec == pytest.approx((30.0 + 20.0 + 24.0) / 3) and figures.measurements == 3
    assert figures.peak_bytes == int(0.61 * GIB)  # the highest of the measurements

    result = write_report(study, tmp_path, BUDGET, plan=StudyPlan(model="tiny-llama"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["gain"][0]["back_to_back"] and summary["gain"][0]["ratio"] == pytest.approx(2.2)
    assert summary["recommended"]["samples_per_sec"] == pytest.approx(24.6667, abs=1e-4)
    best = yaml.safe_load((tmp_path / "best_config.yaml").read_text())
    assert best["measured"]["samples_per_sec"] == summary["recommended"]["samples_per_sec"]
    assert best["measured"]["measurements"] == 3
    assert result.messages[0].startswith("Recommended: trial #1, 24.667 samples/s (mean of 3 probes)")
    assert result.messages[1] == (  # the two share the rollout batch: all of it is verl's knobs' gain
        "2.20x the samples/s of the hand-made config 'hand' from the knobs verl reads (every pair of "
        "back-to-back measurements 1.67-3.00x)."
    )
    verl = summary["gain"][0]["verl"]
    assert verl == {"ratio": 2.2, "low": 1.6667, "high": 3.0, "beyond_noise": True}
    assert summary["gain"][0]["probe_only"] is None
    assert result.messages[-1].startswith("  mapfile -t overrides < /")  # the command last


def _probe_by(speeds: dict[tuple[int, int], list[float]], order: list[tuple[int, int]]):
    """As `_probe`, keyed by (micro batch, rollout batch)."""

    def probe(config, settings, cancel=None) -> ProbeResult:
        key = (config.micro_batch_size, config.rollout_batch_size)
        order.append(key)
        return ProbeResult(
            status="ok",
            samples_per_sec=speeds[key].pop(0),
            peak_memory_bytes=int(0.6 * GIB),
            wall_seconds=1.0,
        )

    return probe


def test_a_rollout_batch_verl_does_not_read_is_split_out_of_the_gain(tmp_path):
    """The pick differs from the hand-made config in the micro batch (a verl knob) and the rollout batch
    (not one): the hand-made config with the pick's verl knobs is probed between them, and the headline is
    what verl's knobs give."""
    study = new_study()
    seed = record(study, "ok", knobs(rollout_batch_size=8), 10.0, 0.5, seed_config="hand")
    winner = record(
        study,
        "ok",
        knobs(rollout_batch_size=16, micro_batch_size=4, gradient_accumulation_steps=2),
        30.0,
        0.6,
    )
    order: list[tuple[int, int]] = []
    speeds = {(2, 8): [10.0, 10.0], (4, 8): [15.0, 15.0], (4, 16): [18.0, 18.0]}
    comparison = gain.compare(study, winner, [seed], _probe_by(speeds, order), ProbeSettings())
    assert order == [(2, 8), (4, 8), (4, 16)] * 2  # hand-made, hand-made with verl's knobs, recommended
    assert comparison.verl(seed.number).ratio == pytest.approx(1.5)
    assert comparison.probe_only(seed.number).ratio == pytest.approx(1.2)
    assert comparison.ratio(seed.number) == pytest.approx(1.8)
    result = write_report(study, tmp_path, BUDGET, plan=StudyPlan(model="tiny-llama"))
    (line,) = [m for m in result.messages if "hand-made config 'hand'" in m]
    assert line.startswith("1.50x the samples/s of the hand-made config 'hand' from the knobs verl reads")
    assert "rollout_batch_size, which verl does not read, made 1.20x more in the probe" in line
    summary = json.loads((tmp_path / "summary.json").read_text())["gain"][0]
    assert (summary["ratio"], summary["verl"]["ratio"], summary["probe_only"]["ratio"]) == (1.8, 1.5, 1.2)


def test_measurements_that_overlap_are_no_gain_beyond_noise(tmp_path):
    study, seed, winner = _study_with_a_winner_and_a_hand_made_config()
    gain.compare(study, winner, [seed], _probe({"2": [10.0, 11.0], "4": [10.5, 11.5]}, []), ProbeSettings())
    result = write_report(study, tmp_path, BUDGET, plan=StudyPlan(model="tiny-llama"))
    (line,) = [m for m in result.messages if "hand-made config 'hand'" in m]
    assert line.startswith("no gain beyond the probes' noise over the hand-made config 'hand'")
    assert "1.05x (every pair of back-to-back measurements 0.95-1.15x)" in line
    assert json.loads((tmp_path / "summary.json").read_text())["gain"][0]["verl"]["beyond_noise"] is False


def test_a_confirmation_replaces_the_headline():
    study, seed, winner = _study_with_a_winner_and_a_hand_made_config()
    probe = _probe({"2": [9.0, 9.0], "4": [27.0, 25.0]}, [])
    gain.compare(study, winner, [seed], probe, ProbeSettings(iterations=6), confirmed=True)
    figures = gain.headline(study, winner)
    assert figures.samples_per_sec == pytest.approx(26.0) and figures.basis.startswith(
        "confirmed: 6-iteration"
    )
    assert gain.comparison_for(study, winner.number).confirmed


def test_a_comparison_stopped_before_both_sides_were_measured_is_not_kept():
    study, seed, winner = _study_with_a_winner_and_a_hand_made_config()
    cancel = threading.Event()

    def probe(config, settings, cancel=cancel) -> ProbeResult:
        cancel.set()  # a second Ctrl-C during the first probe
        return ProbeResult(status="crashed")

    assert gain.compare(study, winner, [seed], probe, ProbeSettings(), cancel=cancel) is None
    assert StudyAttr.BACK_TO_BACK not in study.user_attrs


def test_without_a_comparison_the_gain_says_it_rests_on_first_measurements(tmp_path):
    study, _, _ = _study_with_a_winner_and_a_hand_made_config()
    result = write_report(study, tmp_path, BUDGET, plan=StudyPlan(model="tiny-llama"))
    assert any("3.00x" in line and "not back to back" in line for line in result.messages)


def test_a_hand_made_config_that_timed_out_is_no_gain_measured_with_the_command_to_get_it(tmp_path):
    """The terminal, report.md and summary.json say why there is no gain and what would measure it; the
    table shows the missing figures as missing, never as 0.000."""
    study = new_study()
    busy = {"load": {"other_cores": None, "cores": 2, "load_1m_start": 7.0, "load_1m_end": 8.5}}
    result = {**result_attrs(knobs(), 0.0, 0, "timeout"), "environment": {"load": busy["load"]}}
    first = {"status": "timeout", "timeout_seconds": 300.0, "busy": "", "second_timeout_seconds": 600.0}
    record(study, "timeout", knobs(), seed_config="hand", result=result, first_try=first)
    record(study, "ok", knobs(micro_batch_size=4, gradient_accumulation_steps=2), 30.0, 0.6)
    written = write_report(study, tmp_path, BUDGET, plan=StudyPlan(model="tiny-llama"))
    said = (
        "no gain measured: the hand-made config 'hand' (#0) timed out at 600 s (the load average reached 8.5"
    )
    assert any(line.startswith(said) for line in written.messages), written.messages
    assert any("--timeout-per-probe 1200" in line for line in written.messages)
    (gain_entry,) = json.loads((tmp_path / "summary.json").read_text())["gain"]
    assert gain_entry["ratio"] is None and gain_entry["hand_made_samples_per_sec"] is None
    assert gain_entry["missing"].startswith(said)
    markdown = (tmp_path / "report.md").read_text()
    assert said in markdown and "| hand | #0 | timeout | — | — |" in markdown


def test_a_faster_trial_over_the_headroom_is_a_near_miss_with_its_reason(tmp_path):
    study, _, _ = _study_with_a_winner_and_a_hand_made_config()
    record(study, "ok", knobs(micro_batch_size=8, gradient_accumulation_steps=1), 40.0, 0.95)  # limit 0.9
    write_report(study, tmp_path, BUDGET, plan=StudyPlan(model="tiny-llama"))
    (miss,) = json.loads((tmp_path / "summary.json").read_text())["near_misses"]
    assert (
        miss["samples_per_sec"] == 40.0
        and "within the 1.000 GiB budget but over the 10% headroom" in miss["why"]
    )
    assert "## Near misses" in (tmp_path / "report.md").read_text()


def test_the_status_line_reads_the_study_only_when_it_may_have_changed(monkeypatch):
    """Reading the study costs CPU the probe shares: never for a pipe or a file, else on a trial started or
    finished here, or every STATUS_LINE_SECONDS (other workers' trials, the ETA)."""
    from autotune.run import loop

    now = [100.0]
    monkeypatch.setattr(loop.time, "monotonic", lambda: now[0])
    view = loop.LiveView(Narrator(Console(file=io.StringIO())))
    piped, terminal = Console(file=io.StringIO()), Console(file=io.StringIO(), force_terminal=True)
    view.changed.set()
    assert not loop._line_due(piped, view, read_at=0.0)
    assert loop._line_due(terminal, view, read_at=now[0]) and not view.changed.is_set()
    assert not loop._line_due(terminal, view, read_at=now[0])
    now[0] += loop.STATUS_LINE_SECONDS
    assert loop._line_due(terminal, view, read_at=100.0)


def test_the_live_line_keeps_the_trial_count_and_elapsed_time_at_80_columns():
    """The status wraps under itself; `3/12` and the elapsed time are never cut at 80 columns."""
    from rich.progress import Progress

    from autotune.run.loop import progress_columns

    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    status = "timeout=1 running=1 | no feasible trial yet | probing #0 R16 m2 g4 lm2 w1 ckpt for 130 s"
    status += " | ETA 0:04:10"
    with Progress(*progress_columns(), console=console, expand=True) as progress:
        progress.add_task(status, total=12, completed=3)
    shown = console.file.getvalue().split("\r")[-1]
    assert "3/12 0:00:00" in shown and "ETA 0:04:10" in shown and "…" not in shown


def test_the_live_line_says_when_other_work_holds_the_cores(monkeypatch):
    from autotune.probe.conditions import busy_now

    monkeypatch.setattr(conditions, "load_average", lambda: 8.5)
    said = busy_now(probing=True, cores=2)
    assert said == "other work: load 8.5 on 2 cores, probes run slower (see --timeout-per-probe)"
    monkeypatch.setattr(conditions, "load_average", lambda: 2.4)  # the probe's own two cores, and a little
    assert busy_now(probing=True, cores=2) == "" and busy_now(probing=False, cores=2) != ""


def test_a_timeout_under_load_says_the_limit_that_may_fit():
    """Timed out at 300 s with the load at 8.5 on 2 cores: its share of the cores was about 2/8.5, so it may
    need about 300 × 8.5 / 2 = 1275 s, said as --timeout-per-probe 1300."""
    study = new_study()
    busy = {"other_cores": None, "cores": 2, "load_1m_start": 7.0, "load_1m_end": 8.5}
    result = {
        **result_attrs(knobs(), 0.0, 0, "timeout"),
        "wall_seconds": 300.0,
        "environment": {"load": busy},
    }
    trial = record(study, "timeout", knobs(), result=result)
    line = trial_line(trial)
    assert "[the load average reached 8.5 on 2 cores" in line
    assert "(at that load it may need --timeout-per-probe 1300)" in line


def test_a_probe_slowed_by_other_work_is_ringed_in_the_pareto_plot():
    from autotune.report.data import build_report
    from autotune.report.html import pareto_figure

    study = new_study()
    slowed = {**result_attrs(knobs(), 10.0, int(0.5 * GIB)), "environment": BUSY}
    record(study, "ok", knobs(), 10.0, 0.5, result=slowed)
    record(study, "ok", knobs(micro_batch_size=4, gradient_accumulation_steps=2), 30.0, 0.6)
    figure = pareto_figure(build_report(study, BUDGET, StudyPlan(model="tiny-llama")))
    labels = [c.get_label() for c in figure.axes[0].collections]
    assert "slowed by other work (samples/s understated)" in labels
