"""One run on a CUDA machine that checks what the CPU tests cannot: bf16 probes, real OOMs, NVML, a study.

    .venv/bin/python -m bench.gpu_check [--out gpu_check.json] [--deadline 450]
    .venv/bin/python -m bench.gpu_check --dry-run [--out gpu_check.json]   # the same steps on CPU, tiny-llama

Steps, in order, each in its own try/except (an error is recorded in the summary and the next step runs) and
each skipped when the time left before --deadline is less than it needs:

0. preflight: every module a probe and a study import (torch with CUDA, transformers, peft, optuna,
   nvidia-ml-py, autotune's probe code), each missing one named with what installs it;
1. environment: GPU name and memory, driver, torch/CUDA versions, and the device's memory in use before any
   probe (another tenant's or the driver's, which NVML's device-level figure will include);
2. probes: qwen2.5-0.5b (random weights; bf16 autocast on CUDA) at three configurations, no budget; then the
   holdings the CPU cannot run or size: LoRA, a 7B-class LoRA probe that fits one card (llama-2-7b r16 at a
   small batch, 512/512), FSDP2 full_shard with verl's phase offload and with offload_policy (one GPU: the
   offload code paths), and full_shard over 2 GPUs where more than one is visible;
3. oom: two probes on an emulated smaller card (ProbeSettings.memory_budget_gib: the probe sets
   torch.cuda.set_per_process_memory_fraction) — one below the weights and optimizer state (OOM before
   the first iteration ends), one at 80% of the largest probe's peak (OOM inside the iteration); both must
   be classified `oom`/`cuda`;
4. peaks: torch's allocator peaks (reserved >= allocated > 0) against NVML's sampled device peak, per probe;
5. memory model: autotune.memory.calibration's CUDA prediction against each measured peak (prior, and
   calibrated on the other probes of the same model); the prior's error is gated (within PRIOR_GATE);
6. study: `autotune run` end to end, 8 trials on an emulated card of 1.2 × the medium probe's peak (so the
   largest micro batches hit real OOMs; at least 10% above autotune's own floor), with its report files.

Writes the summary JSON to --out after every step (a run killed half-way still leaves what it found) and
prints one line per check. Exit 0 when every check passed, 1 when one failed or a step errored, 2 without
CUDA (unless --dry-run). Under 8 minutes on an H200: the time plan (printed first) gives every probe a
timeout, skips a probe that would leave the study less than STUDY_RESERVE seconds, and the study gets what is
left of --deadline (default 450 s).

--dry-run runs the same code paths on CPU with tiny-llama and tiny sizes (about 2 minutes on 2 cores): the
OOMs are then emulated (peak RSS against the budget), NVML is absent, the model is the CPU one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.units import GIB


def batch(
    train: int, rollout: int, micro: int, accumulation: int, prompt: int, response: int, workers: int = 1
) -> dict[str, int]:
    """ProbeConfig fields (and a seed config's keys) in the order the README writes them: T R m g Lp Lr."""
    return {
        "train_batch_size": train,
        "rollout_batch_size": rollout,
        "micro_batch_size": micro,
        "gradient_accumulation_steps": accumulation,
        "num_rollout_workers": workers,
        "max_prompt_length": prompt,
        "max_response_length": response,
    }


def seed(train: int, mini: int, rollout: int, micro: int, prompt: int, response: int) -> dict[str, int]:
    """A seed config's keys: the recipe (T, the mini batch, lengths) and the system knobs (R, m, workers)."""
    return {
        "train_batch_size": train,
        "mini_batch_size": mini,
        "rollout_batch_size": rollout,
        "micro_batch_size": micro,
        "num_rollout_workers": 1,
        "max_prompt_length": prompt,
        "max_response_length": response,
    }


@dataclass(frozen=True)
class Plan:
    """What to probe: the GPU plan, or its CPU miniature for --dry-run."""

    device: str
    model: str
    configs: dict[str, dict[str, Any]]  # name -> ProbeConfig fields
    states_oom_budget_gib: float  # below the weights + gradients + optimizer state
    study_space: dict[str, Any]
    probe_timeout: float
    iterations: int
    oom_kind: str  # what a forced OOM must be classified as
    # name -> (model, ProbeConfig fields, ranks, seconds it may take): the holdings and sizes the CPU cannot
    # measure; a probe needing more GPUs than are visible is skipped and said so
    extra_probes: dict[str, tuple[str, dict[str, Any], int, float]] = field(default_factory=dict)


GPU_PLAN = Plan(
    device="cuda",
    model="qwen2.5-0.5b",
    configs={
        "small": batch(32, 16, 4, 2, 64, 64),
        "medium": batch(64, 32, 8, 2, 64, 64),
        "large": batch(64, 64, 32, 1, 64, 64),  # the memory model predicts ~28 GiB
    },
    # qwen2.5-0.5b full fine-tuning, PPO: actor + critic fp32 with Adam (~16 B/param each) and a bf16
    # reference: ~16 GiB before any activation (the memory model's floor: 18), so 8 GiB fails before the
    # first iteration ends (building the models or at the first optimizer step, which allocates Adam's state).
    states_oom_budget_gib=8.0,
    study_space={
        "description": "bench.gpu_check: qwen2.5-0.5b on a 24 GiB emulated card",
        "model": "qwen2.5-0.5b",
        "reward_model": "function",
        "gpus": 1,
        "memory_budget_gib": 24,  # replaced by study_budget(): 1.2 × the medium probe's peak
        "headroom": 0.10,
        "algorithm": "ppo",
        "lora": {"enabled": False},
        "probe": {"iterations": 1, "warmup": 1, "timeout_seconds": 60},
        "knobs": {
            "train_batch_size": 64,  # the recipe: 64 samples, 32 per optimizer step, 64/64 tokens
            "mini_batch_size": 32,
            "max_prompt_length": 64,
            "max_response_length": 64,
            "rollout_batch_size": {"min": 16, "max": 64},
            "micro_batch_size": {"min": 2, "max": 32},
            "num_rollout_workers": {"min": 1, "max": 2},
        },
        "seed_configs": [{"name": "start small (the article's advice)", **seed(64, 32, 16, 4, 64, 64)}],
    },
    probe_timeout=90.0,
    iterations=2,
    oom_kind="cuda",
    extra_probes={
        "lora": ("qwen2.5-0.5b", {**batch(32, 16, 4, 2, 64, 64), "use_lora": True}, 1, 60.0),
        # ~13 GiB of bf16 base weights (the reference is the base), r16 adapters, KV of 8 × 1024 tokens
        "7b lora": (
            "llama-2-7b",
            {**batch(16, 8, 2, 1, 512, 512), "use_lora": True, "lora_r": 16, "lora_alpha": 32},
            1,
            150.0,
        ),
        "fsdp offload": (
            "qwen2.5-0.5b",
            {
                **batch(32, 16, 4, 2, 64, 64),
                "sharding": "full_shard",
                "param_offload": True,
                "optimizer_offload": True,
            },
            1,
            60.0,
        ),
        "fsdp offload_policy": (
            "qwen2.5-0.5b",
            {**batch(32, 16, 4, 2, 64, 64), "sharding": "full_shard", "offload_policy": True},
            1,
            60.0,
        ),
        "fsdp 2 gpus": ("qwen2.5-0.5b", {**batch(32, 16, 4, 2, 64, 64), "sharding": "full_shard"}, 2, 60.0),
    },
)

CPU_PLAN = Plan(
    device="cpu",
    model="tiny-llama",
    configs={
        "small": batch(16, 8, 2, 2, 16, 16),
        "medium": batch(16, 16, 4, 2, 16, 16),
        "large": batch(16, 16, 16, 1, 16, 32),
    },
    states_oom_budget_gib=0.3,  # below the Python + torch runtime alone (~0.45 GiB of RSS)
    study_space={
        "description": "bench.gpu_check --dry-run: tiny-llama on CPU",
        "model": "tiny-llama",
        "reward_model": "function",
        "gpus": 1,
        "memory_budget_gib": 0.67,
        "headroom": 0.10,
        "algorithm": "ppo",
        "lora": {"enabled": False},
        "probe": {"iterations": 1, "warmup": 1, "timeout_seconds": 60},
        "knobs": {
            "train_batch_size": 16,
            "mini_batch_size": 16,
            "max_prompt_length": 16,
            "max_response_length": 16,
            "rollout_batch_size": {"min": 8, "max": 16},
            "micro_batch_size": {"min": 2, "max": 16},
            "num_rollout_workers": 1,
        },
        "seed_configs": [{"name": "start small", **seed(16, 16, 8, 2, 16, 16)}],
    },
    probe_timeout=60.0,
    iterations=1,
    oom_kind="emulated",
    extra_probes={
        "lora": ("tiny-llama", {**batch(16, 8, 2, 2, 16, 16), "use_lora": True}, 1, 60.0),
        "fsdp 2 gpus": ("tiny-llama", {**batch(16, 8, 2, 2, 16, 16), "sharding": "full_shard"}, 2, 60.0),
        # offload is refused on CPU: the dry run checks that it is, in one line
        "fsdp offload_policy": (
            "tiny-llama",
            {**batch(16, 8, 2, 2, 16, 16), "sharding": "full_shard", "offload_policy": True},
            1,
            60.0,
        ),
    },
)
STUDY_TRIALS = 8
DRY_RUN_STUDY_TRIALS = 3
STUDY_RESERVE = 150.0  # seconds kept for the study: a probe that would eat into them is skipped
PRIOR_GATE = 0.35  # the prior (uncalibrated) model's error allowed on a probe
PREFLIGHT = {  # module -> what installs it
    "torch": "pip install torch (a CUDA build)",
    "transformers": "./setup.sh (transformers)",
    "peft": "./setup.sh (peft)",
    "optuna": "./setup.sh (optuna)",
    "pynvml": "pip install nvidia-ml-py",
    "autotune.probe.rank.ppo": "pip install -e . from the checkout",
}


@dataclass
class Check:
    """The run's state: the summary written to --out, the deadline and the probes measured so far."""

    plan: Plan
    out: Path
    deadline: float
    summary: dict[str, Any] = field(default_factory=dict)
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> ProbeResult.to_dict()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def verdict(self, name: str, passed: bool, detail: str) -> None:
        self.summary.setdefault("checks", []).append({"name": name, "passed": passed, "detail": detail})
        print(f"{'PASS' if passed else 'FAIL'} {name}: {detail}", flush=True)

    def save(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.summary, indent=2, default=str))

    def step(self, name: str, needs: float, body: Callable[[Check], dict[str, Any]]) -> None:
        """Run one step unless too little time is left; record its figures, or its error, and save."""
        record: dict[str, Any] = {}
        if self.left() < needs:
            record = {"skipped": f"{self.left():.0f} s left, the step needs about {needs:.0f} s"}
            self.verdict(name, False, f"skipped: {record['skipped']}")
        else:
            started = time.monotonic()
            try:
                record = body(self)
            except Exception as exc:  # recorded, and the next step still runs
                record = {
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-3000:],
                }
                self.verdict(name, False, f"step raised {type(exc).__name__}: {exc}")
            record["seconds"] = round(time.monotonic() - started, 1)
        self.summary.setdefault("steps", {})[name] = record
        self.save()


