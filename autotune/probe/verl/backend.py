"""`--engine verl`: a probe that is verl itself, run for a few steps with the candidate configuration.

The built-in probe measures a faithful PPO iteration but not verl's engines: vLLM generates in its own
processes with a preallocated pool, FSDP workers train under Ray. Here the job autotune would export is
started as `python -m verl.trainer.main_ppo` from the user's verl environment (`--verl-python`), for the
warm-up plus the measured steps (autotune.probe.verl.verl_run), on a parquet of the recipe's shape
(autotune.probe.verl.dataset), in its own session with the slot's GPUs and a wall-clock limit; the whole
process group (Ray's workers and vLLM's included) is killed when it ends, and the next probe waits until the
GPUs' memory is back where it was.

The figures: samples/sec and the phases from verl's `timing_s/*` of the steps after the warm-up; the peak is
the larger of verl's allocator figure (the training worker's) and the NVML peak of the slot's GPUs less what
they held before the probe (vLLM's pool lives in other processes, which only NVML sees).

While verl runs, its output is watched for a failed generation (failures.GENERATION_FAILED): the step would
train on fewer samples, or verl's sync trainer would refill the prompts until the timeout, so the run is
stopped GENERATION_GRACE_SECONDS later (time for the traceback and its cause to arrive) and classified as
the crash, or the OOM, it is.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.config.knobs import ProbeConfig, usable_cores
from autotune.models.names import verl_model_path
from autotune.probe.classify import over_emulated_budget
from autotune.probe.conditions import gpu_others, load_average, visible_gpus
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.probe.verl import failures, metrics
from autotune.probe.verl.dataset import TokenCounter, chat_counter, write_dataset
from autotune.probe.verl.verl_run import RAY_DIR, VerlRun, verl_run
from autotune.status import Status

__all__ = ["GpuWatch", "run_verl_probe"]

LOG_FILE = "verl.log"
TAIL_CHARS = 4000
SETTLE_SECONDS = 60.0  # at most this long for a killed run's GPU memory to come back
SETTLE_SLACK_BYTES = 512 * 1024**2  # back "where it was" within a CUDA context's worth
GENERATION_GRACE_SECONDS = 5.0  # after verl reports a failed generation, for its traceback to arrive
# Ray's Unix sockets live under its temp dir, `<dir>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store`:
# at most 107 bytes on Linux (ray/_private/utils.py validate_socket_filepath), some 64 of them Ray's own
RAY_SOCKET_ROOM = 107 - 64


class GpuWatch:
    """Samples the used memory of the slot's GPUs (NVML) in a thread: the peak each reached above what it
    held before the probe. Inactive without NVML (a CPU machine: the stand-in's tests)."""

    def __init__(self, visible_devices: str | None, interval: float = 0.1, active: bool = True) -> None:
        self.interval = interval
        self.handles: list[object] = []
        self.baseline: list[int] = []
        self.peak: list[int] = []
        self.card_bytes: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        with contextlib.suppress(Exception):
            if not active:
                return
            import pynvml

            pynvml.nvmlInit()
            self.handles = [handle for _, handle in visible_gpus(pynvml, visible_devices)]
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
    if not settings.engine_python:
        raise ValueError("the verl engine needs settings.engine_python (autotune --verl-python PATH)")
    # NVML sees this machine's GPUs only: on a Ray cluster verl's workers are elsewhere, and the peak is
    # verl's allocator figure alone
    watch = GpuWatch(settings.visible_devices, active=settings.ray_address is None)
    with tempfile.TemporaryDirectory(prefix="autotune-verl-", dir=_probe_root()) as tmp:
        run_dir = Path(tmp)
        steps = settings.warmup_iterations + settings.iterations
        model_path = _model_path(settings, run_dir)
        run = verl_run(
            config,
            world_size=settings.world_size,
            steps=steps,
            model_path=model_path,
            run_dir=run_dir,
            verl_python=str(
                Path(settings.engine_python).expanduser().absolute()
            ),  # not resolve(): a venv's link
            # No card, no resident figure: verl's own default share unless the configuration sets one, the
            # same value the report exports for a study probed this way (trainers/verl/verl_export.py)
            card_bytes=0.0,
            resident_bytes=None,
            visible_devices=settings.visible_devices,
            nodes=settings.nodes,
            ray_address=settings.ray_address,
            device=settings.device,
        )
        counter = _prompt_counter(_tokenizer_model(model_path, settings), settings.trust_remote_code)
        write_dataset(run.train_path, run.prompts, config.max_prompt_length, counter)
        # What others held of the slot's GPUs and the load before the run (other_cores needs the ranks' own
        # CPU time, which verl's Ray workers do not report: None here)
        load: dict[str, Any] = {"other_cores": None, "cores": usable_cores(), "load_1m_start": load_average()}
        gpus = gpu_others(settings.visible_devices) if settings.device == "cuda" else None
        started = time.monotonic()
        ending = _launch(run, run_dir, settings.timeout_seconds, cancel, watch.start())
        wall = time.monotonic() - started
        load.update(load_1m_end=load_average(), **({"gpus": gpus} if gpus is not None else {}))
        device_peak = watch.stop()
        watch.settle()
        log_text = (run_dir / LOG_FILE).read_text(errors="replace")
        metrics_text = run.metrics_path.read_text(errors="replace") if run.metrics_path.exists() else None
    result = _result(config, settings, run, ending, wall, device_peak, log_text, metrics_text)
    result.environment["load"] = load
    return result


def _peak_source(device: str, device_peak: int, peak: int) -> str:
    """Where the peak comes from: NVML's device figure, verl's allocator figure, or on CPU the peak resident
    memory of verl's actor worker (what the CPU plugin's device module reports to verl's perf metrics)."""
    if device_peak and device_peak >= peak:
        return "nvml-device"
    return "verl-actor-rss" if device == "cpu" else "verl-allocator"


def _probe_root() -> str | None:
    """Where the probe's folder goes: the system's temp dir, or /tmp when that is too long a path for the
    Unix sockets of the Ray instance that lives inside the folder (command.RAY_DIR)."""
    room = len(os.path.join(tempfile.gettempdir(), "autotune-verl-xxxxxxxx", RAY_DIR))
    return None if room <= RAY_SOCKET_ROOM or not os.access("/tmp", os.W_OK) else "/tmp"


def _model_path(settings: ProbeSettings, run_dir: Path) -> str:
    """A local directory as it is; a registry name as the hub id verl loads. autotune's own test models have
    none: on CPU, where verl trains them, a folder with random weights in the probe's (`--weights random`,
    as the built-in probe's); on a GPU machine the name (only the stand-in verl of the tests takes it)."""
    model = settings.model
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser().resolve())
    hub_id = verl_model_path(model)
    if hub_id is not None or settings.device != "cpu":
        return hub_id or model
    from autotune.models.folder import write_model_folder  # torch and transformers: only here

    return str(write_model_folder(model, run_dir / "model", weights=True))


