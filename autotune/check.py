"""`autotune check`: every finding of an existing config at once, each on one line with the rule and the fix.

    result = check(CheckOptions(path=Path("config.yaml"), gpus=4, gpu="a100-40g"))
    print_result(result); sys.exit(result.exit_code)   # 0 clean (warnings allowed), 1 problems, 2 UserError

Input: the seed article's schema (its hand-made configs, and autotune's best_config.yaml) or a verl override
file (`key=value` lines, as verl_overrides.txt), read by `autotune.formats.read` with one layout rule for
both: a file that names no sharding is held as verl holds it by default, FSDP full-shard (the header says so).
Each finding has a severity: a problem (a broken rule, a config that will not fit: exit 1), a warning (the
article's advice: exit 0) or a note (context). The findings:
- the configuration rules (`autotune.config.rules`), the same the study and `autotune probe` enforce; for an
  override file verl 0.9.1's own rules on its keys instead of the divisibility rules, and a warning for each
  key verl accepts but its default trainer (V1, sync) does not read (`autotune.formats.verl_table`);
- num_rollout_workers against the cores `--cores` gives (the training machine's): a warning (the article's
  advice, not an invariant); without it a note, never this machine's cores (the file is for another);
- a rollout batch so small that the GPUs may starve: the article flags a rollout batch below 64 in examples
  of 1-2 GPUs, i.e. 32 sequences per GPU; autotune asks R >= 64 and R/W >= 32. A warning, and only a note when
  the file carries the study's measurement of this config (a heuristic never overrules a measurement); not for
  a verl file (verl has no rollout batch: a step's prompts generate together);
- the lengths against a dataset's suggestions (`--data`), and against the model's position embeddings;
- a reward model marked trainable;
- memory, judged as the study judges it: peak <= budget × (1 − headroom) fits, above the card is a problem,
  between them a warning. A best_config.yaml with a `measured:` block is judged by its measured peak against
  the budget and headroom recorded there, the memory model's prediction shown beside it as information. Asked
  about a card (--gpu, --memory-budget) or another GPU count, the study's memory model decides (`MemoryModel`,
  built as `run.prepare` builds it: the device's priors; calibrated on the file's measurement when that was
  taken on CUDA), with the states held as the config holds them (`autotune.memory.sharded`; HF generate, not
  vLLM; for a verl file without the generate phase, since verl's rollout is vLLM's pool),
  the measurement shown for reference; first aid when it does not fit (`autotune.memory.advice`: a switch
  that fits alone, gradient checkpointing or sharding, before the article's steps and shorter lengths).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config.job_lengths import JobLengths
from autotune.config.knobs import ProbeConfig
from autotune.config.rules import (
    Finding,
    config_findings,
    model_findings,
    problems,
    value_findings,
    worker_findings,
)
from autotune.errors import UserError
from autotune.formats.read import read_target
from autotune.formats.target import ASSUMED, Measured, Target
from autotune.memory.architecture import Architecture
from autotune.memory.budget import Budget
from autotune.memory.gpus import gpu_memory_gib, normalise
from autotune.memory.verdict import (
    memory_findings,
)
from autotune.models.names import registry_name
from autotune.probe.traced import TracedCheck
from autotune.probe.verl.run_log import job_lengths
from autotune.trainers.registry import DEFAULT_TRAINER, trainer_of_file
from autotune.units import GIB, divisors

if TYPE_CHECKING:
    from autotune.data.lengths import LengthReport

__all__ = ["CheckOptions", "CheckResult", "check", "print_result", "rollout_findings", "run"]

MIN_ROLLOUT, MIN_ROLLOUT_PER_GPU = 64, 32  # see the module docstring
LENGTH_WASTE = 2.0  # a limit above 2x the data's suggestion wastes memory
WARNING = "warning"  # advice: shown with its fix, but the exit code stays 0
VERL_NAMES = (
    "below, autotune's knob names stand for verl's keys: train_batch_size = data.train_batch_size × "
    "rollout.n, micro_batch_size = actor.ppo_micro_batch_size_per_gpu, num_rollout_workers = "
    "data.dataloader_num_workers, max_prompt_length/max_response_length = data.max_prompt_length/"
    "max_response_length; verl has no rollout batch (a step's prompts generate together: rollout_batch_size "
    "reads as train_batch_size), and its rollout memory is vLLM's pool, not the probe's generate phase"
)


@dataclass
class CheckOptions:
    path: Path
    gpus: int | None = None
    gpu: str | None = None
    memory_gib: float | None = None
    data: Path | None = None
    model: str | None = None
    cores: int | None = None
    prompt_key: str | None = None
    response_key: str | None = None
    verl_log: Path | None = None  # a previous verl run's log: its response lengths (and prompts without data)
    trace: bool = False  # also trace the training passes under FakeTensorMode (autotune.probe.rank.trace)
    verl_python: str | None = None  # with trace: run it in verl's environment, with verl's per-token math
    trace_lengths: str | None = None  # with trace: "data" or "max" (TRACE_LENGTHS); None: the verdict's
    call: int | None = None  # a launch script's N-th trainer call (--call)
    say: Callable[[str], None] = lambda line: None  # progress while it runs (the trace's estimate and passes)


@dataclass
class CheckResult:
    path: str
    target: Target
    gpus: int
    card: str | None  # "a100-40g (40.0 GiB)"
    findings: list[Finding]
    memory: dict[str, Any] | None = None
    traced: TracedCheck | None = None

    @property
    def problems(self) -> list[Finding]:
        return problems(self.findings)

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.target.kind,
            "model": self.target.model,
            "gpus": self.gpus,
            "card": self.card,
            "config": self.target.config.to_dict() if self.target.config else None,
            "sharding": self.target.sharding,
            "memory": self.memory,
            "trace": self.traced.to_dict() if self.traced else None,
            "layout_assumed": self.target.layout_assumed,
            "findings": [f.to_dict() for f in self.findings],  # each with its severity
            "problems": [f.to_dict() for f in self.problems],
            "warnings": [f.to_dict() for f in self.warnings],
            "notes": [f.to_dict() for f in self.findings if f.severity == "note"],
            "exit_code": self.exit_code,
        }


# --- rules -----------------------------------------------------------------------------------------------


def _rule_findings(config: ProbeConfig, gpus: int, cores: int | None, verl: bool) -> list[Finding]:
    """The configuration rules; an override file is judged by verl's own rules instead of the divisibility
    rules (the same rules in verl's terms). The workers are judged against the cores of the machine the file
    is for: `--cores` says them; this machine's are not that machine's, so without it they are not judged."""
    judged = cores if cores is not None else max(1, config.num_rollout_workers)  # nothing to exceed
    if verl:  # the sizes' bounds hold for any config; the divisibility rules are verl's own, checked apart
        found = value_findings(config) + worker_findings(config, judged)
    else:
        found = config_findings(config, gpus, judged)
    # workers vs cores is the article's advice (more workers than cores contend), not a broken invariant
    found = [dataclasses.replace(f, severity=WARNING) if f.check == "workers" else f for f in found]
    if cores is None:
        found.append(
            Finding(
                "workers",
                f"num_rollout_workers={config.num_rollout_workers} not checked against cores: they are the "
                f"training machine's, not this one's; pass --cores N to check them",
                severity="note",
            )
        )
    return found


def rollout_findings(c: ProbeConfig, gpus: int, measured: Measured | None = None) -> list[Finding]:
    """A rollout batch so small that the GPUs wait on generation (see the module docstring): a warning, the
    article's heuristic from its GPU examples; a note only when the file carries the study's measurement of
    this very config, which the heuristic does not overrule."""
    need = max(MIN_ROLLOUT, MIN_ROLLOUT_PER_GPU * gpus)
    if c.rollout_batch_size <= 0 or c.rollout_batch_size >= need:
        return []
    rule = (
        f"rollout_batch_size={c.rollout_batch_size} is {c.rollout_batch_size / gpus:g} per GPU on {gpus} "
        f"GPU(s): below the article's {MIN_ROLLOUT} in all and {MIN_ROLLOUT_PER_GPU} per GPU"
    )
    if measured is not None:
        speed = f" at {measured.samples_per_sec:g} samples/s" if measured.samples_per_sec else ""
        note = f"{rule}; the study measured this config{speed} on {measured.where}: the measurement stands"
        return [Finding("rollout", note, severity="note")]
    group = gpus * c.rollout_n
    fit = next((d for d in divisors(c.train_batch_size) if d >= need and d % group == 0), None)
    fix = (
        f"rollout_batch_size: {fit}"
        if fit
        else f"rollout_batch_size >= {need} (and train_batch_size a multiple)"
    )
    problem = f"{rule}: the GPUs may starve waiting on generation (a heuristic: a probe measures it)"
    return [Finding("rollout", problem, fix, severity=WARNING)]


def reward_findings(target: Target) -> list[Finding]:
    if not target.reward_trainable:
        return []
    return [
        Finding(
            "reward",
            "reward_model_config.trainable: true: the reward model would be updated during PPO, the reward "
            "drifts with the policy and the KL explodes (verl freezes it by default)",
            "reward_model_config.trainable: false",
        )
    ]


def length_findings(
    c: ProbeConfig, report: LengthReport, packed: bool = True, prompts: bool = True
) -> list[Finding]:
    """Limits below the data's suggestion truncate; above 2× it they reserve memory nothing uses, where the
    trainer pads to them (TRL); verl packs the tokens the samples have, so a larger limit costs it nothing.
    `prompts` False: the trainer has no prompt limit (TRL 1.16), only the completions' is judged."""
    from autotune.data.lengths import truncated_share

    pairs = []
    if prompts:
        pairs.append(
            ("max_prompt_length", c.max_prompt_length, report.suggested_prompt_length, report.prompts, "p95")
        )
    if report.suggested_response_length is not None:
        pairs.append(
            (
                "max_response_length",
                c.max_response_length,
                report.suggested_response_length,
                report.responses,
                "p90",
            )
        )
    found = []
    for key, value, suggested, counts, rule in pairs:
        if value < suggested:
            share = truncated_share(counts, value)
            found.append(
                Finding(
                    "lengths",
                    f"{key}={value} is below the data's {rule} suggestion {suggested}: it truncates "
                    f"{share:.1%} of the samples",
                    f"{key}: {suggested}",
                )
            )
        elif value > LENGTH_WASTE * suggested and not packed:
            found.append(
                Finding(
                    "lengths",
                    f"{key}={value} is more than {LENGTH_WASTE:g}× the data's {rule} suggestion {suggested}: "
                    f"activations, logits and KV cache are sized for tokens the data never has "
                    f"(memory wasted)",
                    f"{key}: {suggested}",
                )
            )
    return found


def _trl_prompts(
    config: ProbeConfig, report: LengthReport, known: bool, findings: list[Finding]
) -> ProbeConfig:
    """A TRL file's prompts at the data's longest (TRL 1.16 pads a batch to its longest prompt and truncates
    none), in place of the length the file could not say; a study's own file keeps the length it measured."""
    longest = int(report.prompts.max()) if report.prompts.size else config.max_prompt_length
    if known:
        if longest > config.max_prompt_length:
            note = (
                f"the data's longest prompt is {longest} tokens, the study measured "
                f"{config.max_prompt_length}: TRL truncates no prompt, so a batch of the longest takes more "
                f"memory than measured"
            )
            findings.append(Finding("lengths", note, "re-run the study with --data DATA", severity="warning"))
        return config
    note = f"prompts at the data's longest, {longest} tokens: TRL 1.16 pads a batch to its longest prompt"
    findings.append(Finding("lengths", note, severity="note"))
    return dataclasses.replace(config, max_prompt_length=longest)


def verl_findings(overrides: dict[str, Any], gpus: int) -> list[Finding]:
    """verl's rules the file breaks (problems), and the keys verl accepts but its default trainer does not
    read (warnings: the file says more than verl does)."""
    from autotune.formats.verl import verl_rule_violations
    from autotune.formats.verl_table import ignored_keys

    fix = "change the values so the rule holds: verl rejects the config at start-up"
    found = [Finding("verl", v, fix) for v in verl_rule_violations(overrides, gpus)]
    for key, why in ignored_keys(overrides).items():
        problem = f"{key}={overrides[key]}: set but ignored by V1 (verl 0.9.1's default trainer): {why}"
        fix = f"remove {key}, or set what V1 reads"
        found.append(Finding("verl", problem, fix, key=key, severity=WARNING))
    return found


# --- the command -----------------------------------------------------------------------------------------


def _card(options: CheckOptions, target: Target) -> Budget | None:
    """The card asked about (--gpu, --memory-budget), else the study's budget when the file has no usable
    measurement (with one, the measurement's own budget judges it: `memory_findings`)."""
    if options.gpu:
        return Budget(int(gpu_memory_gib(options.gpu) * GIB), name=normalise(options.gpu))
    if options.memory_gib:
        return Budget(int(options.memory_gib * GIB), name="--memory-budget")
    if target.memory_gib and target.measured is None:
        return Budget(int(float(target.memory_gib) * GIB))
    return None


def check(options: CheckOptions) -> CheckResult:
    """Read the config and run every check; UserError for input that cannot be read."""
    target = read_target(options.path, options.gpus, options.call)
    card = _card(options, target)  # an unknown --gpu is a usage error: before any work
    _check_verl_python(options)
    _check_trace_lengths(options)
    gpus = options.gpus or target.gpus or 1
    findings = list(target.findings)
    if options.gpus is None and target.gpus is None:
        findings.append(
            Finding("gpus", "assuming 1 GPU: the config does not say; pass --gpus W", severity="note")
        )
    if target.overrides is not None:
        findings += verl_findings(target.overrides, gpus)
        findings.append(Finding("verl", VERL_NAMES, severity="note"))
    config = target.config
    memory, traced = None, None
    if config is not None:
        findings += _rule_findings(config, gpus, options.cores, verl=target.overrides is not None)
        if trainer_of_file(target) is None:  # autotune's own schema: neither verl nor TRL has a rollout batch
            findings += rollout_findings(config, gpus, target.measured)
        findings += reward_findings(target)
        unpriced = _unpriced(findings)
        if unpriced:  # a size the memory model would price is not a size: no verdict on it
            findings.append(Finding("memory", unpriced, severity="note"))
        else:
            model_findings, memory, traced = _model_checks(options, target, config, gpus, card)
            if options.data is not None and not target.prompt_known:  # the data says it now (`_trl_prompts`)
                findings = [
                    f for f in findings if not (f.check == "lengths" and f.key == "max_prompt_length")
                ]
            findings += model_findings
    else:
        findings.append(
            Finding(
                "memory", "the override file lacks the batch sizes the memory model needs", severity="note"
            )
        )
        if options.trace:
            traced = TracedCheck.not_run("the file lacks the batch sizes the trace needs", gpus)
    label = card.label if card else None
    return CheckResult(str(options.path), target, gpus, label, findings, memory, traced)


def _unpriced(findings: list[Finding]) -> str:
    """'' when every value passed the values check; else why no memory verdict is given, as config_findings
    runs no later rule then: a length of -5 tokens would be priced as if it were one."""
    wrong = sorted({f.key for f in findings if f.check == "values" and f.severity == "problem" and f.key})
    if not wrong:
        return ""
    return f"memory not checked: {', '.join(wrong)} above must be fixed first"


def _check_verl_python(options: CheckOptions) -> None:
    """--verl-python is the trace's: without --trace, or naming no verl 0.9.1, one line (exit 2) before the
    minutes a trace takes."""
    if options.verl_python is None:
        return
    if not options.trace:
        raise UserError(
            f"--verl-python {options.verl_python}: it names the python the trace runs in; add --trace"
        )
    from autotune.probe.traced import verl_trace_python

    verl_trace_python(options.verl_python)


TRACE_LENGTHS = ("data", "max")  # what `check --trace` packs its micro batches from


def _check_trace_lengths(options: CheckOptions) -> None:
    """--trace-lengths is the trace's: without --trace, or asking for the data's lengths with no data or verl
    log to take them from, one line (exit 2) before any work."""
    wanted = options.trace_lengths
    if wanted is None:
        return
    if wanted not in TRACE_LENGTHS:
        raise UserError(f"--trace-lengths {wanted}: one of {', '.join(TRACE_LENGTHS)}")
    if not options.trace:
        raise UserError(f"--trace-lengths {wanted}: it names the lengths the trace runs at; add --trace")
    if wanted == "data" and options.data is None and options.verl_log is None:
        raise UserError(
            "--trace-lengths data: no lengths but the limits; pass --data FILE or --verl-log FILE"
        )


def _trace_lengths(options: CheckOptions, verdict: str, lengths: JobLengths) -> JobLengths:
    """The lengths the trace packs its micro batches from: the verdict's, unless --trace-lengths asks for the
    data's or the limits'."""
    wanted = options.trace_lengths or verdict
    return lengths if wanted == "data" else lengths.at_limits()


def _trace_lengths_note(
    traced: TracedCheck, memory: dict[str, Any], verdict: str, config: ProbeConfig
) -> str:
    """Which lengths the trace took beside the verdict's: on the data's, the worst case at the limits is the
    memory model's (traced with --trace-lengths max)."""
    limits = f"{config.max_prompt_length}+{config.max_response_length} tokens a sample"
    if traced.lengths == "max":
        said = "as the verdict" if verdict == "max" else "the memory verdict is on the data's lengths"
        return f"traced at the limits ({limits}), the worst case; {said}"
    said = "as the verdict" if verdict == "data" else "the memory verdict is at the limits"
    worst = memory.get("at_max_lengths")
    priced = (
        f": the memory model puts it at {worst['predicted_peak_gib']:g} GiB ({worst['verdict']})"
        if worst
        else ""
    )
    return (
        f"traced on the data's lengths, {said}; the worst case at the limits ({limits}) is not "
        f"traced{priced}; --trace-lengths max traces it"
    )


def _model_checks(
    options: CheckOptions, target: Target, config: ProbeConfig, gpus: int, card: Budget | None
) -> tuple[list[Finding], dict[str, Any] | None, TracedCheck | None]:
    """Lengths against the data, positions and memory: the checks that need the model."""
    from autotune.models.catalog import resolve_model

    name = options.model or registry_name(target.model)
    findings: list[Finding] = []
    report = None
    passes = (trainer_of_file(target) or DEFAULT_TRAINER).file_passes  # TRL 1.16 runs a TRL file
    if options.data is not None:
        from autotune.data.lengths import measure_lengths

        report = measure_lengths(options.data, name or "tiny-llama", options.prompt_key, options.response_key)
        if passes.padded:  # TRL truncates no prompt: a batch is as long as its longest
            config = _trl_prompts(config, report, target.prompt_known, findings)
        findings += length_findings(config, report, packed=passes.packed, prompts=passes.packed)
    lengths, said = job_lengths(report, options.verl_log)  # the verdict's: the data's, a verl log's
    findings += [Finding("lengths", line, severity="note") for line in said]
    if name is None:
        shown = target.model or "(none)"
        note = (
            f"memory not checked: model {shown!r} is not one autotune knows; pass --model NAME or a "
            f"local directory"
        )
        traced = None
        if options.trace:
            traced = TracedCheck.not_run("the model is not one autotune knows", gpus)
        return [*findings, Finding("memory", note, severity="note")], None, traced
    spec = resolve_model(name)
    findings += model_findings(config, spec, getattr(target.engine, "tensor_model_parallel_size", None))
    reward = registry_name(target.reward_model)
    if target.reward_model and reward is None:
        note = f"reward model {target.reward_model!r} is not one autotune knows: its memory is not counted"
        findings.append(Finding("memory", note, severity="note"))
    reward_spec = resolve_model(reward) if reward else None
    arch = Architecture.from_specs(spec, reward_spec)
    if options.gpu and target.device is not None:  # a GPU asked about: judged as a GPU runs it
        target = dataclasses.replace(target, device=None)
    memory_found, memory = memory_findings(arch, target, config, gpus, card, report, lengths, passes)
    traced = None
    if options.trace:  # the layout of the device the verdict is about, on the lengths it judged
        from autotune.probe.traced import BUILT, TraceJob, traced_check

        layout = memory.get("device", "cuda")
        verdict = str(memory.get("lengths", "max"))  # a TRL file's: the limits, which TRL pads to
        on = _trace_lengths(options, verdict, lengths)
        _say_estimate(options.say, spec, config, gpus, on)

        def traced_pass(name: str, seconds: float) -> None:
            options.say(f"  {name if name == BUILT else f'traced {name}'}: {seconds:.0f} s")

        job = TraceJob(spec, reward_spec, config, gpus, layout, options.verl_python, on)
        traced = traced_check(job, traced_pass)
        if not traced.failed:
            note = _trace_lengths_note(traced, memory, verdict, config)
            traced = dataclasses.replace(traced, notes=[note, *traced.notes])
    return findings + memory_found, memory, traced


def _say_estimate(
    say: Callable[[str], None], spec: Any, config: ProbeConfig, gpus: int, lengths: Any
) -> None:
    """Before the trace starts: what it traces and about how long it takes here."""
    from autotune.probe.traced import trace_estimate

    seconds, passes = trace_estimate(spec, config, gpus, lengths)
    layers = getattr(spec.config, "num_hidden_layers", "?")
    say(
        f"tracing {passes} passes of {spec.name} ({layers} layers) over {gpus} rank(s) under FakeTensorMode: "
        f"about {seconds:.0f} s on two cores (between half and twice that, by the traces measured so far)"
    )


def print_result(result: CheckResult) -> None:
    t = result.target
    model = f"{t.model}" + (f" (reward {t.reward_model})" if t.reward_model else "")
    layout = t.sharding_label + (f" ({ASSUMED})" if t.layout_assumed else "")
    print(
        f"autotune check {shlex.quote(result.path)}: {t.kind}; model {model}; {result.gpus} GPU(s)"
        f"{'; ' + result.card if result.card else ''}; {layout}"
    )
    for f in result.findings:
        print(f"{MARKS.get(f.severity, '·')} {f.check}: {f.problem}")
        if f.fix:
            print(f"    fix: {f.fix}")
    for line in result.traced.lines() if result.traced else ():
        print(line)
    print(_summary(len(result.problems), len(result.warnings)))


MARKS = {"problem": "✗", WARNING: "!", "note": "·"}


def _summary(problems: int, warnings: int) -> str:
    said = f"{problems} problem{'s' if problems != 1 else ''} found" if problems else "no problems found"
    return said + (f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else "")


def run(options: CheckOptions, as_json: bool = False) -> int:
    result = check(options)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_result(result)
    return result.exit_code