# --- steps -------------------------------------------------------------------------------------------------


def nvml_state() -> dict[str, Any]:
    """The device as NVML sees it, without creating a CUDA context in this process."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        return {
            "name": name.decode() if isinstance(name, bytes) else name,
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "total_gib": memory.total / GIB,
            "used_gib": memory.used / GIB,
            "processes": _process_count(pynvml, handle),
        }
    except Exception as exc:  # no driver, no nvidia-ml-py: say so
        return {"nvml_error": f"{type(exc).__name__}: {exc}"}


def _process_count(pynvml: Any, handle: Any) -> int | None:
    """Other processes on the device (None where the container hides them)."""
    try:
        return len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except Exception:
        return None


def environment(check: Check) -> dict[str, Any]:
    import torch

    from bench.common import machine

    record = {"device": check.plan.device, **machine(), "cuda": torch.version.cuda}
    if check.plan.device == "cuda":
        record["nvml_before"] = nvml_state()
        record["device_count"] = torch.cuda.device_count()
    return record


def settings(
    check: Check,
    budget_gib: float | None = None,
    model: str | None = None,
    ranks: int = 1,
    timeout: float | None = None,
):
    from autotune.probe.contract import ProbeSettings

    return ProbeSettings(
        model=model or check.plan.model,
        device=check.plan.device,
        world_size=ranks,
        iterations=check.plan.iterations,
        timeout_seconds=timeout or check.plan.probe_timeout,
        memory_budget_gib=budget_gib,
    )


def probe(
    check: Check,
    fields: dict[str, Any],
    budget_gib: float | None = None,
    model: str | None = None,
    ranks: int = 1,
    timeout: float | None = None,
) -> dict[str, Any]:
    from autotune.config.knobs import ProbeConfig
    from autotune.trainers.registry import run_probe

    result = run_probe(ProbeConfig(**fields), settings(check, budget_gib, model, ranks, timeout)).to_dict()
    result["stderr_tail"] = result.get("stderr_tail", "")[-1500:]
    result["model"], result["ranks"] = model or check.plan.model, ranks
    return result


def brief(result: dict[str, Any]) -> str:
    return (
        f"{result['status']}{'/' + result['oom_kind'] if result.get('oom_kind') else ''} "
        f"{result['samples_per_sec']:.2f} samples/s, peak {result['peak_memory_bytes'] / GIB:.2f} GiB "
        f"({result['peak_memory_source'] or 'none'}), wall {result['wall_seconds']:.1f} s"
    )


def preflight(check: Check) -> dict[str, Any]:
    """Every module a probe and a study import, each missing one named with what installs it."""
    import importlib

    missing = {}
    for module, remedy in PREFLIGHT.items():
        if module == "pynvml" and check.plan.device != "cuda":
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:  # ImportError, or a broken install that fails on import
            missing[module] = f"{type(exc).__name__}: {exc}; {remedy}"
    if check.plan.device == "cuda" and "torch" not in missing:
        import torch

        if torch.version.cuda is None:
            missing["torch"] = f"torch {torch.__version__} is a CPU build; pip install a CUDA build of torch"
    detail = "; ".join(f"{m}: {why}" for m, why in missing.items()) or "all present"
    check.verdict("preflight: imports", not missing, detail)
    return {"missing": missing}


def time_plan(check: Check) -> dict[str, float]:
    """Seconds each step may take, printed before the run: what fits the deadline, and what is left."""
    plan = check.plan
    steps = {
        "probes": len(plan.configs) * plan.probe_timeout,
        "extra probes": sum(seconds for *_, seconds in plan.extra_probes.values()),
        "oom": 2 * plan.probe_timeout,
        "study (at least)": STUDY_RESERVE,
    }
    print(
        "gpu_check time plan (upper bounds, s): "
        + ", ".join(f"{k} {v:.0f}" for k, v in steps.items())
        + f"; deadline {check.left():.0f}; a probe that would leave the study under {STUDY_RESERVE:.0f} s "
        "is skipped",
        flush=True,
    )
    return steps


def _time_for(check: Check, seconds: float) -> bool:
    return check.left() - seconds >= STUDY_RESERVE


def extra_probes(check: Check) -> dict[str, Any]:
    """The holdings and sizes the CPU cannot measure: LoRA, a 7B-class probe, FSDP with offload, 2 GPUs."""
    visible = _visible_devices(check)
    for name, (model, fields, ranks, seconds) in check.plan.extra_probes.items():
        if ranks > visible:
            check.verdict(f"probe {name}", True, f"not applicable: needs {ranks} devices, {visible} visible")
            continue
        if not _time_for(check, seconds):
            check.verdict(f"probe {name}", False, "skipped: it would leave the study too little time")
            continue
        if check.plan.device == "cpu" and fields.get("offload_policy"):
            check.verdict(f"probe {name}", *_refused_on_cpu(fields))
            continue
        result = probe(check, fields, model=model, ranks=ranks, timeout=seconds)
        check.probes[name] = result
        check.verdict(f"probe {name}", result["status"] == "ok", f"{model} × {ranks}: {brief(result)}")
    return {"results": {k: v for k, v in check.probes.items() if k in check.plan.extra_probes}}


def _visible_devices(check: Check) -> int:
    if check.plan.device != "cuda":
        return 2  # gloo ranks
    import torch

    return torch.cuda.device_count()


def _refused_on_cpu(fields: dict[str, Any]) -> tuple[bool, str]:
    """Offload is CUDA's: the rules must refuse it on CPU, in one line."""
    from autotune.config.knobs import ProbeConfig
    from autotune.config.rules import offload_findings

    found = offload_findings(ProbeConfig(**fields), "cpu")
    return bool(found), f"refused on CPU as designed: {found[0].line}" if found else "not refused on CPU"