def _tokenizer_model(model_path: str, settings: ProbeSettings) -> str:
    """What the prompts' tokenizer is read from: the folder verl loads (the user's, or one written for a test
    model), else the registry name, whose hub id `_tokenizer` looks up in the local cache."""
    return model_path if Path(model_path).is_dir() else settings.model


def _prompt_counter(model: str, trust_remote_code: bool) -> TokenCounter | None:
    """Counts a prompt's tokens as verl renders it, with the tokenizer and chat template of `model` (a folder,
    or a registry name); None without them (the dataset's fallback, see autotune.probe.verl.dataset)."""
    tokenizer = _tokenizer(model, trust_remote_code)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None  # verl's agent loop cannot render a prompt without a chat template either
    return chat_counter(tokenizer)


def _tokenizer(model: str, trust_remote_code: bool) -> Any | None:
    """The tokenizer verl loads for `model`, offline: a local folder's, or a hub id's when the local
    Hugging Face cache already holds it (after a verl run on this machine); None otherwise."""
    path = Path(model).expanduser()
    source = str(path.resolve()) if path.is_dir() else verl_model_path(model)
    if source is None:
        return None
    with contextlib.suppress(Exception):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(
            source, local_files_only=True, trust_remote_code=trust_remote_code
        )
    return None


