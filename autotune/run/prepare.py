"""Everything `autotune run` settles before its first probe: the space (with the command line's model, GPUs,
recipe flags and data), the device, the models, the memory budget, the probe settings, and what the study
will measure.

A study measures one job: the study's identity (the model's and reward model's fingerprints, the device,
the GPUs, the budget, the probe's iterations, the data's prompts, the recipe it trains) is stored with it;
resuming it with another is refused, and default study names carry the identity's fingerprint, so another
job gets another study.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from autotune.config.checker import show
from autotune.config.knobs import ProbeConfig
from autotune.config.numbers import MAX_SECONDS, is_int, parse_float
from autotune.errors import UserError
from autotune.memory.budget import Budget
from autotune.memory.calibration import MemoryModel
from autotune.probe.contract import ProbeSettings
from autotune.run.identity import identity_fingerprint, study_identity
from autotune.run.job_data import fit_space_to_data
from autotune.space.loading import space_from_dict
from autotune.space.model import SearchSpace, batch_value_problem
from autotune.space.specs import MINI, OFFLOAD_KNOBS, SYSTEM_KNOBS, TP, TRAIN
from autotune.trainers.registry import DEFAULT_TRAINER, ProbeEngine, Trainer, engine_named, trainer_named
from autotune.units import GIB

__all__ = [
    "Prepared",
    "RunOptions",
    "check_floor",
    "check_offload",
    "command_line_space",
    "default_study_name",
    "hold_unexported",
    "parse_duration",
    "prepare",
    "probe_settings",
    "resolve_budget_gib",
    "rollout_card_bytes",
    "states_floor",
    "tensor_parallel_for_heads",
]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'8h', '90m', '1h30m', '45s' or plain seconds; positive, finite, at most a month."""
    stripped = text.strip().lower()
    if re.fullmatch(r"[\d.e+-]+|nan|inf|infinity", stripped):
        return parse_float(stripped, "--time-budget", maximum=MAX_SECONDS)
    parts = _DURATION.findall(stripped)
    if not parts or _DURATION.sub("", stripped).strip():
        raise UserError(f"--time-budget {text!r}: expected a duration such as 8h, 90m, 1h30m or 45s")
    seconds = sum(float(value) * _UNIT_SECONDS[unit] for value, unit in parts)
    if not 0 < seconds <= MAX_SECONDS:
        raise UserError(f"--time-budget {text!r}: must be more than 0 s and at most 30 days")
    return seconds


@dataclass
class RunOptions:
    space: str = "default"
    model: str | None = None
    reward_model: str | None = None
    weights: str = "random"
    gpus: int | None = None
    device: str = "auto"
    trials: int = 20
    timeout_per_probe: float | None = None
    memory_budget_gib: float | None = None
    time_budget_seconds: float | None = None
    storage: str | None = None
    study: str | None = None
    out: Path = Path("reports")
    seed: int = 0
    trust_remote_code: bool = False
    parallel: int = 1
    data: Path | None = None
    prompt_key: str | None = None
    response_key: str | None = None
    verl_log: Path | None = None  # a previous verl run's log: its response lengths and generation share
    rollout_engine: str = "vllm"
    train_batch_size: int | None = None  # fixes the recipe's T (overrides the space's value or range)
    mini_batch_size: int | None = None  # fixes the recipe's M, samples per optimizer step
    tune: list[str] | None = None  # recipe knobs to search as well (an algorithm change: the report says so)
    json: bool = False  # print summary.json on stdout; everything else goes to stderr
    gain_rounds: int = 2  # back-to-back rounds of the recommended and hand-made configs at the end (0: none)
    engine: str = "builtin"  # what runs a probe: autotune's PPO iteration, or verl itself (--verl-python)
    verl_python: str | None = None
    trl_python: str | None = None
    search_unexported: bool = False  # search knobs verl does not read (the rollout batch) all the same
    target: str = "verl"  # the trainer the export is for (a name in autotune.trainers.TRAINERS)
    ray: str | None = None  # a Ray cluster's address (or "auto"): the probes run there
    nodes: int = 1  # nodes one probe spans, --gpus on each
    placement_timeout: float = 300.0  # how long a probe waits for the cluster to place it
    from_file: Path | None = None  # --from: the user's job (verl launch script or overrides, TRL config)
    call: int | None = None  # --call: which trainer call of a launch script

    @property
    def trainer(self) -> Trainer:
        return trainer_named(self.target)

    @property
    def probe_engine(self) -> ProbeEngine:
        return engine_named(self.engine)


