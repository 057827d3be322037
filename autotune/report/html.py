"""`report.html`: one self-contained page — inline CSS, inline SVG plots (matplotlib), no scripts, no fonts,
no external resource — so it opens offline, in a browser or attached to a ticket.

Plots: the Pareto front (samples/sec against peak memory: every complete trial, the front, the chosen point,
OOM and pruned points, the budget), peak memory against micro batch size, seconds per phase for the front's
configs, and the memory model's predictions against the measurements.
"""

from __future__ import annotations

import html
import io
import re
from typing import TYPE_CHECKING, Literal

import matplotlib
from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

from autotune.report.data import config_yaml
from autotune.report.tables import (
    Table,
    closest_table,
    conditions_lines,
    cost_table,
    defaults_table,
    front_table,
    gain_lines,
    gains_table,
    gib,
    knobs_title,
    launch_line,
    legend_line,
    memory_model_table,
    model_error_line,
    near_miss_table,
    predictions,
    remeasured_lead,
    remeasured_table,
    study_lines,
    trials_table,
    verdict_line,
)
from autotune.status import Attr, Status
from autotune.study.trials import trial_config, trial_status
from autotune.units import GIB

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from optuna.trial import FrozenTrial

    from autotune.report.data import ReportData

__all__ = [
    "html_table",
    "memory_micro_figure",
    "memory_model_figure",
    "pareto_figure",
    "phases_figure",
    "render_html",
]

# status -> (label, colour, marker, filled)
STYLES = {
    Status.OK: ("ok", "#1f77b4", "o", True),
    "over_limit": ("ok, above budget − headroom", "#bcbd22", "o", True),
    Status.OOM: ("measured OOM", "#d62728", "X", True),
    Status.PREDICTED_OOM: ("predicted OOM (not launched)", "#ff7f0e", "v", False),
    Status.INFERRED_OOM: ("dominates an OOM (not launched)", "#8c564b", "^", False),
    Status.TIMEOUT: ("timeout", "#9467bd", "s", True),
}
PHASE_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
FIGSIZE = (9.5, 4.4)
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1em auto;
       max-width: 1340px; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.4em; margin: .3em 0; } h3 { margin: .4em 0; }
