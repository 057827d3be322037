"""The tracer against reality: tiny models' training passes run for real on this CPU, beside their trace.

    python -m bench.trace_measured                    # 6 configurations, a fresh process each, ~2 minutes
    python -m bench.trace_measured --measure grpo     # one configuration measured (JSON); --trace: traced

For each configuration (tiny-llama, one rank, the CPU probe's fp32 layout) a fresh process builds the probe's
models for real, steps once (as the trace does), and runs each training pass of `autotune.probe.rank.trace`
with real tensors: what the pass adds to the resident set is its peak RSS less the RSS at its start (the
probe's own way to measure a CPU rank: large blocks mapped apart so a freed tensor leaves the resident set,
the high-water mark reset before each pass). Then the same pass again under torch's tracker, on real tensors.
Beside them, the same config traced on fake tensors: the pass's peak less what was resident at its start.
The states (weights, gradients, Adam's) are compared byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
from typing import Any

from autotune.config.knobs import ProbeConfig

BASE = ProbeConfig(
    train_batch_size=16,
    rollout_batch_size=16,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    max_prompt_length=128,
    max_response_length=128,
    sharding="replicate",
    algorithm="ppo",
    kl_coef=0.05,
)
CASES = {
    "ppo-kl": {},
    "no-ckpt": {"gradient_checkpointing": False},
    "m8": {"micro_batch_size": 8, "gradient_accumulation_steps": 1},
    "len512": {"max_prompt_length": 256, "max_response_length": 256},
    "lora": {"use_lora": True},
    "grpo": {"algorithm": "grpo", "rollout_n": 2, "kl_coef": 0.0},
}
MODEL = "tiny-llama"


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def measure(config: ProbeConfig) -> dict[str, Any]:
    """In this process: the passes run for real, each one's peak RSS over its start (bytes), and what torch's
    tracker counts of the same real tensors (the tracer's counting without fake tensors)."""
    import torch

    from autotune.config.job_lengths import JobLengths
    from autotune.models.catalog import resolve_model
    from autotune.probe.rank import ppo
    from autotune.probe.rank.measure import peak_rss_bytes, reset_peak, state_bytes
    from autotune.probe.rank.model_build import build_models
    from autotune.probe.rank.process import return_freed_memory
    from autotune.probe.rank.trace import traced_pass, warm_up
    from autotune.probe.rank.trace_passes import rollout_buffer, training_passes
    from autotune.probe.rank.trace_resident import resident_states

    return_freed_memory()
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    models = build_models(resolve_model(MODEL), None, config, cpu, 1)
    warm_up(models, "cpu")
    resident = resident_states(models, rollout_buffer(config, 1), "cpu", sharded=False)
    lengths = JobLengths()  # every sample at the limits, as the trace's default
    ctx = ppo.StepContext(config, cpu, 1, pad_token_id=0, lengths=lengths)
    added: dict[str, int] = {}
    tracked: dict[str, int] = {}
    for name, model, optimizer, run in training_passes(models, ctx):
        # plain eager first: any dispatch mode (the tracker's included) changes what eager allocates
        reset_peak("cpu")
        start = _rss()
        before_step: list[int] = []
        hook = None
        if optimizer is not None:
            record = before_step.append
            hook = optimizer.register_step_pre_hook(lambda *_, record=record: record(peak_rss_bytes()))
        run()
        if hook is not None:
            hook.remove()
            added[name.replace("update", "backward")] = before_step[0] - start
        added[name] = peak_rss_bytes() - start
        for peak in traced_pass(name, model, optimizer, run, resident)[0]:  # the same pass, tracked
            tracked[peak.name] = peak.peak - sum(resident.values())
    return {"added": added, "tracked": tracked, "states": state_bytes(models, "cpu")}


def _traced(config: ProbeConfig) -> dict[str, Any]:
    from autotune.models.catalog import resolve_model
    from autotune.probe.rank.trace import trace_memory

    trace = trace_memory(resolve_model(MODEL), None, config, 1, layout="cpu")
    resident = sum(trace.states.values())
    return {
        "added": {p.name: p.peak - resident for p in trace.phases},
        "states": {k: trace.states[k] for k in ("weights", "gradients", "optimizer")},
    }


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] in ("--measure", "--trace"):  # one configuration, as JSON
        config = dataclasses.replace(BASE, **CASES[sys.argv[2]])
        print(json.dumps(measure(config) if sys.argv[1] == "--measure" else _traced(config)))
        return 0
    errors: list[float] = []
    print("| config | pass | measured (RSS) MiB | real tensors, tracked MiB | traced MiB | traced vs RSS |")
    print("|---|---|---|---|---|---|")
    for name, knobs in CASES.items():
        child = [sys.executable, "-m", "bench.trace_measured", "--measure", name]
        real = json.loads(
            subprocess.run(child, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
        )
        traced = _traced(dataclasses.replace(BASE, **knobs))
        same = all(real["states"][k] == traced["states"][k] for k in traced["states"])
        for phase, measured in real["added"].items():
            estimate = traced["added"][phase]
            error = (estimate - measured) / measured if measured > 0 else float("nan")
            errors.append(error)
            real_tensors = real["tracked"][phase] / 2**20
            print(
                f"| {name} | {phase} | {measured / 2**20:.1f} | {real_tensors:.1f} | {estimate / 2**20:.1f} "
                f"| {error:+.1%} |"
            )
        said = "equal" if same else "DIFFER"
        print(f"| {name} | states (weights, gradients, Adam) | byte for byte: {said} | | | |")
    finite = [e for e in errors if e == e]
    median, worst = statistics.median(finite), max(finite, key=abs)
    print(f"\nmedian error {median:+.1%}, worst {worst:+.1%} over {len(finite)} passes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