def default_study_name(space_name: str, model: str, gpus: int, fingerprint: str) -> str:
    """<space>-<model>-<W>gpu-<fingerprint of the study's identity>: another job gets another study."""
    raw = f"{space_name}-{Path(model).name or model}-{gpus}gpu"
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '-', raw).strip('-.')[:80]}-{fingerprint}"


def probe_settings(space, options: RunOptions, device: str, cluster: Any = None) -> ProbeSettings:
    return ProbeSettings(
        ray_address=cluster.address if cluster is not None else None,
        nodes=options.nodes,
        placement_timeout=options.placement_timeout,
        model=space.model,
        reward_model=space.reward_model,
        weights=options.weights,
        device=device,
        world_size=space.gpus,
        warmup_iterations=space.probe.warmup,
        iterations=space.probe.iterations,
        timeout_seconds=options.timeout_per_probe or space.probe.timeout_seconds,
        memory_budget_gib=None,
        seed=options.seed,
        trust_remote_code=options.trust_remote_code,
        engine=options.engine,
        engine_python=options.probe_engine.python_from(options),
    )


def resolve_budget_gib(space, options: RunOptions, device: str, card_bytes: int | None = None) -> float:
    """--memory-budget, else the space's, else the device's memory per rank (`card_bytes`: a Ray cluster's
    GPU, read on its node)."""
    if options.memory_budget_gib:
        return options.memory_budget_gib
    if space.memory_budget_gib:
        return space.memory_budget_gib
    if card_bytes:
        return card_bytes / GIB
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory / GIB
    import psutil

    return psutil.virtual_memory().total / GIB / space.gpus


@dataclass
class Prepared:
    """What `autotune run` probes with: checked before the first probe."""

    space: SearchSpace
    settings: ProbeSettings
    budget: Budget
    memory_model: MemoryModel
    lengths: Any  # the data's LengthReport (`--data`), or None
    identity: dict[str, Any]  # what the study measures (see the module docstring)
    generation_share: float | None = None  # generation's share of a verl step (--verl-log), for the report
    from_file: Any = None  # --from: the file's space and what the flags overrode (run.from_file.FileSpace)

    @property
    def fingerprint(self) -> str:
        return identity_fingerprint(self.identity)


def prepare(options: RunOptions, console: Console, cluster: Any = None, job: Any = None) -> Prepared:
    """Everything checked before the first probe: space, device, models, budget, settings, identity.
    `cluster`: the Ray cluster joined for --ray (autotune.probe.cluster.connect.Cluster), or None; `job`:
    the file of --from (autotune.run.from_file.JobFile), or None."""
    from autotune.config.rules import position_findings, raise_for
    from autotune.memory.architecture import Architecture
    from autotune.models.catalog import resolve_model, resolve_reward_model
    from autotune.probe.devices import device_label

    space, lengths, from_file = resolve_space(options, console, job)
    trainer, engine = options.trainer, options.probe_engine
    engine.check_space_knobs(space)
    for runs in dict.fromkeys(t for t in (trainer, engine.trainer) if t is not None):
        runs.check_space(space)  # what the export is for, and what runs the probes
    space = hold_unexported(space, options.search_unexported, console, trainer)
    device, card = run_device(options, space, cluster)
    engine.check_space_knobs(space, device)
    probed_as = probe_settings(space, options, device, cluster)  # the knobs' changes below leave it as is
    engine.announce(probed_as, console)
    space = without_unmeasurable_offload(space, device, console)
    check_offload(space, device)
    actor = resolve_model(space.model, options.weights, options.trust_remote_code)
    space = tensor_parallel_for_heads(space, actor, console)
    reward = resolve_reward_model(space.reward_model)
    budget_gib = resolve_budget_gib(space, options, device, card[1] if card else None)
    budget = Budget(int(budget_gib * GIB), space.headroom)
    rollout_card = rollout_card_bytes(engine, device, budget, trainer, card[1] if card else None)
    from autotune.probe.verl.run_log import job_lengths, read_run_log

    token_lengths, notes = job_lengths(lengths, options.verl_log)
    for note in notes:
        console.print(f"--verl-log: {note}", markup=False, highlight=False, soft_wrap=True)
    run_log = read_run_log(options.verl_log) if options.verl_log is not None else None
    passes = trainer.passes
    arch = Architecture.from_specs(actor, reward)
    model = MemoryModel(
        arch,
        space.gpus,
        device,
        rollout_card_bytes=rollout_card,
        lengths=token_lengths,
        passes=engine.model_passes(passes),
    )
    longest = ProbeConfig(
        **space.fixed_fields,
        max_prompt_length=max(space.knob("max_prompt_length").values()),
        max_response_length=max(space.knob("max_response_length").values()),
    )
    raise_for(position_findings(longest, actor))
    no_gpu = options.device == "auto" and device == "cpu" and cluster is None
    check_floor(space, model, budget, budget_gib, no_gpu and not options.memory_budget_gib)
    settings = dataclasses.replace(
        probed_as,
        memory_budget_gib=budget_gib,
        passes=passes,
        lengths=token_lengths.to_dict() if token_lengths.on_data else None,
    )
    label = f"cuda {card[0]}" if card else device_label(device)
    identity = study_identity(actor, reward, settings, label, budget, lengths, space.recipe())
    share = run_log.generation_share if run_log is not None else None
    return Prepared(space, settings, budget, model, lengths, identity, share, from_file)


