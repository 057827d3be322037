"""Trial statuses and trial attribute keys: the study's vocabulary, written once.

Every trial carries a `status` user attribute (see docs/design.md, "Statuses"). A probe ends with one of
`PROBE_STATUSES`; the tuner adds the others without launching a probe, or when a probe could not finish.
"""

from __future__ import annotations

__all__ = [
    "FAILED",
    "LAUNCHED",
    "MEASURED",
    "PROBE_STATUSES",
    "Attr",
    "Status",
    "StudyAttr",
]


class Status:
    """Values of the `status` trial attribute."""

    OK = "ok"  # measured within the run: samples/sec and peak memory
    OOM = "oom"  # a real out-of-memory, or a peak above an emulated budget (see `oom_kind`)
    TIMEOUT = "timeout"  # hung or too slow: the probe's process group was killed
    CRASHED = "crashed"  # non-zero exit, a signal, or no readable result
    INTERRUPTED = "interrupted"  # the tuner died or was stopped mid-probe: re-queued once
    PREDICTED_OOM = "predicted_oom"  # the memory model put it far over the budget: not launched
    INFERRED_OOM = "inferred_oom"  # at least as large as a measured OOM: not launched
    SURPLUS = "surplus"  # asked in the same instant as another worker past the trial count
    ABANDONED = "abandoned"  # asked but never claimed (the storage failed in between)


# The `oom_kind` of a CUDA OOM raised in one of verl's training tasks (autotune.probe.verl.failures), while
# its rollout engine slept with its KV cache freed: in an update (actor or critic) or in the forward passes
# that score the rollout; OOM_PHASES names the phase of each
UPDATE_OOM, SCORING_OOM = "cuda_update", "cuda_scoring"
OOM_PHASES = {UPDATE_OOM: "update", SCORING_OOM: "scoring"}
# The `oom_kind` of a CUDA OOM of verl's rollout engine: vLLM's sleep-mode allocator failing to map its pool
# back when it wakes up beside the trainer's memory, or an OOM in the vLLM server or its engine while it
# generates. Not in OOM_PHASES on purpose: the engine is awake then, so every knob counts, the rollout share
# and max_num_seqs included (study.oom_phase reads None, as for any other OOM)
ROLLOUT_OOM = "cuda_rollout"

PROBE_STATUSES = (Status.OK, Status.OOM, Status.TIMEOUT, Status.CRASHED)
MEASURED = (Status.OK, Status.OOM, Status.TIMEOUT)  # a probe ran and its figures are properties of the config
LAUNCHED = (*PROBE_STATUSES, Status.INTERRUPTED)  # a probe process really ran
FAILED = (Status.CRASHED, Status.INTERRUPTED, Status.SURPLUS, Status.ABANDONED)  # recorded as Optuna FAIL


class Attr:
    """Trial user attribute keys."""

    STATUS = "status"
    CONFIG = "config"  # the ProbeConfig as a dict: the claim other workers see
    PEAK_BYTES = "peak_bytes"
    RESULT = "result"  # the probe's figures (ProbeResult, trimmed)
    OOM_KIND = "oom_kind"
    PREDICTED_PEAK_BYTES = "predicted_peak_bytes"
    CALIBRATION_POINTS = "calibration_points"
    DUPLICATE_OF = "duplicate_of"  # the trial that measured this config
    DOMINATES_OOM_TRIAL = "dominates_oom_trial"
    SEED_CONFIG = "seed_config"  # the hand-made config's name
    RETRY_OF = "retry_of"
    FIRST_TRY = "first_try"  # a hand-made config's timeout on a busy machine, before its longer try
    SAVED_OUTCOME = "saved_outcome"  # a measurement the storage could not take, recorded without a probe
    REPLAY_OF = "replay_of"
    RECORDED_LATE = "recorded_late"
    HOST = "host"
    TUNER_PID = "tuner_pid"
    TUNER_STARTED = "tuner_started"
    CLAIMED_AT = "claimed_at"


class StudyAttr:
    """Study user attribute keys."""

    PLAN = "plan"  # the StudyPlan: what every run, worker and report of the study shares
    SEEDED = "seeded"  # the hand-made configs were enqueued once
    CONFIRMATIONS = "confirmations"  # `autotune report --confirm` results by trial number
    BACK_TO_BACK = "back_to_back"  # the recommended and hand-made configs probed in turn (report.gain)
    REMEASURED = "remeasured"  # the contenders' re-probes before the report, by trial number (report.pick)
