"""`--engine verl`: a probe that is verl itself, run for a few steps with the candidate configuration.

The built-in probe measures a faithful PPO iteration but not verl's engines: vLLM generates in its own
processes with a preallocated pool, FSDP workers train under Ray. Here the job autotune would export is
started as `python -m verl.trainer.main_ppo` from the user's verl environment (`--verl-python`), for the
warm-up plus the measured steps (autotune.probe.verl.command), on a parquet of the recipe's shape
(autotune.probe.verl.dataset), in its own session with the slot's GPUs and a wall-clock limit; the whole
process group (Ray's workers and vLLM's included) is killed when it ends, and the next probe waits until the
GPUs' memory is back where it was.

The figures: samples/sec and the phases from verl's `timing_s/*` of the steps after the warm-up; the peak is
the larger of verl's allocator figure (the training worker's) and the NVML peak of the slot's GPUs less what
they held before the probe (vLLM's pool lives in other processes, which only NVML sees).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from autotune.config.knobs import ProbeConfig
from autotune.models.names import verl_model_path
from autotune.probe.conditions import gpu_others, load_average
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.probe.verl import failures, metrics
from autotune.probe.verl.command import VerlRun, verl_run
from autotune.probe.verl.dataset import write_dataset
from autotune.status import Status

__all__ = ["GpuWatch", "run_verl_probe"]

LOG_FILE = "verl.log"
TAIL_CHARS = 4000
SETTLE_SECONDS = 60.0  # at most this long for a killed run's GPU memory to come back
SETTLE_SLACK_BYTES = 512 * 1024**2  # back "where it was" within a CUDA context's worth


class GpuWatch:
    """Samples the used memory of the slot's GPUs (NVML) in a thread: the peak each reached above what it
    held before the probe. Inactive without NVML (a CPU machine: the stand-in's tests)."""

    def __init__(self, visible_devices: str | None, interval: float = 0.1) -> None:
        self.interval = interval
        self.handles: list[object] = []
        self.baseline: list[int] = []
        self.peak: list[int] = []
        self.card_bytes: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        with contextlib.suppress(Exception):
            import pynvml

            pynvml.nvmlInit()
            wanted = [d.strip() for d in (visible_devices or "").split(",") if d.strip().isdigit()]
            indices = [int(d) for d in wanted] or list(range(pynvml.nvmlDeviceGetCount()))
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
            self.baseline = self.used()
            self.peak = list(self.baseline)
            self.card_bytes = (
                int(pynvml.nvmlDeviceGetMemoryInfo(self.handles[0]).total) if self.handles else None
            )

    def used(self) -> list[int]:
        import pynvml

        return [int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) for handle in self.handles]

    def start(self) -> GpuWatch:
        if self.handles:
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):
                self.peak = [max(p, u) for p, u in zip(self.peak, self.used(), strict=True)]

    def stop(self) -> int:
        """The largest rise above the baseline over the slot's GPUs, in bytes (0 without NVML)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)
        return max((p - b for p, b in zip(self.peak, self.baseline, strict=True)), default=0)

    def settle(self, seconds: float = SETTLE_SECONDS) -> bool:
        """Wait until every GPU is back to its baseline (a killed vLLM frees its pool a little later)."""
        deadline = time.monotonic() + seconds
        while self.handles and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if all(u <= b + SETTLE_SLACK_BYTES for u, b in zip(self.used(), self.baseline, strict=True)):
                    return True
            time.sleep(0.5)
        return not self.handles


def run_verl_probe(
    config: ProbeConfig, settings: ProbeSettings, cancel: threading.Event | None = None
) -> ProbeResult:
    """One verl run of `config`: its warm-up step and measured steps, classified like a built-in probe."""
    if not settings.verl_python:
        raise ValueError("the verl engine needs settings.verl_python (autotune --verl-python PATH)")
    watch = GpuWatch(settings.visible_devices)
    with tempfile.TemporaryDirectory(prefix="autotune-verl-") as tmp:
        run_dir = Path(tmp)
        steps = settings.warmup_iterations + settings.iterations
        run = verl_run(
            config,
            world_size=settings.world_size,
            steps=steps,
            model_path=_model_path(settings.model),
            run_dir=run_dir,
            verl_python=str(
                Path(settings.verl_python).expanduser().absolute()
            ),  # not resolve(): a venv's link
            # No card, no resident figure: verl's own default share unless the configuration sets one, the
            # same value the report exports for a study probed this way (report.data.engine_for)
            card_bytes=0.0,
            resident_bytes=None,
            visible_devices=settings.visible_devices,
        )
        write_dataset(run.train_path, run.prompts, config.max_prompt_length, _token_counter(settings))
        # What others held of the slot's GPUs and the load before the run (other_cores needs the ranks' own
        # CPU time, which verl's Ray workers do not report: None here)
        load = {"other_cores": None, "cores": os.cpu_count(), "load_1m_start": load_average()}
        gpus = gpu_others(settings.visible_devices) if settings.device == "cuda" else None
        started = time.monotonic()
        timed_out, code = _launch(run, run_dir, settings.timeout_seconds, cancel, watch.start())
        wall = time.monotonic() - started
        load.update(load_1m_end=load_average(), **({"gpus": gpus} if gpus is not None else {}))
        device_peak = watch.stop()
        watch.settle()
        log_text = (run_dir / LOG_FILE).read_text(errors="replace")
        metrics_text = run.metrics_path.read_text(errors="replace") if run.metrics_path.exists() else None
    result = _result(config, settings, run, code, timed_out, wall, device_peak, log_text, metrics_text)
    result.environment["load"] = load
    return result


def _model_path(model: str) -> str:
    """A local directory as it is; a registry name as the hub id verl loads (autotune's own test models have
    none: the stand-in verl of the tests accepts the name)."""
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser().resolve())
    return verl_model_path(model) or model


def _token_counter(settings: ProbeSettings):
    """The model's own tokenizer where it has one (a local directory), else None (words stand in)."""
    path = Path(settings.model).expanduser()
    if not path.is_dir():
        return None
    with contextlib.suppress(Exception):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=settings.trust_remote_code)
        return lambda text: len(tokenizer(text)["input_ids"])
    return None


