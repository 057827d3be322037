"""`report.md`: the report as Markdown, from the same tables as report.html."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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
    remeasured_lead,
    remeasured_table,
    study_lines,
    trials_table,
    verdict_line,
)

if TYPE_CHECKING:
    from autotune.report.data import ReportData

__all__ = ["md_table", "render_markdown"]


# --- Markdown ---------------------------------------------------------------------------------------------


def md_table(table: Table) -> str:
    headers, rows = table
    if not rows:
        return "_(none)_\n"
    cells = [headers, ["---"] * len(headers), *rows]
    return "".join("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |\n" for row in cells)


def render_markdown(report: ReportData) -> str:
    parts = [f"# autotune report: {report.study_name}\n\n", f"**{verdict_line(report)}**\n\n"]
    parts += [f"{line}  \n" for line in gain_lines(report)]
    parts += [f"\n> {line}\n" for line in conditions_lines(report)]
    parts += ["\n## What to copy\n\n" if report.selection.chosen else "\n## What to change\n\n"]
    parts += _recommendation_md(report)
    if report.export is not None and report.export.knobs:
        parts += [f"\n## {knobs_title(report)}\n\n", f"{report.export.knobs_lead}\n\n"]
        parts += [md_table(defaults_table(report))]
    parts += ["\n## Gain over the hand-made configs\n\n", md_table(gains_table(report))]
    if report.near_misses:
        parts += ["\n## Near misses: faster, but not picked\n\n", md_table(near_miss_table(report))]
    parts += ["\n## The study\n\n", *(f"{line}  \n" for line in study_lines(report))]
    if report.remeasured:
        parts += ["\n## Re-measured before the pick\n\n", remeasured_lead(report), "\n\n"]
        parts += [md_table(remeasured_table(report))]
    parts += [
        "\n## Pareto front (feasible trials: samples/s up, peak memory down)\n\n",
        md_table(front_table(report)),
        f"\n{legend_line(report)}\n",
    ]
    parts += ["\n## Every trial\n\n", md_table(trials_table(report))]
    parts += [
        "\n## Memory model: predicted against measured\n\n",
        model_error_line(report),
        "\n\n",
        md_table(memory_model_table(report)),
    ]
    parts += ["\n## Cost of the study\n\n", md_table(cost_table(report))]
    parts += [f"\n{legend_line(report)}\n"]
    parts += ["\n## Files\n\n", "- `trials.csv`: every trial\n- `report.html`: this report with plots\n"]
    parts += [
        "- `summary.json`: the pick, its figures, the gain, the files and the launch line, for scripts\n"
    ]
    parts += ["- `run.log`: the run's lines with time stamps (written by `autotune run`)\n"]
    if report.best_config is not None:
        trainer = report.plan.trainer
        parts += [
            "- `best_config.yaml`: the recommendation in the seed article's config schema, with its "
            "`measured:` figures\n",
            f"- `{trainer.export_file}`: the same job as {trainer.file_description} (launched as above)\n",
        ]
    return "".join(parts)


def _recommendation_md(report: ReportData) -> list[str]:
    chosen = report.selection.chosen
    if chosen is None:
        parts = [
            f"No trial ran within {gib(report.budget.limit)} GiB. The closest trials, and what to "
            "change:\n\n",
            md_table(closest_table(report)),
        ]
        for number, tips in report.advice.items():
            parts += [f"\nTrial #{number}:\n\n", *(f"- {tip}\n" for tip in tips)]
        return parts
    assert report.export is not None  # report.data exports whenever it has a chosen trial
    trainer = report.plan.trainer
    fence = Path(trainer.export_file).suffix.lstrip(".")  # yaml, txt
    parts = [
        "The configuration (best_config.yaml without its `measured:` block):\n\n```yaml\n",
        config_yaml(report),
        f"```\n\n**Start {trainer.label} on it** (replace {trainer.launch_edits}):\n\n```bash\n",
        launch_line(report) + "\n",
        f"```\n\n**{trainer.export_file}:**\n\n```{fence}\n",
        report.export.text,
        "```\n",
    ]
    if report.export.notes:
        parts += ["\n", *(f"- {line}\n" for line in report.export.notes)]
    return parts