.copy { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1.4fr); gap: 1.2em; }
.copy pre { margin: .3em 0; font-size: .85em; } pre.launch { white-space: pre-wrap; word-break: break-all; }
.gain { margin: .2em 0; } .warn { color: #8a5300; background: #fff8e1; padding: .3em .6em; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.2em; font-size: 1.2em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .92em; max-width: 100%; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; overflow-wrap: anywhere; }
th { background: #f3f3f3; } tr.chosen td { background: #fff3cd; font-weight: 600; }
.meta { color: #555; } .verdict { font-size: 1.15em; } .bad { color: #b00020; font-weight: 600; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: .9em; }
"""


# --- figures ------------------------------------------------------------------------------------------------


def _svg(fig: Figure, name: str) -> str:
    """The figure as an inline <svg> element: no XML prolog, ids unique to this figure, text kept as text."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    return re.sub(r"<svg ", f'<svg role="img" aria-label="{html.escape(name)}" ', text, count=1)


def _new_figure() -> tuple[Figure, Axes]:
    fig = Figure(figsize=FIGSIZE)
    return fig, fig.add_subplot()


def _empty(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def _style_key(trial: FrozenTrial, limit: float) -> str | None:
    status = trial_status(trial)
    if status == Status.OK:
        return "ok" if trial.values[1] <= limit else "over_limit"
    return status if status in STYLES else None


def _label(
    ax: Axes, xlabel: str, ylabel: str, title: str, grid_axis: Literal["both", "x", "y"] = "both"
) -> None:
    """Axis labels, title, a light grid and the legend: every figure of the report ends the same way."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis=grid_axis)
    # Outside the axes, so that it never hides a point; large enough to read at the page's width.
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _budget_lines(ax: Axes, report: ReportData, vertical: bool) -> None:
    line = ax.axvline if vertical else ax.axhline
    line(report.budget.bytes / GIB, color="#d62728", lw=1.2, label="memory budget")
    line(
        report.budget.limit / GIB,
        color="#d62728",
        lw=1.0,
        ls="--",
        label=f"budget − {report.budget.headroom:.0%} headroom",
    )


def _scatter_group(ax: Axes, xs: list[float], ys: list[float], key: str) -> None:
    label, colour, marker, filled = STYLES[key]
    ax.scatter(
        xs,
        ys,
        s=36,
        marker=marker,
        label=label,
        zorder=3,
        alpha=0.85,
        facecolors=colour if filled else "none",
        edgecolors=colour,
    )


def _zoom(report: ReportData, trials: list[FrozenTrial]) -> tuple[float, float]:
    """The x range of the Pareto plot: the measured peaks and the budget lines, a margin either side (points
    all within 0.54-0.65 GiB are not drawn on 0-0.95). Predictions far beyond sit on the right edge."""
    measured = [t.values[1] / GIB for t in trials if trial_status(t) in (Status.OK, Status.OOM)]
    lines = [report.budget.limit / GIB, report.budget.bytes / GIB]
    low, high = min(measured + lines), max(measured + lines)
    margin = max(0.04 * (high - low), 0.01 * high)
    return max(0.0, low - margin), high + margin


def pareto_figure(report: ReportData) -> Figure:
    fig, ax = _new_figure()
    trials = [t for t in report.complete if Attr.DUPLICATE_OF not in t.user_attrs]
    if not trials:
        _empty(ax, "no complete trial yet")
        return fig
    x_min, x_max = _zoom(report, trials)
    groups: dict[str, tuple[list[float], list[float]]] = {}
    for trial in trials:
        key = _style_key(trial, report.budget.limit)
        if key is not None:
            xs, ys = groups.setdefault(key, ([], []))
            xs.append(min(trial.values[1] / GIB, x_max))  # far-off predictions sit on the right edge
            ys.append(trial.values[0])
    for key in STYLES:
        if key in groups:
            _scatter_group(ax, *groups[key], key)
    _front_and_pick(ax, report)
    _marked_trials(ax, report, x_max)
    _budget_lines(ax, report, vertical=True)
    ax.set_xlim(x_min, x_max)
    _label(ax, "peak memory per GPU (GiB)", "samples / sec", "Pareto front: throughput against peak memory")
    return fig


def _front_and_pick(ax: Axes, report: ReportData) -> None:
    """The feasible front as a step line, and the chosen trial as a star on it: what the plot is read for."""
    front = sorted(report.selection.front, key=lambda t: t.values[1])
    if front:
        ax.step(
            [t.values[1] / GIB for t in front],
            [t.values[0] for t in front],
            where="post",
            color="#1f77b4",
            lw=1.2,
            label="Pareto front (feasible)",
        )
    chosen = report.selection.chosen
    if chosen is not None:
        ax.scatter(
            [chosen.values[1] / GIB],
            [chosen.values[0]],
            s=260,
            marker="*",
            color="#ffbf00",
            edgecolors="black",
            zorder=5,
            label=f"chosen: trial #{chosen.number}",
        )


def _marked_trials(ax: Axes, report: ReportData, x_max: float) -> None:
    """Rings round the probes other work slowed, and the hand-made configs named: points not to read as
    ordinary ones. Like every point, those past `x_max` sit on the right edge."""
    slowed = [t for t, _ in report.disturbed if t.values is not None and trial_status(t) == Status.OK]
    if slowed:  # their samples/s understate their configurations: a ring, not an ordinary point
        ax.scatter(
            [min(t.values[1] / GIB, x_max) for t in slowed],
            [t.values[0] for t in slowed],
            s=170,
            facecolors="none",
            edgecolors="#d62728",
            linewidths=1.4,
            zorder=4,
            label="slowed by other work (samples/s understated)",
        )
    for gain in report.gains:
        ax.annotate(
            "hand-made",
            (min(gain.trial.values[1] / GIB, x_max), gain.trial.values[0]),
            textcoords="offset points",
            xytext=(6, 6),
            fontsize=8,
            color="#444",
        )


def memory_micro_figure(report: ReportData) -> Figure:
    fig, ax = _new_figure()
    points: dict[tuple[str, int], tuple[list[int], list[float]]] = {}
    for trial in report.complete:
        config, status = trial_config(trial), trial_status(trial)
        if config is None or status not in (Status.OK, Status.OOM) or Attr.DUPLICATE_OF in trial.user_attrs:
            continue
        xs, ys = points.setdefault((status, config.max_response_length), ([], []))
        xs.append(config.micro_batch_size)
        ys.append(trial.values[1] / GIB)
    if not points:
        _empty(ax, "no measured probe yet")
        return fig
    lengths = sorted({length for _, length in points})
    for (status, length), (xs, ys) in sorted(points.items()):
        colour = PHASE_COLOURS[lengths.index(length) % len(PHASE_COLOURS)]
        ok = status == Status.OK
        ax.scatter(
            xs,
            ys,
            s=40 if ok else 60,
            marker="o" if ok else "X",
            color=colour,
            alpha=0.85,
            zorder=3,
            label=f"Lr={length}" + ("" if ok else " (OOM)"),
        )
    _budget_lines(ax, report, vertical=False)
    ax.set_xscale("log", base=2)
    micros = sorted({x for xs, _ in points.values() for x in xs})
    ax.set_xticks(micros, [str(m) for m in micros])
    _label(
        ax,
        "micro_batch_size (per GPU)",
        "peak memory per GPU (GiB)",
        "Peak memory against micro batch size (measured probes)",
    )
    return fig


def phases_figure(report: ReportData) -> Figure:
    fig, ax = _new_figure()
    front = [t for t in report.selection.front if (t.user_attrs.get(Attr.RESULT) or {}).get("phase_seconds")][
        :12
    ]
    if not front:
        _empty(ax, "no feasible trial with phase timings")
        return fig
    phases: list[str] = []
    for trial in front:
        phases += [p for p in trial.user_attrs[Attr.RESULT]["phase_seconds"] if p not in phases]
    labels = [_bar_label(t) for t in front]
    left = [0.0] * len(front)
    for i, phase in enumerate(phases):
        widths = [float(t.user_attrs[Attr.RESULT]["phase_seconds"].get(phase, 0.0)) for t in front]
        ax.barh(labels, widths, left=left, color=PHASE_COLOURS[i % len(PHASE_COLOURS)], label=phase)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()  # fastest config on top
    _label(
        ax,
        "seconds per iteration (mean of measured iterations)",
        "",
        "Time per phase, Pareto-front configs",
        "x",
    )
    return fig


def _bar_label(trial: FrozenTrial) -> str:
    c = trial_config(trial)
    mark = "*" if trial.user_attrs.get(Attr.SEED_CONFIG) else ""
    if c is None:
        return f"#{trial.number}{mark}"
    return f"#{trial.number}{mark} T={c.train_batch_size} m={c.micro_batch_size} Lr={c.max_response_length}"


def memory_model_figure(report: ReportData) -> Figure:
    fig, ax = _new_figure()
    calibrated: tuple[list[float], list[float]] = ([], [])
    prior: tuple[list[float], list[float]] = ([], [])
    for trial, predicted, measured in predictions(report):
        xs, ys = calibrated if trial.user_attrs.get(Attr.CALIBRATION_POINTS, 0) >= 1 else prior
        xs.append(measured / GIB)
        ys.append(predicted / GIB)
    if not calibrated[0] and not prior[0]:
        _empty(ax, "no prediction to compare with a measurement yet")
        return fig
    values = [*calibrated[0], *calibrated[1], *prior[0], *prior[1]]
    low, high = min(values) * 0.9, max(values) * 1.1
    ax.plot([low, high], [low, high], color="#888", lw=1, ls="--", label="prediction = measurement")
    if prior[0]:
        ax.scatter(*prior, s=36, color="#999999", label="prior (uncalibrated)", zorder=3)
    if calibrated[0]:
        ax.scatter(*calibrated, s=36, color="#1f77b4", label="calibrated on earlier probes", zorder=3)
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    _label(
        ax,
        "measured peak (GiB)",
        "predicted peak before the probe (GiB)",
        "Memory model: predicted against measured",
    )
    return fig


# --- HTML ---------------------------------------------------------------------------------------------------


def html_table(table: Table, chosen_row: str | None = None, header: bool = True) -> str:
    headers, rows = table
    if not rows:
        return "<p><em>(none)</em></p>"
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>" if header else ""
    body = []
    for row in rows:
        css = ' class="chosen"' if chosen_row and row and row[0].startswith(chosen_row) else ""
        body.append(f"<tr{css}>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>{body}</section>'


def _copy(report: ReportData) -> str:
    """What to copy, side by side on a wide screen: the configuration, and how to start verl on it."""
    chosen = report.selection.chosen
    if chosen is None:
        tips = "".join(
            f"<h3>Trial #{n}</h3><ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in tips) + "</ul>"
            for n, tips in report.advice.items()
        )
        return f"<p>The closest trials, and what to change:</p>{html_table(closest_table(report))}{tips}"
    assert report.export is not None  # report.data exports whenever it has a chosen trial
    trainer, export = report.plan.trainer, report.export
    summary = trainer.export_file + (f" and how sizes map to {trainer.label}" if export.notes else "")
    notes = "".join(f"<li>{html.escape(line)}</li>" for line in export.notes)
    return (
        '<div class="copy"><div><h3>The configuration (best_config.yaml)</h3>'
        f"<pre>{html.escape(config_yaml(report))}</pre></div>"
        f"<div><h3>Start {html.escape(trainer.label)} on it</h3>"
        f"<p>Replace {html.escape(trainer.launch_edits)}:</p>"
        f'<pre class="launch">{html.escape(launch_line(report))}</pre>'
        f"<details><summary>{html.escape(summary)}</summary><pre>{html.escape(export.text)}</pre>"
        f"{f'<ul>{notes}</ul>' if notes else ''}</details></div></div>"
    )


def _lead(report: ReportData) -> str:
    """The verdict, the gain and any warning: the first lines of the page."""
    verdict = html.escape(verdict_line(report))
    css = "verdict" if report.selection.chosen else "verdict bad"
    gains = "".join(f'<p class="gain">{html.escape(line)}</p>' for line in gain_lines(report))
    warnings = "".join(f'<p class="warn">{html.escape(line)}</p>' for line in conditions_lines(report))
    return f'<p class="{css}">{verdict}</p>{gains}{warnings}'


def render_html(report: ReportData) -> str:
    chosen = report.selection.chosen
    chosen_row = f"#{chosen.number}" if chosen is not None else None
    sections = [
        *_decision_sections(report, chosen_row),
        *_plot_sections(report, chosen_row),
        _section("trials", "Every trial", html_table(trials_table(report), chosen_row)),
        _section("cost", "Cost of the study", html_table(cost_table(report), header=False)),
        f'<p class="meta">{html.escape(legend_line(report))}</p>',
    ]
    title = f"autotune report: {report.study_name}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{html.escape(title)}</title><style>{CSS}</style></head>'
        f"<body><h1>{html.escape(title)}</h1>{_lead(report)}{''.join(sections)}</body></html>\n"
    )


def _decision_sections(report: ReportData, chosen_row: str | None) -> list[str]:
    """What the study decided, before any plot: what to copy, verl's keys, the gain, the near misses, the
    study and its re-measures. A section with nothing to say is left out, not shown empty."""
    sections = [_section("copy", "What to copy" if chosen_row else "What to change", _copy(report))]
    if report.export is not None and report.export.knobs:
        lead = f"<p>{html.escape(report.export.knobs_lead)}</p>"
        table = html_table(defaults_table(report))
        sections.append(_section("trainer-defaults", knobs_title(report), lead + table))
    sections.append(_section("gains", "Gain over the hand-made configs", html_table(gains_table(report))))
    if report.near_misses:
        table = html_table(near_miss_table(report))
        sections.append(_section("near-misses", "Near misses: faster, but not picked", table))
    study_text = "<br>".join(html.escape(line) for line in study_lines(report))
    sections.append(_section("study", "The study", f'<p class="meta">{study_text}</p>'))
    if report.remeasured:
        lead = f"<p>{html.escape(remeasured_lead(report))}</p>"
        table = html_table(remeasured_table(report), chosen_row)
        sections.append(_section("remeasured", "Re-measured before the pick", lead + table))
    return sections


def _plot_sections(report: ReportData, chosen_row: str | None) -> list[str]:
    """The four plots, each with its caption and, where one reads it, the table behind it."""
    budget_caption = (
        f"Solid red: the budget ({gib(report.budget.bytes)} GiB); dashed: budget less headroom "
        f"({gib(report.budget.limit)} GiB), the feasibility limit."
    )
    pareto = _figure(
        _svg(pareto_figure(report), "pareto-front"),
        budget_caption + " Points beyond the right edge are clipped to it.",
    )
    phases_caption = (
        "Mean seconds per iteration of each phase, for the Pareto front's configs (* = a hand-made config)."
    )
    model_caption = (
        "Each point: the peak the model "
        "predicted before launching the probe, against the peak the probe measured."
    )
    return [
        _section(
            "pareto",
            "Pareto front",
            pareto
            + html_table(front_table(report), chosen_row)
            + f'<p class="meta">{html.escape(legend_line(report))}</p>',
        ),
        _section(
            "memory-vs-micro",
            "Peak memory against micro batch size",
            _figure(_svg(memory_micro_figure(report), "memory-vs-micro"), budget_caption),
        ),
        _section("phases", "Time per phase", _figure(_svg(phases_figure(report), "phases"), phases_caption)),
        _section(
            "memory-model",
            "Memory model",
            f"<p>{html.escape(model_error_line(report))}</p>"
            + _figure(_svg(memory_model_figure(report), "memory-model"), model_caption)
            + html_table(memory_model_table(report)),
        ),
    ]
