"""The report's tables, shared by report.md and report.html so that both say the same thing.

Each table is `(headers, rows)` of display strings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optuna.trial import FrozenTrial

from autotune.config.knobs import ProbeConfig
from autotune.formats.verl import format_value
from autotune.probe.conditions import worst_disturbance
from autotune.report import pick
from autotune.report.lines import SHORT_NAMES, VERL_WORDS, verl_short
from autotune.report.missing_gain import no_gain_line
from autotune.status import Attr, Status
from autotune.study.trials import describe_budget, trial_config, trial_environment, trial_status
from autotune.trainers.registry import Trainer
from autotune.units import gib

if TYPE_CHECKING:
    from autotune.report.data import Gain, ReportData
    from autotune.study.plan import StudyPlan

__all__ = [
    "Table",
    "closest_table",
    "conditions_lines",
    "cost_table",
    "default_lines",
    "defaults_table",
    "front_table",
    "gain_lines",
    "gains_table",
    "knob_cells",
    "knobs_title",
    "legend_line",
    "memory_model_table",
    "model_error_line",
    "near_miss_table",
    "recipe_lines",
    "remeasured_lead",
    "remeasured_line",
    "remeasured_table",
    "seconds",
    "step_gain",
    "study_lines",
    "transfer_line",
    "trials_table",
    "verdict_line",
]

Table = tuple[list[str], list[list[str]]]
KNOB_COLUMNS = (  # short names as in the run's trial lines (run.live), explained by legend_line
    ("T", "train_batch_size"),
    ("R", "rollout_batch_size"),
    ("m", "micro_batch_size"),
    ("g", "gradient_accumulation_steps"),
    ("lm", "forward_micro_batch_size"),
    ("w", "num_rollout_workers"),
    ("Lp", "max_prompt_length"),
    ("Lr", "max_response_length"),
    ("ckpt", "gradient_checkpointing"),
    ("shard", "sharding"),
    ("offload", "offload"),  # which of the three offloads, if any
)
VERL_COLUMN_LEGEND = f" verl: verl's own knobs the configuration sets ({VERL_WORDS})."
OFFLOAD_NAMES = (("param_offload", "param"), ("optimizer_offload", "optim"), ("offload_policy", "policy"))
MAX_ROWS = 40


def seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    return f"{value / 60:.1f} min" if value >= 120 else f"{value:.1f} s"


TRAINER_KNOBS = "trainer_knobs"  # the column of verl's own knobs (not a ProbeConfig field)


def knob_columns(report: ReportData) -> tuple[tuple[str, str], ...]:
    """The knob columns: a `verl` column too when some trial sets verl's own knobs (--engine verl)."""
    configs = (trial_config(t) for t in report.trials)
    if any(c is not None and verl_short(c) for c in configs):
        return (*KNOB_COLUMNS, ("verl", TRAINER_KNOBS))
    return KNOB_COLUMNS


def knob_cells(trial: FrozenTrial, columns: tuple[tuple[str, str], ...] = KNOB_COLUMNS) -> list[str]:
    config = trial_config(trial)
    if config is None:
        return ["-"] * len(columns)
    return [_cell(config, attr) for _, attr in columns]


def _cell(config: ProbeConfig, attr: str) -> str:
    if attr == TRAINER_KNOBS:
        return verl_short(config) or "-"
    if attr == "offload":
        return "+".join(short for name, short in OFFLOAD_NAMES if getattr(config, name)) or "off"
    value = getattr(config, attr)
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _figures(trial: FrozenTrial) -> list[str]:
    result = trial.user_attrs.get(Attr.RESULT) or {}
    tokens = result.get("tokens_per_sec")
    return [f"{trial.values[0]:.3f}", "-" if tokens is None else f"{tokens:.1f}", gib(trial.values[1])]


def front_table(report: ReportData) -> Table:
    columns = knob_columns(report)
    chosen = report.selection.chosen
    headers = ["trial", "samples/s", "tokens/s", "peak GiB", *(h for h, _ in columns), "seed config"]
    rows = []
    for trial in report.selection.front:
        mark = " (chosen)" if chosen is not None and trial.number == chosen.number else ""
        if Attr.DUPLICATE_OF in trial.user_attrs:
            mark = f" (= #{trial.user_attrs[Attr.DUPLICATE_OF]})"
        rows.append(
            [
                f"#{trial.number}{mark}",
                *_figures(trial),
                *knob_cells(trial, columns),
                str(trial.user_attrs.get(Attr.SEED_CONFIG) or ""),
            ]
        )
    return headers, rows