def _launch(
    run: VerlRun, run_dir: Path, timeout: float, cancel: threading.Event | None, watch: GpuWatch
) -> tuple[bool, int | None]:
    """Run verl in its own session until it exits, the deadline passes or `cancel` is set; the whole process
    group is killed in any case (Ray's workers, vLLM's engine); returns (timed out, exit code)."""
    env = {k: v for k, v in os.environ.items() if k not in run.unset}
    env.update(run.env)
    with (run_dir / LOG_FILE).open("wb") as log:
        proc = subprocess.Popen(
            run.argv,
            cwd=run_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline, timed_out = time.monotonic() + timeout, False
    try:
        while proc.poll() is None:
            if cancel is not None and cancel.is_set():
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()
    return timed_out, None if timed_out else proc.returncode


def _result(
    config: ProbeConfig,
    settings: ProbeSettings,
    run: VerlRun,
    code: int | None,
    timed_out: bool,
    wall: float,
    device_peak: int,
    log_text: str,
    metrics_text: str | None,
) -> ProbeResult:
    steps = metrics.merge_steps(metrics.parse_file_log(metrics_text or ""), metrics.parse_console(log_text))
    figures = metrics.summarise(steps, run.steps, config.train_batch_size, settings.warmup_iterations)
    seen = run.steps - len(figures.missing)
    status, oom_kind, message = failures.classify_run(code, timed_out, seen, run.steps, log_text)
    peak = max(device_peak, figures.allocated_peak_bytes or 0, figures.reserved_peak_bytes or 0)
    result = ProbeResult(
        status=status,
        oom_kind=oom_kind,
        message=message,
        wall_seconds=wall,
        world_size=settings.world_size,
        device=settings.device,
        config=config.to_dict(),
        peak_memory_bytes=peak,
        peak_memory_source="nvml-device" if device_peak >= peak and device_peak else "verl-allocator",
        environment={"engine": "verl", "verl_python": settings.verl_python, "steps_seen": seen},
    )
    if status == Status.OK:
        result.samples_per_sec = figures.samples_per_sec
        result.tokens_per_sec = figures.tokens_per_sec
        result.iteration_seconds = figures.iteration_seconds
        result.phase_seconds = figures.phase_seconds
        result.measured_seconds = figures.measured_seconds
        result.warmup_seconds = figures.warmup_seconds
    else:
        result.stderr_tail = log_text[-TAIL_CHARS:]
    return result
