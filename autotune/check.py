"""`autotune check`: every problem of an existing config at once, each with the rule and the fix.

    result = check(CheckOptions(path=Path("config.yaml"), gpus=4, gpu="a100-40g"))
    print_result(result); sys.exit(result.exit_code)     # 0 clean, 1 problems found (2: a UserError)

Input: the seed article's schema (§5, and autotune's best_config.yaml) or a verl override file (`key=value`
lines, as verl_overrides.txt). Decisions:
- A file that cannot be read as either, a knob of the wrong type, or a missing batch knob is a UserError
  (exit 2): nothing can be checked. An unknown key is a *finding* (exit 1, with the closest known key): the
  file is readable, a typo must not hide the other problems, and silently ignoring it would hide the typo.
  Keys the article itself uses outside §5 (init_kl_coef, kl_target, log_level, dataset_cache_dir) and the
  `measured:` block of best_config.yaml are accepted unchecked.
- `fsdp_config` may sit at the top level or inside `actor_model_config` (the article's flattened text
  allows both); inside wins.
- Starving GPUs: the article (§6.4) flags a rollout batch below 64, in examples of 1–2 GPUs, i.e. 32
  sequences per GPU; each GPU generates its own share, so autotune requires R >= 64 and R/W >= 32.
- Cores: `num_rollout_workers` is checked against the physical cores of *this* machine unless `--cores`
  gives the training machine's.
- Memory: the analytic model of autotune's probe with its CUDA priors (not calibrated on the user's run;
  HF generate, not vLLM). The model keeps DDP's replicated states; FULL_SHARD (the article's scenario 2, and
  verl's default FSDP for an override file) is modelled by dividing parameter, gradient and optimizer states
  by W and adding one gathered layer (see `estimate_memory`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from autotune.config.knobs import ALGORITHMS, ProbeConfig, physical_cores
from autotune.errors import UserError

if TYPE_CHECKING:
    from autotune.data.lengths import LengthReport
    from autotune.memory.model import Architecture, MemoryBreakdown

GIB = 1024**3
MIN_ROLLOUT, MIN_ROLLOUT_PER_GPU = 64, 32  # the article's §6.4, and its share per GPU (see module doc)
LENGTH_WASTE = 2.0  # a limit above 2x the data's suggestion wastes memory
TIGHT = 0.90  # a peak above 90% of the card leaves less than autotune's default 10% headroom

INT, BOOL, STR, NUM = "int", "bool", "str", "number"
KNOBS: dict[str, str] = {
    "rollout_batch_size": INT,
    "train_batch_size": INT,
    "micro_batch_size": INT,
    "gradient_accumulation_steps": INT,
    "num_rollout_workers": INT,
    "max_prompt_length": INT,
    "max_response_length": INT,
    "log_prob_micro_batch_size": INT,
    "gradient_checkpointing": BOOL,
    "algorithm": STR,
    "rollout_n": INT,
    "kl_coef": NUM,
}
REQUIRED = (
    "rollout_batch_size",
    "train_batch_size",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "max_prompt_length",
    "max_response_length",
)
FSDP_KEYS = {"sharding_strategy": STR, "cpu_offload": BOOL}
SECTIONS: dict[str, dict[str, str]] = {
    "actor_model_config": {
        "model_name_or_path": STR,
        "use_lora": BOOL,
        "lora_r": INT,
        "lora_alpha": INT,
        "gradient_checkpointing": BOOL,
        "fsdp_config": "section",
    },
    "reward_model_config": {"model_name_or_path": STR, "trainable": BOOL},
    "fsdp_config": FSDP_KEYS,
}
UNCHECKED = {"init_kl_coef", "kl_target", "log_level", "dataset_cache_dir", "measured"}
SHARDING = {  # strategy -> how the states are modelled
    "FULL_SHARD": "full_shard",
    "HYBRID_SHARD": "full_shard",  # full shard within a node: the same per GPU on one node
    "SHARD_GRAD_OP": "shard_grad_op",
    "_HYBRID_SHARD_ZERO2": "shard_grad_op",
    "NO_SHARD": "none",
}
VERL_NAMES = (
    "below, autotune's knob names stand for verl's keys: train_batch_size = data.train_batch_size × "
    "rollout.n, rollout_batch_size = data.gen_batch_size × rollout.n, micro_batch_size = "
    "actor.ppo_micro_batch_size_per_gpu, num_rollout_workers = data.dataloader_num_workers, "
    "max_prompt_length/max_response_length = data.max_prompt_length/max_response_length"
)
# Hugging Face ids (the article's model_name_or_path) -> registry names; org prefix and suffixes ignored
HF_PATTERNS = (
    (r"^llama-2-(7b|13b)", "llama-2-{}"),
    (r"^tinyllama", "tinyllama-1.1b"),
    (r"^qwen2\.5-(\d+(?:\.\d+)?b)", "qwen2.5-{}"),
    (r"deberta-v3-large", "deberta-v3-large"),
)


@dataclass(frozen=True)
class Finding:
    check: str  # divisibility, workers, lengths, memory, reward, rollout, schema, verl
    problem: str  # what is wrong, with the rule
    fix: str = ""
    severity: str = "problem"  # "problem" (exit 1) or "note" (context, exit unchanged)

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass
class Target:
    """What a config file says, in autotune's terms."""

    kind: str  # "seed schema" | "verl overrides"
    config: ProbeConfig | None  # None: an override file without the sizes the model needs
    model: str | None = None
    reward_model: str | None = None
    reward_trainable: bool = False
    sharding: str = "none"  # "none" | "full_shard" | "shard_grad_op"
    sharding_label: str = "replicated (DDP)"
    offload: bool = False
    gpus: int | None = None  # what the file says (best_config's measured.gpus, verl's trainer.*)
    memory_gib: float | None = None  # best_config's measured.budget_gib
    findings: list[Finding] = field(default_factory=list)  # found while reading (unknown keys, ...)
    overrides: dict[str, Any] | None = None


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