def remeasured_table(report: ReportData) -> Table:
    """Each contender re-measured before the pick: every samples/sec figure, their mean and spread."""
    columns = knob_columns(report)
    chosen = report.selection.chosen
    headers = [
        "trial",
        "samples/s measured",
        "mean",
        "spread",
        "highest peak GiB",
        *(h for h, _ in columns),
    ]
    rows = []
    for trial, found in report.remeasured:
        mark = " (chosen)" if chosen is not None and trial.number == chosen.number else ""
        rows.append(
            [
                f"#{trial.number}{mark}",
                ", ".join(f"{speed:.3f}" for speed in found.speeds),
                f"{found.mean:.3f}",
                f"{found.spread:.1%}",
                gib(max(found.peaks)),
                *knob_cells(trial, columns),
            ]
        )
    return headers, rows


def remeasured_line(report: ReportData) -> str:
    """One line: the contenders' mean samples/sec and how many probes each mean holds."""
    means = ", ".join(
        f"#{trial.number} {found.mean:.3f} ({found.count} probe{'s' if found.count > 1 else ''})"
        for trial, found in report.remeasured
    )
    return f"picked by the mean samples/s of the contenders within {pick.NOISE:.0%} of the fastest: {means}"


def remeasured_lead(report: ReportData) -> str:
    return (
        f"The configurations within {pick.NOISE:.0%} of the fastest measurement (a probe's samples/sec "
        f"varies by about that much) were probed again, one after the other; the pick is the best mean "
        f"whose every peak stayed within {gib(report.budget.limit)} GiB."
    )


def closest_table(report: ReportData) -> Table:
    columns = knob_columns(report)
    headers = ["trial", "status", "peak GiB", "over limit GiB", *(h for h, _ in columns)]
    rows = []
    for trial in report.selection.closest:
        over = max(0.0, trial.values[1] - report.budget.limit)
        rows.append(
            [
                f"#{trial.number}",
                trial_status(trial),
                gib(trial.values[1]),
                gib(over),
                *knob_cells(trial, columns),
            ]
        )
    return headers, rows


def gains_table(report: ReportData) -> Table:
    headers = [
        "hand-made config",
        "trial",
        "status",
        "samples/s",
        "peak GiB",
        "tuned / hand-made",
        f"from {report.plan.trainer.label}'s knobs",
        "measured",
    ]
    rows = []
    for gain in report.gains:
        t = gain.trial
        ratio = (
            f"{gain.ratio:.2f}x"
            if gain.ratio
            else (
                "runs where it did not" if report.selection.chosen and trial_status(t) != Status.OK else "-"
            )
        )
        verl = (
            "-"
            if gain.verl is None
            else f"{gain.verl.ratio:.2f}x ({gain.verl.low:.2f}-{gain.verl.high:.2f}x)"
        )
        speed = f"{gain.seed_speed:.3f}" if gain.seed_speed is not None else "—"  # not measured: not 0
        peak = gib(t.values[1]) if t.values and t.values[1] else "—"
        basis = "back to back, in turn" if gain.back_to_back else "first probes (not back to back)"
        rows.append([gain.name, f"#{t.number}", trial_status(t), speed, peak, ratio, verl, basis])
    return headers, rows


def predictions(report: ReportData) -> list[tuple[FrozenTrial, int, float]]:
    """(trial, peak predicted before the probe, measured peak) of each original ok probe with a prediction."""
    return [
        (trial, trial.user_attrs[Attr.PREDICTED_PEAK_BYTES], trial.values[1])
        for trial in report.complete
        if trial_status(trial) == Status.OK
        and trial.user_attrs.get(Attr.PREDICTED_PEAK_BYTES)
        and Attr.DUPLICATE_OF not in trial.user_attrs
    ]


def memory_model_table(report: ReportData) -> Table:
    headers = ["trial", "predicted GiB", "measured GiB", "error", "calibration points"]
    rows = []
    for trial, predicted, measured in predictions(report):
        rows.append(
            [
                f"#{trial.number}",
                gib(predicted),
                gib(measured),
                f"{(predicted - measured) / measured:+.1%}",
                str(trial.user_attrs.get(Attr.CALIBRATION_POINTS, 0)),
            ]
        )
    return headers, rows[:MAX_ROWS]