def probes(check: Check) -> dict[str, Any]:
    for name, fields in check.plan.configs.items():
        if check.left() < check.plan.probe_timeout:
            check.verdict(f"probe {name}", False, "skipped: too little time left")
            continue
        result = probe(check, fields)
        check.probes[name] = result
        check.verdict(f"probe {name}", result["status"] == "ok", brief(result))
        if check.plan.device == "cuda":
            gpu = result.get("environment", {}).get("gpu")
            check.verdict(f"probe {name} ran on the GPU", bool(gpu), f"environment.gpu = {gpu!r}")
    return {"results": check.probes}


def forced_ooms(check: Check) -> dict[str, Any]:
    """Two emulated small cards: one below the model's states, one that only the iteration overflows."""
    largest = max(
        (r for r in check.probes.values() if r["status"] == "ok"),
        key=lambda r: r["peak_memory_bytes"],
        default=None,
    )
    cases = {"states": (check.plan.configs["small"], check.plan.states_oom_budget_gib)}
    if largest is not None:
        # 80% of the largest peak: above the model's states for this plan (see GPU_PLAN), below its peak
        cases["iteration"] = (largest["config"], 0.8 * largest["peak_memory_bytes"] / GIB)
    record = {}
    for name, (fields, budget) in cases.items():
        if check.left() < check.plan.probe_timeout:
            check.verdict(f"forced oom ({name})", False, "skipped: too little time left")
            continue
        result = probe(check, fields, budget)
        record[name] = {"budget_gib": budget, "result": result}
        passed = result["status"] == "oom" and result.get("oom_kind") == check.plan.oom_kind
        detail = f"budget {budget:.2f} GiB: {brief(result)}; {result.get('message', '')[:200]}"
        check.verdict(f"forced oom ({name}) classified oom/{check.plan.oom_kind}", passed, detail)
    return record