@dataclass
class CheckResult:
    path: str
    target: Target
    gpus: int
    card: str | None  # "a100-40g (40.0 GiB)"
    findings: list[Finding]
    memory: dict[str, Any] | None = None

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "problem"]

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
            "problems": [f.to_dict() for f in self.problems],
            "notes": [f.to_dict() for f in self.findings if f.severity == "note"],
            "exit_code": self.exit_code,
        }


# --- reading ---------------------------------------------------------------------------------------------


def read_target(path: Path) -> Target:
    """A seed-schema YAML or a verl override file; UserError when it is neither or cannot be used."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config '{path}' " + ("is a directory" if path.is_dir() else "does not exist"))
    text = path.read_text(encoding="utf-8", errors="replace")
    if _looks_like_overrides(text):
        return _from_overrides(text)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UserError(f"config '{path}' is not valid YAML: {reason}") from None
    if not isinstance(data, dict):
        raise UserError(
            f"config '{path}' is neither the seed's YAML schema (a mapping of knobs) nor verl "
            f"overrides (key=value lines)"
        )
    return _from_seed(data, path)


def _looks_like_overrides(text: str) -> bool:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return bool(lines) and all(re.match(r"^[+~]?[A-Za-z_][\w.]*=", ln) for ln in lines)


def _typed(where: str, value: Any, kind: str, errors: list[str]) -> Any:
    ok = {
        INT: isinstance(value, int) and not isinstance(value, bool),
        BOOL: isinstance(value, bool),
        STR: isinstance(value, str),
        NUM: isinstance(value, (int, float)) and not isinstance(value, bool),
        "section": isinstance(value, dict),
    }[kind]
    if not ok:
        wanted = "a mapping" if kind == "section" else f"a {'whole number' if kind == INT else kind}"
        errors.append(f"{where}: expected {wanted}, but got {value!r}")
        return None
    return value


def _unknown(where: str, key: str, known: list[str]) -> Finding:
    close = difflib.get_close_matches(key, known, n=1)
    return Finding(
        "schema",
        f"unknown key {where}{key}: not in the seed's schema, so nothing reads it"
        + (f" (did you mean {close[0]!r}?)" if close else ""),
        f"rename it to {close[0]}" if close else f"remove it; known keys: {', '.join(known)}",
    )


def _section(data: dict[str, Any], name: str, errors: list[str], findings: list[Finding]) -> dict[str, Any]:
    """A section's typed values; unknown keys become findings, wrong types errors."""
    raw = data.get(name) or {}
    if not _typed(name, raw, "section", errors):
        return {}
    schema = SECTIONS[name]
    values = {}
    for key, value in raw.items():
        if key not in schema:
            findings.append(_unknown(f"{name}.", str(key), list(schema)))
        elif key == "fsdp_config":
            values[key] = _section({"fsdp_config": value}, "fsdp_config", errors, findings)
        else:
            values[key] = _typed(f"{name}.{key}", value, schema[key], errors)
    return values