def run_device(options: RunOptions, space: SearchSpace, cluster: Any) -> tuple[str, tuple[str, int] | None]:
    """The device the probes run on, and on a Ray cluster's GPUs the card's name and memory (read on a node):
    on a cluster, what its nodes have, checked against --nodes × --gpus for --parallel probes at once."""
    if cluster is None:
        from autotune.probe.devices import resolve_device

        return resolve_device(options.device, space.gpus), None
    from autotune.probe.cluster.connect import check_fits, cluster_device, gpu_card

    device = cluster_device(options.device, cluster)
    check_fits(cluster, device, options.nodes, space.gpus // options.nodes, options.parallel)
    return device, gpu_card() if device == "cuda" else None


def resolve_space(options: RunOptions, console: Console, job: Any = None) -> tuple[SearchSpace, Any, Any]:
    """The space with the command line's model, GPUs, reward model and recipe flags, fitted to `--data`; or
    the space of the file of --from (`job`), with what the flags overrode (else None)."""
    from autotune.space.loading import space_from_dict
    from autotune.space.schema import read_space

    from_file = None
    if job is not None:
        from autotune.run.from_file import file_space

        data, source, name, from_file = file_space(options, console, job)
    else:
        data, source, name = read_space(options.space)
    space = space_from_dict(command_line_space(data, options, source), source=source, name=name)
    if job is not None:
        from autotune.run.from_file import check_baseline

        check_baseline(space, job)
    if options.data is None:
        return space, None, from_file
    from autotune.data.lengths import measure_lengths

    lengths = measure_lengths(options.data, space.model, options.prompt_key, options.response_key)
    space, notes = fit_space_to_data(space, lengths)
    for note in notes:
        console.print(f"--data {options.data}: {note}")
    return space, lengths, from_file


FLAGS = {TRAIN: "--train-batch-size", MINI: "--mini-batch-size"}


def command_line_space(data: Any, options: RunOptions, source: str = "the space file") -> Any:
    """The space's YAML with the command line's settings in: --model, --gpus and --reward-model replace the
    top-level keys; --train-batch-size and --mini-batch-size fix those recipe knobs (whatever the file says);
    --tune adds recipe knobs to `tune:`. Checked here where only the flag can be wrong (one line each); the
    rest is `space_from_dict`'s to check."""
    if not isinstance(data, dict):
        return data  # space_from_dict says what is wrong with it
    data = copy.deepcopy(data)
    settings = {"model": options.model, "gpus": options.gpus, "reward_model": options.reward_model}
    data.update({key: value for key, value in settings.items() if value is not None})
    if options.nodes > 1 and is_int(data.get("gpus", 1)):  # --gpus (or the space's gpus) on each node
        data["gpus"] = options.nodes * data.get("gpus", 1)
    given = {TRAIN: options.train_batch_size, MINI: options.mini_batch_size}
    fixed = {name: value for name, value in given.items() if value is not None}
    _add_tuned(data, list(dict.fromkeys(options.tune or [])), fixed, source)
    for name, value in fixed.items():
        _fix_knob(data, name, value)
    return data


def _add_tuned(data: dict, tune: list[str], fixed: dict[str, int], source: str) -> None:
    """--tune: list the knobs under `tune:`; a knob the file (or a flag) fixes has no range to search."""
    knobs = data.get("knobs")
    for name in tune:
        if name in fixed:
            raise UserError(
                f"{FLAGS[name]} {fixed[name]} fixes {name}, and --tune {name} would search it: give one "
                f"of them"
            )
        if isinstance(knobs, dict) and name in knobs and not isinstance(knobs[name], dict):
            raise UserError(
                f"--tune {name}: {source} fixes {name}={show(knobs[name])}, and --tune cannot invent a "
                f"range: give {name} a range {{min: .., max: ..}} in a copy of the space file"
            )
    listed = data.get("tune")
    if tune and (listed is None or isinstance(listed, list)):  # a malformed tune: the space reports it
        data["tune"] = list(dict.fromkeys([*(listed or []), *tune]))


def _fix_knob(data: dict, name: str, value: int) -> None:
    """--train-batch-size / --mini-batch-size: the knob is that one value, and no longer tuned."""
    unit = _unit(data)
    problem = batch_value_problem(name, value, unit) if unit else None
    if problem:
        raise UserError(f"{FLAGS[name]} {value}: {problem}")
    if isinstance(data.get("knobs"), dict):
        data["knobs"][name] = value
    if isinstance(data.get("tune"), list):
        data["tune"] = [knob for knob in data["tune"] if knob != name]


def _unit(data: dict) -> int | None:
    """gpus × rollout_n of the space's YAML, when both are valid (else the space reports them)."""
    gpus, n = data.get("gpus", 1), data.get("rollout_n", 1)
    return gpus * n if is_int(gpus) and is_int(n) and gpus >= 1 and n >= 1 else None


def without_unmeasurable_offload(space: SearchSpace, device: str, console: Console) -> SearchSpace:
    """On CPU an offload knob that may be false is searched at false only, said in one line (offload moves
    states off a GPU: there is none to measure it on); one fixed at true is left to `check_offload`."""
    if device != "cpu":
        return space
    narrowed = [name for name in OFFLOAD_KNOBS if set(space.knob(name).values()) == {True, False}]
    if not narrowed:
        return space
    data = copy.deepcopy(dict(space.raw))
    for name in narrowed:
        data["knobs"][name] = False
    console.print(
        f"note: {', '.join(narrowed)} searched at false only on CPU (offload is measured on CUDA; "
        "a GPU run searches both)",
        soft_wrap=True,
    )
    return space_from_dict(data, source=space.source, cores=space.cores, name=space.name)


def hold_unexported(
    space: SearchSpace, search_anyway: bool, console: Console, trainer: Trainer = DEFAULT_TRAINER
) -> SearchSpace:
    """Knobs the target trainer has no key for (autotune.formats.verl_table: the rollout batch; for TRL,
    autotune.formats.trl: the rollout batch and the log-prob micro batch) change nothing in the job the study
    hands over, so a study does not spend probes on them: each is held at one value, the first hand-made
    config's when the space offers it (that config is then probed as written), else the space's largest (verl
    generates a step's prompts together). Hand-made configs with another value are probed at the held one, as
    the trainer would run them. `search_anyway` (--search-unexported) searches them all the same; the report
    then splits the gain into what the trainer's knobs make and what these make."""
    unread = trainer.unread_knobs()
    searched = [name for name in unread if name in SYSTEM_KNOBS and space.knob(name).searched]
    if search_anyway or not searched:
        return space
    data = copy.deepcopy(dict(space.raw))
    for name in searched:
        values = space.knob(name).values(space.cores)
        source = next((s.config for s in space.seed_configs if getattr(s.config, name) in values), None)
        held = max(values) if source is None else getattr(source, name)
        data["knobs"][name] = held
        moved = [raw for raw in data.get("seed_configs") or [] if raw.get(name) not in (None, held)]
        for raw in moved:
            raw[name] = held
        whose = "the space's largest" if source is None else "a hand-made config's"
        console.print(
            f"note: {name} held at {held} ({whose}): {trainer.label} has no such knob, so searching it would "
            f"not change the job handed over; --search-unexported searches it anyway"
            + (f"; hand-made {', '.join(repr(r['name']) for r in moved)} probed at {held}" if moved else ""),
            soft_wrap=True,
            markup=False,
        )
    return space_from_dict(data, source=space.source, cores=space.cores, name=space.name)


def tensor_parallel_for_heads(space: SearchSpace, actor: Any, console: Console) -> SearchSpace:
    """The searched tensor-parallel sizes that split the model's attention heads evenly (vLLM refuses to start
    with any other): the rest are left out in one line; none left is a UserError."""
    from autotune.config.rules import head_findings

    heads = getattr(actor.config, "num_attention_heads", None)
    sizes = [size for size in space.knob(TP).values() if size]
    dropped = [size for size in sizes if head_findings(size, actor)]
    if not dropped:
        return space
    kept = [size for size in sizes if size not in dropped]
    why = f"vLLM splits {actor.name}'s {heads} attention heads over the tensor-parallel ranks"
    if not kept:
        raise UserError(
            f"{space.source}: knobs.{TP}: none of {', '.join(map(str, sizes))} divides {actor.name}'s "
            f"{heads} attention heads ({why} and refuses any other size); use a divisor of both the GPUs "
            f"and the heads"
        )
    console.print(f"note: {TP} {', '.join(map(str, dropped))} left out: {why}", soft_wrap=True)
    data = copy.deepcopy(dict(space.raw))
    data["knobs"][TP] = kept[0] if len(kept) == 1 else {"choices": kept}
    return space_from_dict(data, source=space.source, cores=space.cores, name=space.name)


def rollout_card_bytes(
    engine: ProbeEngine, device: str, budget: Budget, trainer: Trainer, card_bytes: int | None = None
) -> float | None:
    """On CUDA, the card vLLM's share is a fraction of (`card_bytes`: a Ray cluster's, read on its node):
    --engine verl's pool, or TRL's colocated one (--engine trl --target trl). None for the built-in probe (no
    pool) and on CPU, where verl generates with its hf_cpu rollout, TRL runs no vLLM and nothing measures a
    pool."""
    if not engine.pools_rollout(trainer) or device != "cuda":
        return None
    if card_bytes:
        return float(card_bytes)
    import torch

    return float(torch.cuda.get_device_properties(0).total_memory)


def check_offload(space: SearchSpace, device: str) -> None:
    """Refuse, in one line, a space that may offload on a device offload cannot be measured on (the CPU)."""
    from autotune.config.rules import offload_findings

    sharded = next((s for s in space.knob("sharding").values() if s != "replicate"), "full_shard")
    lines = []
    for name in OFFLOAD_KNOBS:
        if True not in space.knob(name).values():
            continue
        offloading: dict[str, Any] = {name: True}  # one of ProbeConfig's offload flags
        for finding in offload_findings(ProbeConfig(sharding=sharded, **offloading), device):
            lines.append(f"knobs.{name} may be true, but {finding.problem}; fix: {finding.fix}")
    if lines:
        raise UserError(f"{space.source}: " + "; ".join(lines))


def states_floor(space: SearchSpace, model: MemoryModel) -> tuple[int, ProbeConfig]:
    """The model's states alone (weights, gradients, optimizer state, and its runtime constant) held the
    smallest way the space allows (its sharding and offload choices), and that holding."""
    held = [ProbeConfig(**space.fixed_fields, **holding) for holding in space.holdings()]
    return min(((model.minimum_bytes(config), config) for config in held), key=lambda pair: pair[0])


def check_floor(
    space: SearchSpace, model: MemoryModel, budget: Budget, budget_gib: float, fell_back: bool = False
) -> None:
    """Refuse a budget below the model's states alone, held the smallest way the space allows: no batch
    setting could fit. `fell_back`: --device auto found no GPU and the budget is this machine's RAM split
    between CPU ranks, which is what the user is told first."""
    floor, smallest = states_floor(space, model)
    if floor <= budget.limit:
        return
    need = f"{space.model}'s weights, gradients and optimizer state alone need about {floor / GIB:.1f} GiB"
    if fell_back:
        raise UserError(
            f"no GPU is visible here, so --device auto would run {space.gpus} CPU rank(s) with this "
            f"machine's RAM split between them ({budget_gib:.1f} GiB each), and {need} per rank. What "
            "works here: `autotune check FILE --gpu a100-80g` judges a job on paper; `autotune run --space "
            "cpu-tiny` runs a study on CPU; `--device cpu --memory-budget GIB` insists on this job"
        )
    raise UserError(
        f"--memory-budget {budget_gib:g} GiB: {need} per rank {_holding_text(smallest, space)} (budget "
        f"less {space.headroom:.0%} headroom is {budget.limit / GIB:.1f} GiB); use LoRA (`lora: {{enabled: "
        f"true}}` in the space), more memory (--memory-budget){_more_holdings(space)} or a smaller model "
        "(--model)"
    )


def _holding_text(config: ProbeConfig, space: SearchSpace) -> str:
    if not config.sharded:
        return "held replicated"
    offloads = [name for name in OFFLOAD_KNOBS if getattr(config, name)]
    how = config.sharding + (f" with {' and '.join(offloads)}" if offloads else "")
    return f"even held as {how} over {space.gpus} rank(s), the smallest holding the space allows"


def _more_holdings(space: SearchSpace) -> str:
    """What else could hold the states in less: the sharding or offload the space does not offer."""
    offered = space.holdings()
    if not any(h["sharding"] != "replicate" for h in offered):
        return ", sharding (`sharding: full_shard` in the space's knobs) over more GPUs (--gpus)"
    if not any(any(h[name] for name in OFFLOAD_KNOBS) for h in offered):
        return ", offload (`offload_policy: true` in the space's knobs, on CUDA)"
    return ""