def peaks(check: Check) -> dict[str, Any]:
    """Allocator against NVML, per ok probe: NVML sees the CUDA context too, so it should be the larger."""
    record = {}
    for name, result in check.probes.items():
        if result["status"] != "ok":
            continue
        rank = result["rank_peaks"][0]
        if check.plan.device != "cuda":
            record[name] = {"rss_gib": rank.get("rss_bytes", 0) / GIB}
            continue
        reserved, allocated = rank.get("torch_reserved_bytes", 0), rank.get("torch_allocated_bytes", 0)
        nvml = rank.get("nvml_used_bytes") or 0
        record[name] = {
            "torch_allocated_gib": allocated / GIB,
            "torch_reserved_gib": reserved / GIB,
            "nvml_used_gib": nvml / GIB,
            "nvml_minus_reserved_gib": (nvml - reserved) / GIB if nvml else None,
            "source": result["peak_memory_source"],
        }
        check.verdict(
            f"peaks {name}: reserved >= allocated > 0",
            reserved >= allocated > 0,
            f"allocated {allocated / GIB:.2f}, reserved {reserved / GIB:.2f} GiB",
        )
        check.verdict(
            f"peaks {name}: NVML sampled and >= reserved",
            nvml >= reserved > 0,
            f"NVML {nvml / GIB:.2f} GiB vs reserved {reserved / GIB:.2f} GiB"
            + ("" if nvml else " (NVML unavailable: nvidia-ml-py missing or no permission)"),
        )
    return record