def _from_seed(data: dict[str, Any], path: Path) -> Target:
    errors: list[str] = []
    findings: list[Finding] = []
    knobs: dict[str, Any] = {}
    known = [*KNOBS, *SECTIONS, *sorted(UNCHECKED)]
    for key, value in data.items():
        if key in KNOBS:
            knobs[key] = _typed(str(key), value, KNOBS[key], errors)
        elif key not in SECTIONS and key not in UNCHECKED:
            findings.append(_unknown("", str(key), known))
    sections = {name: _section(data, name, errors, findings) for name in SECTIONS}
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        errors.append(f"missing {', '.join(missing)} (the seed's batch knobs; see DESIGN §3)")
    if errors:
        raise UserError(f"config '{path}': " + "; ".join(errors))
    actor, reward = sections["actor_model_config"], sections["reward_model_config"]
    fsdp = {**sections["fsdp_config"], **actor.get("fsdp_config", {})}
    config = _seed_config(knobs, actor)
    strategy = str(fsdp.get("sharding_strategy", "NO_SHARD" if not fsdp else "FULL_SHARD")).upper()
    if strategy not in SHARDING:
        findings.append(
            Finding(
                "schema",
                f"fsdp_config.sharding_strategy={strategy}: not a torch FSDP strategy",
                f"use one of {', '.join(SHARDING)}",
            )
        )
    if config.algorithm not in ALGORITHMS:
        findings.append(
            Finding(
                "schema",
                f"algorithm={config.algorithm}: unknown",
                f"algorithm: one of {', '.join(ALGORITHMS)}",
            )
        )
    measured = data.get("measured") if isinstance(data.get("measured"), dict) else {}
    return Target(
        kind="seed schema",
        config=config,
        model=actor.get("model_name_or_path"),
        reward_model=reward.get("model_name_or_path"),
        reward_trainable=bool(reward.get("trainable", False)),
        sharding=SHARDING.get(strategy, "none"),
        sharding_label=f"FSDP {strategy}" if fsdp else "replicated (DDP)",
        offload=bool(fsdp.get("cpu_offload", False)),
        gpus=measured.get("gpus") if isinstance(measured.get("gpus"), int) else None,
        memory_gib=measured.get("budget_gib")
        if isinstance(measured.get("budget_gib"), (int, float))
        else None,
        findings=findings,
    )


def _seed_config(knobs: dict[str, Any], actor: dict[str, Any]) -> ProbeConfig:
    values = {k: v for k, v in knobs.items() if v is not None}
    values.setdefault("num_rollout_workers", 1)  # the article: "default 1, fine for debugging"
    if "gradient_checkpointing" in actor:
        values["gradient_checkpointing"] = actor["gradient_checkpointing"]
    values["use_lora"] = bool(actor.get("use_lora", False))
    for key in ("lora_r", "lora_alpha"):
        if actor.get(key) is not None:
            values[key] = actor[key]
    return dataclasses.replace(ProbeConfig(), **values)


def _from_overrides(text: str) -> Target:
    """A verl override file: verl's keys mapped back to autotune's knobs (see autotune.formats.verl)."""
    from autotune.formats.verl import AR, VERL_DEFAULTS, parse_overrides

    values = parse_overrides(text)
    get = {**VERL_DEFAULTS, **values}.get
    nodes, per_node = get("trainer.nnodes"), get("trainer.n_gpus_per_node")
    gpus = per_node * nodes if isinstance(per_node, int) and isinstance(nodes, int) else None
    offload = any(get(f"{AR}.actor.fsdp_config.{k}") is True for k in ("param_offload", "optimizer_offload"))
    reward = get("reward_model.model.path") if get("reward_model.enable") else None
    return Target(
        kind="verl overrides",
        config=_verl_config(get, gpus or 1),
        model=get(f"{AR}.model.path"),
        reward_model=reward,
        sharding="full_shard",
        sharding_label="verl FSDP, FULL_SHARD (its default)",
        offload=offload,
        gpus=gpus,
        overrides=values,
    )