def cost_table(report: ReportData) -> Table:
    cost = report.cost
    rows = [
        ["trials", str(cost["trials"])],
        ["probes run", str(cost["probes_run"])],
        ["probes avoided", str(cost["probes_avoided"])],
    ]
    rows += [[f"  avoided: {status}", str(count)] for status, count in cost["avoided_by_status"].items()]
    rows += [
        ["total probe wall time", seconds(cost["probe_wall_seconds"])],
        ["study span (first start to last finish)", seconds(cost["study_span_seconds"])],
    ]
    if cost["running"]:
        rows.append(["still running", str(cost["running"])])
    return ["", ""], rows


def model_error_line(report: ReportData) -> str:
    error, count = report.model_error
    if error is None:
        return "No probe was measured after the memory model's calibration yet."
    return (
        f"Median relative error of the memory model's predictions made before each probe (once calibrated "
        f"on this study's measurements): {error:.1%} over {count} probes."
    )


def knobs_title(report: ReportData) -> str:
    """`verl's keys beside verl's defaults`: the title of `defaults_table`."""
    trainer = report.plan.trainer
    return f"{trainer.keys_name} beside {trainer.label}'s defaults"


def defaults_table(report: ReportData) -> Table:
    """The exported keys beside the trainer's defaults: those that differ first, in the file's order."""
    assert report.export is not None
    label = report.plan.trainer.label
    knobs = sorted(report.export.knobs, key=lambda knob: not knob.differs)
    rows = [[k.key, format_value(k.value), format_value(k.default), k.why] for k in knobs]
    return [f"{label} key", "exported", f"{label}'s default", "why"], rows


def default_lines(report: ReportData) -> list[str]:
    """For the terminal: the exported keys a rule or the memory set away from the trainer's defaults."""
    knobs = report.export.knobs if report.export is not None else ()
    label = report.plan.trainer.label
    return [
        f"  {k.key}={format_value(k.value)} ({label}'s default {format_value(k.default)}): {k.why}"
        for k in knobs
        if k.set_by_rule
    ]


def launch_line(report: ReportData, path: str | None = None) -> str:
    """The command that starts the study's trainer on its exported file (`path`, default the file's name: run
    beside it); replace the /path/to/ parts."""
    trainer = report.plan.trainer
    values = report.export.launch_values if report.export is not None else {}
    return trainer.launch_line(
        path or trainer.export_file, report.plan.gpus, values, report.plan.reward_model
    )


def study_lines(report: ReportData) -> list[str]:
    ctx = report.plan
    space = f", space {ctx.space_name}" if ctx.space_name else ""
    return [
        f"Study {report.study_name}{space}: model {ctx.model}, reward {ctx.reward_model}, {ctx.gpus} GPU(s).",
        *recipe_lines(ctx),
        f"Memory budget per GPU: {describe_budget(report.budget)}.",
        f"Written {report.created}.",
    ]


def recipe_lines(plan: StudyPlan) -> list[str]:
    """The recipe the study held fixed, in one line, then the recipe knobs it searched, flagged: those change
    what is trained, not only how fast. Nothing for a study that did not record its recipe (older ones)."""
    recipe, tune = plan.recipe or {}, list(plan.tune or [])
    if not recipe:
        return []
    lines = ["Recipe held fixed: " + ", ".join(_recipe_parts(recipe, tune)) + "."]
    if tune:
        searched = "; ".join(f"{name} {_listed(recipe.get(name))}" for name in tune)
        lines.append(f"Searched recipe knobs (an algorithm change, not only speed): {searched}.")
    return lines