def memory_model(check: Check) -> dict[str, Any]:
    """The model's peak against each measured one: the prior, and calibrated on the other probes."""
    from autotune.config.knobs import ProbeConfig
    from bench.common import memory_model_for

    ok = {name: r for name, r in check.probes.items() if r["status"] == "ok"}
    points = {name: (ProbeConfig(**r["config"]), r["peak_memory_bytes"]) for name, r in ok.items()}
    record = {}
    for name, (config, measured) in points.items():
        model, ranks = ok[name].get("model", check.plan.model), ok[name].get("ranks", 1)
        prior = memory_model_for(model, gpus=ranks, device=check.plan.device)
        same = [o for o in points if o != name and (ok[o].get("model"), ok[o].get("ranks")) == (model, ranks)]
        others = [points[o] for o in same]
        held_out = prior.with_calibration(prior.constant, prior.factor).calibrate(others) if others else None
        record[name] = {
            "measured_gib": measured / GIB,
            "prior_gib": prior.predict(config) / GIB,
            "prior_error": prior.relative_error(config, measured),
            "calibrated_on_others_error": held_out.relative_error(config, measured) if held_out else None,
            "peak_phase": prior.breakdown(config).peak_phase,
        }
        error, prior_error = record[name]["calibrated_on_others_error"], record[name]["prior_error"]
        check.verdict(
            f"memory model {name}",
            abs(prior_error) <= PRIOR_GATE and (error is None or abs(error) <= 0.25),
            f"measured {measured / GIB:.2f} GiB, prior {record[name]['prior_gib']:.2f} GiB "
            f"({prior_error:+.0%}, gate {PRIOR_GATE:.0%}), calibrated on the others "
            + (f"{error:+.0%}" if error is not None else "n/a (no other probe of this model)")
            + " (aim: within 25%)",
        )
    return record