@dataclass(frozen=True)
class Ending:
    """How a verl run ended: its exit code (None when killed), and why we killed it, if we did."""

    code: int | None
    timed_out: bool = False
    generation_failed: bool = False  # stopped GENERATION_GRACE_SECONDS after verl reported one


class LogWatch:
    """Reads the run's output as it grows and notes when verl first reports a failed generation."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""  # the last line, until its newline arrives
        self.failed_at: float | None = None

    def poll(self) -> None:
        if self.failed_at is not None:
            return
        chunk = b""
        with contextlib.suppress(OSError), self.path.open("rb") as log:
            log.seek(self.offset)
            chunk = log.read()
        self.offset += len(chunk)
        # a progress bar's carriage returns end lines too, so that the unfinished one stays short
        *lines, self.partial = re.split(rb"[\r\n]", self.partial + chunk)
        if any(failures.reports_failed_generation(line.decode(errors="replace")) for line in lines):
            self.failed_at = time.monotonic()

    def stop_now(self) -> bool:
        """A generation failed and its grace has passed."""
        return self.failed_at is not None and time.monotonic() - self.failed_at >= GENERATION_GRACE_SECONDS


def _launch(
    run: VerlRun, run_dir: Path, timeout: float, cancel: threading.Event | None, watch: GpuWatch
) -> Ending:
    """Run verl in its own session until it exits, the deadline passes, `cancel` is set or a generation
    failed (LogWatch); the whole process group is killed in any case (Ray's workers, vLLM's engine)."""
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
    deadline, output = time.monotonic() + timeout, LogWatch(run_dir / LOG_FILE)
    timed_out = stopped = False
    try:
        while proc.poll() is None:
            output.poll()
            if cancel is not None and cancel.is_set():
                break
            timed_out = time.monotonic() >= deadline
            stopped = output.stop_now()
            if timed_out or stopped:
                break
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()
    killed = timed_out or stopped
    return Ending(None if killed else proc.returncode, timed_out=timed_out, generation_failed=stopped)


def _result(
    config: ProbeConfig,
    settings: ProbeSettings,
    run: VerlRun,
    ending: Ending,
    wall: float,
    device_peak: int,
    log_text: str,
    metrics_text: str | None,
) -> ProbeResult:
    steps = metrics.merge_steps(metrics.parse_file_log(metrics_text or ""), metrics.parse_console(log_text))
    figures = metrics.summarise(steps, run.steps, config.train_batch_size, settings.warmup_iterations)
    seen = run.steps - len(figures.missing)
    verdict = failures.classify_run(ending.code, ending.timed_out, seen, run.steps, log_text)
    peak = max(device_peak, figures.allocated_peak_bytes or 0, figures.reserved_peak_bytes or 0)
    budget = settings.budget_bytes
    if verdict[0] == Status.OK:  # on CPU nothing enforced the budget: the peak verl logged is held to it
        verdict = over_emulated_budget(peak, budget, settings.device) or verdict
    status = verdict[0]
    result = ProbeResult.classified(
        config,
        settings,
        verdict,
        wall,
        memory_budget_bytes=budget,
        peak_memory_bytes=peak,
        peak_memory_source=_peak_source(settings.device, device_peak, peak),
        environment={
            "engine": "verl",
            "verl_python": settings.engine_python,
            "steps_seen": seen,
            **({"cluster": {"address": settings.ray_address}} if settings.ray_address else {}),
        },
    )
    if ending.generation_failed:
        result.environment["stopped"] = "a generation failed"
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