def _recipe_parts(recipe: dict, tune: list[str]) -> list[str]:
    fixed = {name: value for name, value in recipe.items() if name not in tune}
    train, mini = fixed.get("train_batch_size"), fixed.get("mini_batch_size")
    parts = [] if train is None else [f"train batch {train}"]
    if mini is not None:
        steps = f" ({train // mini} optimizer steps per iteration)" if train and train % mini == 0 else ""
        parts.append(f"mini batch {mini}{steps}")
    prompt, response = fixed.get("max_prompt_length"), fixed.get("max_response_length")
    if prompt is not None and response is not None:
        parts.append(f"prompt/response {prompt}/{response} tokens")
    else:
        parts += [
            f"{name} {fixed[name]}" for name in ("max_prompt_length", "max_response_length") if name in fixed
        ]
    parts.append(str(recipe.get("algorithm", "?")).upper())
    parts.append(f"rollout_n {recipe.get('rollout_n', '?')}")
    kl = recipe.get("kl_coef")
    parts.append("no KL" if kl == 0 else f"KL {kl:g}" if isinstance(kl, (int, float)) else "KL ?")
    lora = recipe.get("lora") or {}
    parts.append(f"LoRA r{lora.get('r')} alpha {lora.get('alpha')}" if lora.get("enabled") else "no LoRA")
    return parts


def _listed(values: object) -> str:
    return f"({', '.join(map(str, values))})" if isinstance(values, list) else str(values)


# --- what leads the report: the verdict, the gain, the near misses, every trial ----------------------------


def verdict_line(report: ReportData) -> str:
    """`Recommended: trial #7, 4.48 samples/s (mean of 3 probes) at 0.601 GiB peak per GPU (limit ...)`."""
    chosen, figures = report.selection.chosen, report.headline
    if chosen is None and not report.complete:
        return "No trial was measured yet: nothing to recommend."
    if chosen is None or figures is None:
        return f"No feasible configuration: no trial ran within {gib(report.budget.limit)} GiB per GPU."
    return (
        f"Recommended: trial #{chosen.number}, {figures.samples_per_sec:.3f} samples/s ({figures.basis}) at "
        f"{gib(figures.peak_bytes)} GiB peak per GPU (feasible <= {gib(report.budget.limit)} GiB)."
    )


def gain_lines(report: ReportData) -> list[str]:
    """Each gain as verl would see it, with what it rests on: back to back with the range of its pairwise
    ratios (or "no gain beyond noise" when that range reaches 1), or the first measurements (with the warning
    that the machine's load may have made it), and what other work took meanwhile."""
    lines = []
    for g in report.gains:
        busy = f"; during those probes {'; '.join(g.conditions)}" if g.conditions else ""
        if g.verl is not None:
            lines.append(_back_to_back_line(g, busy, report.plan.trainer))
        elif g.ratio:
            basis = (
                "first measurements, not back to back: the machine's load at each probe may account for "
                "part of it"
            )
            lines.append(f"{g.ratio:.2f}x the samples/s of the hand-made config '{g.name}' ({basis}{busy}).")
        elif report.selection.chosen and (
            missing := no_gain_line(g, report.plan.settings.get("timeout_seconds"))
        ):
            lines.append(missing)
    transfer = transfer_line(report)
    return lines + ([transfer] if transfer and lines else [])


EXAMPLE_GENERATION_SHARE = 0.5  # an example share of generation in a verl step, when no log says it


def step_gain(gain: float, generation_share: float) -> float:
    """A gain in the training phases as a gain per step, where generation (not sped up) takes `share` of the
    time (Amdahl): 1 / (f + (1 - f) / gain)."""
    return 1.0 / (generation_share + (1.0 - generation_share) / gain)


def transfer_line(report: ReportData) -> str | None:
    """What the gain in the phases verl shares with the probe makes of a verl step (verl's passes only: the
    probe's rollout is synthetic, vLLM generates in the real job)."""
    passes = report.plan.passes
    if passes is None or not passes.packed:
        return None
    found = [g.verl.ratio if g.verl is not None else g.ratio for g in report.gains]
    ratios = [r for r in found if r is not None and r > 0]
    if not ratios:
        return None
    share = report.plan.generation_share
    known = share is not None
    f = share if share is not None else EXAMPLE_GENERATION_SHARE
    whose = "as the verl log says" if known else "an example; `run --verl-log FILE` takes your run's"
    return (
        f"These samples/s are verl's training phases (old and reference log-probs, values, updates): the "
        f"probe's rollout is synthetic, and verl generates in vLLM. Where generation takes {f:.0%} of a verl "
        f"step ({whose}), {ratios[0]:.2f}x here is {step_gain(ratios[0], f):.2f}x per step "
        f"(1 / (f + (1 - f) / gain))."
    )