def study(check: Check) -> dict[str, Any]:
    """`autotune run` through the real CLI, into a temporary folder; its statuses and report files."""
    import yaml

    trials = DRY_RUN_STUDY_TRIALS if check.plan.device == "cpu" else STUDY_TRIALS
    budget = study_budget(check)
    with tempfile.TemporaryDirectory(prefix="autotune-gpu-check-") as tmp:
        space = Path(tmp) / "gpu-check.yaml"
        data = {**check.plan.study_space, "memory_budget_gib": budget}
        space.write_text(yaml.safe_dump(data, sort_keys=False))
        command = [
            sys.executable, "-m", "autotune", "run", "--space", str(space), "--trials", str(trials),
            "--out", tmp, "--study", "gpu-check", "--device", check.plan.device,
        ]  # fmt: skip
        timeout = max(30.0, check.left() - 10)
        started = time.monotonic()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, output = None, f"timed out after {timeout:.0f} s: {exc.stdout or ''}"
        seconds = time.monotonic() - started
        folder = Path(tmp) / "gpu-check"
        files = sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []
        statuses = study_statuses(folder / "trials.csv")
        best = folder / "best_config.yaml"
        best_text = best.read_text()[:3000] if best.is_file() else None
    record = {
        "command": " ".join(command[1:]),
        "memory_budget_gib": budget,
        "exit_code": code,
        "seconds": seconds,
        "files": files,
        "statuses": statuses,
        "best_config_yaml": best_text,
        "output_tail": output[-3000:],
    }
    check.verdict(
        f"study: autotune run, {trials} trials",
        code == 0 and "best_config.yaml" in files and "report.html" in files,
        f"exit {code} in {seconds:.0f} s; statuses {statuses}; files {files}",
    )
    return record


def study_budget(check: Check) -> float:
    """The medium probe's measured peak fits with 8% to spare beyond the headroom; the large one may not.

    Set from the measurements, not guessed, so that the study has feasible configs on any GPU and torch;
    the plan's own budget when the medium probe did not run.
    """
    from autotune.config.knobs import ProbeConfig
    from bench.common import memory_model_for

    medium = check.probes.get("medium")
    if not medium or medium["status"] != "ok":
        return float(check.plan.study_space["memory_budget_gib"])
    # `autotune run` refuses a budget whose headroom-less part is below its prior floor: stay 10% above it
    model = memory_model_for(check.plan.model, device=check.plan.device)
    headroom = check.plan.study_space["headroom"]
    floor = 1.1 * model.minimum_bytes(ProbeConfig()) / (1 - headroom)
    return round(max(1.2 * medium["peak_memory_bytes"], floor) / GIB, 3)


def study_statuses(csv: Path) -> dict[str, int]:
    if not csv.is_file():
        return {}
    import pandas as pd

    frame = pd.read_csv(csv)
    column = "status" if "status" in frame.columns else frame.columns[0]
    return {str(k): int(v) for k, v in frame[column].value_counts().items()}


# --- main --------------------------------------------------------------------------------------------------


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON summary")
    parser.add_argument("--deadline", type=float, default=450.0, help="seconds for the whole check")
    parser.add_argument("--dry-run", action="store_true", help="the same steps on CPU with tiny-llama")
    args = parser.parse_args()
    started = time.monotonic()
    if not args.dry_run and not cuda_available():
        print("gpu_check: no CUDA device visible (torch.cuda.is_available() is False); nothing was checked")
        return 2
    plan = CPU_PLAN if args.dry_run else GPU_PLAN
    check = Check(plan, args.out, started + args.deadline)
    check.summary = {"plan": plan.device, "model": plan.model, "dry_run": args.dry_run}
    check.step("preflight", 0, preflight)
    check.step("environment", 5, environment)
    check.summary["time_plan"] = time_plan(check)
    check.step("probes", plan.probe_timeout, probes)
    check.step("extra_probes", 0, extra_probes)
    check.step("oom", plan.probe_timeout, forced_ooms)
    check.step("peaks", 0, peaks)
    check.step("memory_model", 0, memory_model)
    check.step("study", 60, study)
    checks = check.summary.get("checks", [])
    failed = [c["name"] for c in checks if not c["passed"]]
    check.summary["total_seconds"] = time.monotonic() - started
    check.summary["passed"] = bool(checks) and not failed
    check.save()
    print(
        f"gpu_check: {len(checks) - len(failed)}/{len(checks)} checks passed in "
        f"{check.summary['total_seconds']:.0f} s; summary in {args.out}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 0 if check.summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