def _verl_config(get: Any, gpus: int) -> ProbeConfig | None:
    """verl counts prompts, autotune samples (× rollout.n); None when the sizes are missing or not whole."""
    from autotune.formats.verl import AR

    n, batch = get(f"{AR}.rollout.n"), get("data.train_batch_size")
    micro, mini = get(f"{AR}.actor.ppo_micro_batch_size_per_gpu"), get(f"{AR}.actor.ppo_mini_batch_size")
    sizes = (n, batch, micro, mini)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        return None
    gen = get("data.gen_batch_size")
    lora = get(f"{AR}.model.lora_rank")
    return ProbeConfig(
        rollout_batch_size=(gen if isinstance(gen, int) else batch) * n,
        train_batch_size=batch * n,
        micro_batch_size=micro,
        gradient_accumulation_steps=max(1, mini * n // gpus // micro),
        num_rollout_workers=_int_or(get("data.dataloader_num_workers"), 8),  # verl's default
        max_prompt_length=_int_or(get("data.max_prompt_length"), 512),
        max_response_length=_int_or(get("data.max_response_length"), 512),
        log_prob_micro_batch_size=_int_or(get(f"{AR}.rollout.log_prob_micro_batch_size_per_gpu"), None),
        gradient_checkpointing=get(f"{AR}.model.enable_gradient_checkpointing") is True,
        algorithm="grpo" if get("algorithm.adv_estimator") == "grpo" else "ppo",
        rollout_n=n,
        use_lora=isinstance(lora, int) and lora > 0,
        lora_r=lora if isinstance(lora, int) and lora > 0 else 16,
    )


def _int_or(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def registry_name(ref: str | None) -> str | None:
    """The registry name of a model reference: a registry name, a local directory, or a known HF id."""
    from autotune.models.registry import MODELS

    if not ref:
        return None
    if ref in MODELS or Path(ref).expanduser().exists():
        return ref
    for name, (_, source) in MODELS.items():
        if source.lower() == ref.lower():
            return name
    tail = ref.lower().rsplit("/", 1)[-1]
    for pattern, template in HF_PATTERNS:
        match = re.search(pattern, tail)
        if match:
            name = template.format(*match.groups())
            return name if name in MODELS else None
    return None


# --- rules -----------------------------------------------------------------------------------------------


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def divisibility_findings(c: ProbeConfig, gpus: int) -> list[Finding]:
    """The seed's rules (DESIGN §3): train vs rollout, rollout vs GPUs, train vs micro·accumulation·GPUs."""
    sizes = ("rollout_batch_size", "train_batch_size", "micro_batch_size", "gradient_accumulation_steps")
    bad = [
        Finding("divisibility", f"{k}={getattr(c, k)}: must be >= 1", f"{k}: 1 or more")
        for k in sizes
        if getattr(c, k) < 1
    ]
    if bad:
        return bad  # the rules below divide by these
    found = []
    if c.train_batch_size % c.rollout_batch_size:
        found.append(_dropped_rollout(c))
    group = gpus * c.rollout_n
    if c.rollout_batch_size % group:
        found.append(
            Finding(
                "divisibility",
                f"rollout_batch_size={c.rollout_batch_size} is not a multiple of GPUs×rollout_n={gpus}×"
                f"{c.rollout_n}: every GPU must generate the same number of whole prompt groups",
                f"rollout_batch_size: {_round_up(c.rollout_batch_size, group)}",
            )
        )
    found += _mini_batch_findings(c, gpus)
    if c.algorithm == "grpo" and c.rollout_n < 2:
        found.append(
            Finding(
                "divisibility",
                f"algorithm=grpo with rollout_n={c.rollout_n}: GRPO needs groups",
                "rollout_n: 4",
            )
        )
    return found


def _dropped_rollout(c: ProbeConfig) -> Finding:
    T, R = c.train_batch_size, c.rollout_batch_size
    rollouts = -(-T // R)
    dropped = rollouts * R - T
    options = [f"train_batch_size: {rollouts * R} ({rollouts} rollouts)"]
    if T > R:
        options.append(f"{(T // R) * R} ({T // R})")
    return Finding(
        "divisibility",
        f"train_batch_size={T} is not a multiple of rollout_batch_size={R}: each step generates "
        f"{rollouts}×{R}={rollouts * R} samples and trains on {T}, so {dropped} "
        f"({dropped / (rollouts * R):.0%}) are dropped: the trained distribution shifts and KL can "
        f"explode (article §6.3)",
        " or ".join(options) + f", or a rollout_batch_size that divides {T}",
    )


def _mini_batch_findings(c: ProbeConfig, gpus: int) -> list[Finding]:
    mini = c.micro_batch_size * c.gradient_accumulation_steps * gpus
    found = []
    if c.train_batch_size % mini:
        down = (c.train_batch_size // mini) * mini
        fix = f"train_batch_size: {_round_up(c.train_batch_size, mini)}" + (f" or {down}" if down else "")
        found.append(
            Finding(
                "divisibility",
                f"train_batch_size={c.train_batch_size} is not a multiple of micro_batch_size×"
                f"gradient_accumulation_steps×GPUs={c.micro_batch_size}×{c.gradient_accumulation_steps}×"
                f"{gpus}={mini}: the last optimizer step would get a partial mini-batch (verl rejects it)",
                fix
                + ", or change micro_batch_size/gradient_accumulation_steps so their product×GPUs divides it",
            )
        )
    forward, share = c.forward_micro_batch_size, c.train_batch_size // gpus
    if c.train_batch_size % gpus == 0 and share % forward:
        divisor = max(d for d in range(1, forward + 1) if share % d == 0)
        found.append(
            Finding(
                "divisibility",
                f"the forward-only micro batch (log_prob_micro_batch_size, default micro_batch_size)="
                f"{forward} does not divide the per-GPU share train_batch_size/GPUs={share} (verl's rule)",
                f"log_prob_micro_batch_size: {divisor}, or a train_batch_size whose share it divides",
            )
        )
    return found


def worker_findings(c: ProbeConfig, cores: int | None) -> list[Finding]:
    """num_rollout_workers above the physical cores stalls rollout (article §4.4, §6.2)."""
    here = cores is None
    limit = physical_cores() if here else cores
    where = f"the {limit} physical cores of this machine" if here else f"the {limit} cores given by --cores"
    if c.num_rollout_workers > limit:
        hint = " (pass --cores N to check for the training machine)" if here else ""
        return [
            Finding(
                "workers",
                f"num_rollout_workers={c.num_rollout_workers} exceeds {where}{hint}: workers "
                f"compete for cores and rollout stalls (article §6.2)",
                f"num_rollout_workers: {limit}",
            )
        ]
    if here:
        return [
            Finding(
                "workers",
                f"num_rollout_workers={c.num_rollout_workers} checked against {where}; pass --cores N "
                f"for the training machine",
                severity="note",
            )
        ]
    return []


def rollout_findings(c: ProbeConfig, gpus: int) -> list[Finding]:
    """A rollout batch so small that the GPUs wait on generation (article §6.4; see module doc)."""
    need = max(MIN_ROLLOUT, MIN_ROLLOUT_PER_GPU * gpus)
    if c.rollout_batch_size <= 0 or c.rollout_batch_size >= need:
        return []
    fit = [r for r in range(need, c.train_batch_size + 1) if c.train_batch_size % r == 0 and r % gpus == 0]
    fix = (
        f"rollout_batch_size: {fit[0]}"
        if fit
        else f"rollout_batch_size >= {need} (and train_batch_size a multiple)"
    )
    return [
        Finding(
            "rollout",
            f"rollout_batch_size={c.rollout_batch_size} is {c.rollout_batch_size / gpus:g} per GPU on {gpus} "
            f"GPU(s): below {MIN_ROLLOUT} in all and {MIN_ROLLOUT_PER_GPU} per GPU, the GPUs starve waiting "
            f"on generation (article §6.4)",
            fix,
        )
    ]


def reward_findings(target: Target) -> list[Finding]:
    if not target.reward_trainable:
        return []
    return [
        Finding(
            "reward",
            "reward_model_config.trainable: true: the reward model would be updated during PPO, the reward "
            "drifts with the policy and KL explodes (article §6.3; verl freezes it by default)",
            "reward_model_config.trainable: false",
        )
    ]


def length_findings(c: ProbeConfig, report: LengthReport) -> list[Finding]:
    """Limits below the data's suggestion truncate; above 2× it they reserve memory nothing uses."""
    from autotune.data.lengths import truncated_share

    pairs = [
        ("max_prompt_length", c.max_prompt_length, report.suggested_prompt_length, report.prompts, "p95")
    ]
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
                    f"{share:.1%} of the samples (article §4.5)",
                    f"{key}: {suggested}",
                )
            )
        elif value > LENGTH_WASTE * suggested:
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


def position_findings(c: ProbeConfig, spec: Any) -> list[Finding]:
    limit = getattr(spec.config, "max_position_embeddings", None)
    if not limit or c.sequence_length <= limit:
        return []
    return [
        Finding(
            "lengths",
            f"max_prompt_length+max_response_length={c.sequence_length} exceeds {spec.name}'s "
            f"max_position_embeddings={limit}",
            "shorten the lengths",
        )
    ]


def verl_findings(overrides: dict[str, Any], gpus: int) -> list[Finding]:
    from autotune.formats.verl import verl_rule_violations

    fix = "change the values so the rule holds: verl rejects the config at start-up"
    return [Finding("verl", v, fix) for v in verl_rule_violations(overrides, gpus)]


# --- memory ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    peak: int  # predicted bytes per GPU: constant + factor × raw
    raw: int  # the terms' sum
    states: dict[str, int]  # weights, gradients, optimizer, ... (alive all the time)
    phases: dict[str, int]  # rollout, scoring, update: only the largest counts
    constant: float
    factor: float

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.__getitem__)


def layer_parameters(arch: Architecture) -> int:
    """One decoder layer's parameters: the model less its embedding (and untied LM head), per layer."""
    embeddings = arch.vocab * arch.hidden * (1 if arch.tied_embeddings else 2)
    return (arch.actor_parameters - embeddings) // arch.layers


def estimate_memory(
    arch: Architecture, config: ProbeConfig, gpus: int, sharding: str = "none", offload: bool = False
) -> MemoryEstimate:
    """Peak bytes per GPU: the memory model's terms, re-sharded for FSDP (CUDA priors, uncalibrated).

    FULL_SHARD: parameters, gradients and optimizer states of every model (actor, critic, reference,
    reward) ÷ W; no DDP buckets; weights are gathered one layer at a time — 4 B per parameter of a layer
    (the current and the prefetched layer in bf16) — and backward holds that layer's full fp32 gradient
    before the reduce-scatter. FSDP's mixed precision casts only the gathered layer, so the probe's
    whole-model bf16 autocast copies are dropped. SHARD_GRAD_OP: gradients and optimizer ÷ W, weights
    replicated. cpu_offload: the states live in CPU memory and Adam steps there.
    """
    from autotune.memory.model import MemoryModel

    model = MemoryModel(arch, gpus, "cuda")
    b = model.breakdown(config)
    layer = layer_parameters(arch) * 4 if sharding == "full_shard" else 0
    states = _state_terms(b, gpus, sharding, offload, layer)
    phases = _phase_terms(b, gpus, sharding, offload, layer)
    raw = sum(states.values()) + max(phases.values())
    return MemoryEstimate(
        int(model.constant + model.factor * raw), raw, states, phases, model.constant, model.factor
    )


def _state_terms(b: MemoryBreakdown, gpus: int, sharding: str, offload: bool, layer: int) -> dict[str, int]:
    shard = gpus if sharding != "none" else 1
    weights = b.weights // (gpus if sharding == "full_shard" else 1)
    states = {
        "weights": 0 if offload else weights,
        "gradients": 0 if offload else b.gradients // shard,
        "optimizer": 0 if offload else b.optimizer // shard,
        "ddp_buckets": b.ddp_buckets if sharding == "none" and not offload else 0,
        "gathered_layer": layer,
        "rollout_buffer": b.rollout_buffer + b.allocator_retention,
    }
    return states


def _phase_terms(b: MemoryBreakdown, gpus: int, sharding: str, offload: bool, layer: int) -> dict[str, int]:
    autocast = sharding != "full_shard"  # FSDP casts the gathered layer only (see estimate_memory)
    shard = gpus if sharding != "none" else 1
    rollout = b.kv_cache + b.generation_logits + b.prefill_activations
    forward = b.scoring_activations + b.scoring_logits
    training = b.activations + max(b.logits, b.backward_workspace) + layer
    if autocast:
        rollout += b.generation_autocast_weights
        forward += b.scoring_autocast_weights
        training += b.update_autocast_weights
    training -= 0 if offload else b.released_gradients // shard
    return {
        "rollout": rollout,
        "scoring": max(forward, b.reward_activations),
        "update": max(training, 0 if offload else b.optimizer_step // shard),
    }


def _gib(value: float) -> str:
    return f"{value / GIB:.1f}"


def describe(estimate: MemoryEstimate, target: Target, config: ProbeConfig, gpus: int, reward: bool) -> str:
    """How the peak is made up and how it was computed: one sentence."""
    s = estimate.states
    models = "actor + critic + reference" if config.algorithm == "ppo" else "actor + reference"
    models += " + reward model" if reward else ""
    if target.offload:
        how = "states offloaded to CPU (not counted)"
    elif target.sharding == "full_shard":
        how = (
            f"{target.sharding_label} over {gpus} GPUs: parameter, gradient and optimizer states ÷ {gpus}, "
            f"plus one gathered layer {_gib(s['gathered_layer'])} GiB"
        )
    elif target.sharding == "shard_grad_op":
        how = f"{target.sharding_label}: gradient and optimizer states ÷ {gpus}, weights replicated"
    else:
        how = "states replicated on every GPU, as autotune's DDP probe"
    phase = estimate.peak_phase
    tokens = f"{config.micro_batch_size} × {config.sequence_length} tokens"
    detail = f" (micro batch {tokens})" if phase == "update" else ""
    return (
        f"{models}: weights {_gib(s['weights'])} + gradients {_gib(s['gradients'])} + Adam states "
        f"{_gib(s['optimizer'])} GiB ({how}), then the {phase} phase {_gib(estimate.phases[phase])} GiB"
        f"{detail}; peak = {estimate.constant / GIB:.2f} GiB + {estimate.factor:g} × "
        f"{_gib(estimate.raw)} GiB (the memory model of autotune's probe, CUDA priors, uncalibrated)"
    )


def first_aid(
    arch: Architecture,
    target: Target,
    config: ProbeConfig,
    gpus: int,
    card: float,
    report: LengthReport | None,
) -> str:
    """The article's order (§6.1), each step on top of the previous, with the predicted peak after it."""

    def peak(c: ProbeConfig, sharding: str = target.sharding, offload: bool = target.offload) -> float:
        return estimate_memory(arch, c, gpus, sharding, offload).peak

    def mark(value: float) -> str:
        return f"{_gib(value)} GiB" + (" fits" if value <= card else "")

    c = dataclasses.replace(config, micro_batch_size=max(1, config.micro_batch_size // 2))
    steps = [f"1) micro_batch_size {config.micro_batch_size}→{c.micro_batch_size}: {mark(peak(c))}"]
    lp, lr = _shorter_lengths(config, report)
    if peak(c) > card:
        c = dataclasses.replace(c, max_prompt_length=lp, max_response_length=lr)
        steps.append(
            f"2) + max_prompt_length {config.max_prompt_length}→{lp}, max_response_length "
            f"{config.max_response_length}→{lr}: {mark(peak(c))}"
        )
    options = []
    if peak(c) > card and not config.use_lora:
        options.append(
            f"+ use_lora: true (r={c.lora_r}): {mark(peak(dataclasses.replace(c, use_lora=True)))}"
        )
    if peak(c) > card and not target.offload:
        options.append(f"+ FSDP FULL_SHARD with cpu_offload: true: {mark(peak(c, 'full_shard', True))}")
    if options:
        steps.append("3) " + " or ".join(options))
    checkpointing = dataclasses.replace(config, gradient_checkpointing=True)
    tail = (
        f"Also gradient_checkpointing: true alone: {mark(peak(checkpointing))}. "
        if not config.gradient_checkpointing
        else ""
    )
    return (
        "in the article's order (§6.1): " + "; ".join(steps) + f". {tail}Raising gradient_accumulation_steps "
        f"does not lower the peak: it only lengthens the step"
    )


def _shorter_lengths(config: ProbeConfig, report: LengthReport | None) -> tuple[int, int]:
    """The data's suggestions where they are shorter, else half (a multiple of 8)."""
    half = (
        max(8, _round_up(config.max_prompt_length // 2, 8)),
        max(8, _round_up(config.max_response_length // 2, 8)),
    )
    if report is None:
        return half
    prompt = min(config.max_prompt_length, report.suggested_prompt_length)
    response = min(config.max_response_length, report.suggested_response_length or config.max_response_length)
    return (
        (prompt, response)
        if (prompt, response) != (config.max_prompt_length, config.max_response_length)
        else half
    )


def memory_findings(
    arch: Architecture,
    target: Target,
    config: ProbeConfig,
    gpus: int,
    card: tuple[str, float] | None,
    report: LengthReport | None,
) -> tuple[list[Finding], dict[str, Any]]:
    estimate = estimate_memory(arch, config, gpus, target.sharding, target.offload)
    text = describe(estimate, target, config, gpus, arch.reward_parameters > 0)
    info = {
        "predicted_peak_gib": round(estimate.peak / GIB, 2),
        "raw_gib": round(estimate.raw / GIB, 2),
        "states_gib": {k: round(v / GIB, 3) for k, v in estimate.states.items()},
        "phases_gib": {k: round(v / GIB, 3) for k, v in estimate.phases.items()},
        "sharding": target.sharding,
        "offload": target.offload,
    }
    peak = f"predicted peak {_gib(estimate.peak)} GiB per GPU"
    if card is None:
        note = f"{peak}: {text}; pass --gpu NAME or --memory GiB to compare it with the card"
        return [Finding("memory", note, severity="note")], info
    name, gib = card
    info["card_gib"] = gib
    info["fits"] = estimate.peak <= gib * GIB
    if estimate.peak > gib * GIB:
        problem = f"{peak} > {gib:g} GiB ({name}): out of memory expected; {text}"
        return [Finding("memory", problem, first_aid(arch, target, config, gpus, gib * GIB, report))], info
    tight = estimate.peak > TIGHT * gib * GIB
    margin = " — within 10% of the card: fragmentation may still OOM" if tight else ""
    return [Finding("memory", f"{peak} fits {gib:g} GiB ({name}){margin}; {text}", severity="note")], info


# --- the command -----------------------------------------------------------------------------------------


def _card(options: CheckOptions, target: Target) -> tuple[str, float] | None:
    from autotune.memory.gpus import gpu_memory_gib, normalise

    if options.gpu:
        return normalise(options.gpu), gpu_memory_gib(options.gpu)
    if options.memory_gib:
        return "--memory", options.memory_gib
    if target.memory_gib:
        return "the study's budget", float(target.memory_gib)
    return None


def check(options: CheckOptions) -> CheckResult:
    """Read the config and run every check; UserError for input that cannot be read."""
    target = read_target(options.path)
    card = _card(options, target)  # an unknown --gpu is a usage error: before any work
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
    memory = None
    if config is not None:
        if target.overrides is None:
            findings += divisibility_findings(config, gpus)
        findings += worker_findings(config, options.cores)
        findings += rollout_findings(config, gpus)
        findings += reward_findings(target)
        model_findings, memory = _model_checks(options, target, config, gpus, card)
        findings += model_findings
    else:
        findings.append(
            Finding(
                "memory", "the override file lacks the batch sizes the memory model needs", severity="note"
            )
        )
    return CheckResult(str(options.path), target, gpus, _card_label(card), findings, memory)


def _card_label(card: tuple[str, float] | None) -> str | None:
    return f"{card[0]} ({card[1]:g} GiB)" if card else None


def _model_checks(
    options: CheckOptions, target: Target, config: ProbeConfig, gpus: int, card: tuple[str, float] | None
) -> tuple[list[Finding], dict[str, Any] | None]:
    """Lengths against the data, positions and memory: the checks that need the model."""
    from autotune.memory.model import Architecture
    from autotune.models.registry import resolve_model

    name = options.model or registry_name(target.model)
    findings: list[Finding] = []
    report = None
    if options.data is not None:
        from autotune.data.lengths import measure_lengths

        report = measure_lengths(options.data, name or "tiny-llama", options.prompt_key, options.response_key)
        findings += length_findings(config, report)
    if name is None:
        shown = target.model or "(none)"
        note = (
            f"memory not checked: model {shown!r} is not one autotune knows; pass --model NAME or a "
            f"local directory"
        )
        return [*findings, Finding("memory", note, severity="note")], None
    spec = resolve_model(name)
    findings += position_findings(config, spec)
    reward = registry_name(target.reward_model)
    if target.reward_model and reward is None:
        note = f"reward model {target.reward_model!r} is not one autotune knows: its memory is not counted"
        findings.append(Finding("memory", note, severity="note"))
    arch = Architecture.from_specs(spec, resolve_model(reward) if reward else None)
    memory_found, memory = memory_findings(arch, target, config, gpus, card, report)
    return findings + memory_found, memory


def print_result(result: CheckResult) -> None:
    t = result.target
    model = f"{t.model}" + (f" (reward {t.reward_model})" if t.reward_model else "")
    print(
        f"autotune check {result.path}: {t.kind}; model {model}; {result.gpus} GPU(s)"
        f"{'; ' + result.card if result.card else ''}; {t.sharding_label}"
    )
    for f in result.findings:
        mark = "✗" if f.severity == "problem" else "·"
        print(f"{mark} {f.check}: {f.problem}")
        if f.fix:
            print(f"    fix: {f.fix}")
    count = len(result.problems)
    print(f"{count} problem{'s' if count != 1 else ''} found" if count else "no problems found")


def run(options: CheckOptions, as_json: bool = False) -> int:
    result = check(options)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_result(result)
    return result.exit_code


__all__ = [
    "CheckOptions",
    "CheckResult",
    "Finding",
    "MemoryEstimate",
    "check",
    "estimate_memory",
    "read_target",
    "registry_name",
    "run",
]