def _back_to_back_line(g: Gain, busy: str, trainer: Trainer) -> str:
    """`1.32x the samples/s of the hand-made config 'x' from verl's knobs (back to back: every pair of
    measurements 1.24-1.41x)`, or that no gain stands out of the probes' noise."""
    spread = g.verl
    assert spread is not None
    name = trainer.label
    pairs = f"every pair of back-to-back measurements {spread.low:.2f}-{spread.high:.2f}x"
    extra = ""
    if g.probe_only is not None:
        extra = (
            f"; {', '.join(trainer.unread_knobs())}, which {name} does not read, made "
            f"{g.probe_only.ratio:.2f}x more in the probe (not in a {name} job)"
        )
    if not spread.beyond_noise:
        return (
            f"no gain beyond the probes' noise over the hand-made config '{g.name}' from {name}'s knobs: "
            f"{spread.ratio:.2f}x ({pairs}){extra}{busy}."
        )
    return (
        f"{spread.ratio:.2f}x the samples/s of the hand-made config '{g.name}' from the knobs {name} "
        f"reads ({pairs}){extra}{busy}."
    )


def conditions_lines(report: ReportData) -> list[str]:
    """A warning when other work slowed probes: their samples/s understate their configurations."""
    if not report.disturbed:
        return []
    numbers = ", ".join(f"#{trial.number}" for trial, _ in report.disturbed)
    worst = worst_disturbance([trial_environment(trial) for trial, _ in report.disturbed])
    return [
        f"Warning: probes {numbers} ran while other work used the machine ({worst}): their samples/s "
        f"understate their configurations (the trial table says how much each saw); re-run on a quiet "
        f"machine, or `autotune report --confirm` to measure the pick and the hand-made configs again."
    ]


def near_miss_table(report: ReportData) -> Table:
    columns = knob_columns(report)
    headers = ["trial", "samples/s", "peak GiB", *(h for h, _ in columns), "why it was not picked"]
    rows = [
        [f"#{miss.trial.number}", *_figures(miss.trial)[::2], *knob_cells(miss.trial, columns), miss.why]
        for miss in report.near_misses
    ]
    return headers, rows


def trials_table(report: ReportData) -> Table:
    """Every trial, in order: status, configuration, figures, and what else a reader needs."""
    columns = knob_columns(report)
    headers = [
        "trial",
        "status",
        "samples/s",
        "peak GiB",
        "predicted GiB",
        "seconds",
        *(h for h, _ in columns),
        "note",
    ]
    rows = []
    disturbed = dict((t.number, text) for t, text in report.disturbed)
    for trial in report.trials:
        attrs = trial.user_attrs
        result = attrs.get(Attr.RESULT) or {}
        done = trial.values is not None
        ok = done and trial_status(trial) == Status.OK
        notes = []
        if attrs.get(Attr.SEED_CONFIG):
            notes.append(f"hand-made '{attrs[Attr.SEED_CONFIG]}'")
        if attrs.get(Attr.DUPLICATE_OF) is not None:
            notes.append(f"= #{attrs[Attr.DUPLICATE_OF]}")
        if trial.number in disturbed:
            notes.append(disturbed[trial.number])
        if not ok and result.get("message"):
            notes.append(str(result["message"]).splitlines()[0][:100])
        predicted = attrs.get(Attr.PREDICTED_PEAK_BYTES)
        rows.append(
            [
                f"#{trial.number}",
                trial_status(trial),
                f"{trial.values[0]:.3f}" if ok else "-",
                gib(trial.values[1]) if done and trial.values[1] else "-",
                gib(predicted) if predicted else "-",
                f"{result['wall_seconds']:.0f}" if result.get("wall_seconds") else "-",
                *knob_cells(trial, columns),
                "; ".join(notes),
            ]
        )
    return headers, rows


def legend_line(report: ReportData | None = None) -> str:
    """The short column names, explained (the `verl` column too where the report has one)."""
    words = dict((short, text) for short, _, text in SHORT_NAMES)
    parts = [f"{short} {words.get(short, attr)}" for short, attr in KNOB_COLUMNS if short in words]
    return (
        "Columns: "
        + ", ".join(parts)
        + "; ckpt gradient checkpointing; shard how the training states are split over the GPUs (replicate: "
        "every GPU holds all; full_shard / shard_grad_op: FSDP); offload which states wait on the CPU."
        + (VERL_COLUMN_LEGEND if report is not None and len(knob_columns(report)) > len(KNOB_COLUMNS) else "")
    )
