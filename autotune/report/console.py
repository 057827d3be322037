"""Human-readable tables on the terminal (rich)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.table import Table

from autotune.config.knobs import ProbeConfig
from autotune.probe.contract import ProbeResult, ProbeSettings
from autotune.report.lines import short_config
from autotune.trainers.registry import engine_named
from autotune.units import gib

__all__ = ["print_probe_result", "probing"]


@contextlib.contextmanager
def probing(config: ProbeConfig, settings: ProbeSettings) -> Iterator[None]:
    """Say on stderr what the probe is doing while it runs (a minute of silence reads as a hang); a spinner
    with the elapsed time on a terminal, one line otherwise. stdout stays free for --json."""
    console = Console(stderr=True)
    # TRL's untimed rounds on CPU go on past the warm-up to set the peak
    extra = engine_named(settings.engine).untimed_rounds(settings) - settings.warmup_iterations
    peak_round = f" and {extra} that set(s) the peak" if extra else ""
    what = (
        f"probing {short_config(config)} on {settings.device} × {settings.world_size}: start-up, "
        f"{settings.warmup_iterations} warm-up{peak_round} and {settings.iterations} measured iteration(s), "
        f"at most {settings.timeout_seconds:.0f} s"
    )
    if not console.is_terminal:
        console.print(what, markup=False, highlight=False, soft_wrap=True)
        yield
        return
    with console.status(what, spinner="dots"):
        yield


def _gib(value: int | None) -> str:
    return f"{gib(value)} GiB" if value else "-"


def print_probe_result(result: ProbeResult, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"probe: {result.status}", show_header=False)
    table.add_column("figure", style="bold")
    table.add_column("value")
    status = result.status + (f" ({result.oom_kind})" if result.oom_kind else "")
    table.add_row("status", status)
    if result.message:
        table.add_row("message", result.message)
    table.add_row(
        "device",
        f"{result.device} × {result.world_size}"
        + (f" ({result.environment.get('gpu')})" if result.environment.get("gpu") else ""),
    )
    if result.samples_per_sec:
        table.add_row("samples/sec", f"{result.samples_per_sec:.3f}")
        table.add_row("tokens/sec", f"{result.tokens_per_sec:.1f}")
        training = " (the training phases: rollout is synthetic)" if result.packing else ""
        table.add_row("iteration", f"{result.iteration_seconds:.3f} s (mean of measured){training}")
        for phase, seconds in result.phase_seconds.items():
            table.add_row(f"  {phase}", f"{seconds:.3f} s")
    for name, packed in result.packing.items():
        table.add_row(
            f"packed: {name}",
            f"{packed['micro_batches']} micro batch(es) of {packed['tokens']} tokens per iteration, "
            f"the largest {packed['max_tokens']} tokens",
        )
    table.add_row(
        "peak memory (max over ranks)", f"{_gib(result.peak_memory_bytes)} [{result.peak_memory_source}]"
    )
    for rank, peak in enumerate(result.rank_peaks):
        table.add_row(f"  rank {rank}", _gib(peak.get("bytes")))
    if result.memory_budget_bytes:
        table.add_row(
            "memory budget",
            _gib(result.memory_budget_bytes)
            + (" (emulated: peak RSS watched)" if result.device == "cpu" else " (memory fraction)"),
        )
    if result.gpu_utilization is not None:
        table.add_row("GPU utilisation", f"{result.gpu_utilization:.0f}%")
    table.add_row("wall time", f"{result.wall_seconds:.1f} s (start-up {result.startup_seconds:.1f} s)")
    console.print(table)
    if result.stderr_tail:
        console.print("[bold]stderr (tail):[/bold]")
        console.print(result.stderr_tail, markup=False, highlight=False)
