"""The check `--engine verl` needs a GPU for: verl itself against autotune's built-in probe, on a CUDA machine
with verl and vLLM installed in their own environment.

    .venv/bin/python -m bench.verl_check --verl-python /opt/verl/bin/python [--out verl_check.json]
    .venv/bin/python -m bench.verl_check --dry-run        # the same steps on CPU, with tests/fake_verl

Steps, each in its own try/except (an error is recorded and the next step runs), each skipped when less of
--deadline (default 540 s) is left than it needs:
1. model: qwen2.5-0.5b as a local folder verl can load (its config, autotune's tokenizer and random bf16
   weights: nothing is downloaded);
2. engines: two configurations probed by both engines; their samples/sec and peaks side by side (verl's peak
   is the larger of its allocator figure and NVML's device peak, vLLM's pool included: it should be larger);
3. oom: one configuration far beyond the card through verl, which must come back `oom`;
4. study: `autotune run --engine verl --trials 6` on bench/spaces/verl-check.yaml (verl's rollout share,
   max_num_seqs and dynamic batch size searched with the batch knobs) end to end, with its report.
Prints one line per check and the summary as JSON (also to --out after every step). Without CUDA or without
verl (and vLLM) in --verl-python's environment it prints one line saying which and exits 0, unless
--dry-run: then it runs every step on CPU with tiny-llama and the stand-in verl of tests/fake_verl, which
checks this script and the backend's code paths, not verl's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STAND_IN = REPO / "tests" / "fake_verl"
SPACE = REPO / "bench" / "spaces" / "verl-check.yaml"  # verl's own knobs searched too, sized for minutes
GPU_CONFIGS = {  # ProbeConfig fields: T R m g Lp Lr (PPO, train 64 samples, 32 per optimizer step)
    "small": {"train_batch_size": 64, "rollout_batch_size": 32, "micro_batch_size": 4,
              "gradient_accumulation_steps": 8, "max_prompt_length": 128, "max_response_length": 128},
    "large": {"train_batch_size": 64, "rollout_batch_size": 64, "micro_batch_size": 16,
              "gradient_accumulation_steps": 2, "max_prompt_length": 128, "max_response_length": 128},
}  # fmt: skip
OOM_CONFIG = {"train_batch_size": 512, "rollout_batch_size": 512, "micro_batch_size": 256,
              "gradient_accumulation_steps": 1,
              "max_prompt_length": 2048, "max_response_length": 2048}  # fmt: skip
CPU_CONFIGS = {
    name: {**c, "max_prompt_length": 16, "max_response_length": 16} for name, c in GPU_CONFIGS.items()
}
CPU_OOM = {**CPU_CONFIGS["large"], "micro_batch_size": 32, "gradient_accumulation_steps": 1}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--verl-python", help="the python of the environment with verl 0.9.1 and vLLM")
    parser.add_argument(
        "--model", default="qwen2.5-0.5b", help="a registry name (random weights) or a folder"
    )
    parser.add_argument("--out", type=Path, default=Path("verl_check.json"))
    parser.add_argument("--deadline", type=float, default=540.0, help="seconds for the whole check")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny-llama, the stand-in verl")
    args = parser.parse_args()
    if not args.dry_run:
        missing = preflight(args.verl_python)
        if missing:
            print(f"bench.verl_check skipped: {missing}")
            return 0
    return Check(args).run()


def preflight(verl_python: str | None) -> str:
    """'' when this machine can run the check, else what is missing."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is false); --dry-run runs the CPU miniature"
    if not verl_python:
        return (
            'no --verl-python: install verl in its own environment (pip install "verl[vllm]==0.9.1" orjson)'
        )
    found = subprocess.run([verl_python, "-c", "import verl, vllm"], capture_output=True, text=True)
    if found.returncode != 0:
        return f"verl or vLLM is not importable by {verl_python}: {found.stderr.strip().splitlines()[-1:]}"
    return ""


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.started = args, time.monotonic()
        self.dry = args.dry_run
        self.device = "cpu" if self.dry else "cuda"
        self.verl_python = args.verl_python or sys.executable
        if self.dry:  # the stand-in verl, importable from its folder by every process this check starts
            os.environ["PYTHONPATH"] = os.pathsep.join([str(STAND_IN), os.environ.get("PYTHONPATH", "")])
        self.summary: dict[str, Any] = {
            "dry_run": self.dry,
            "device": self.device,
            "checks": {},
            "errors": {},
        }
        self.tmp = Path(tempfile.mkdtemp(prefix="verl-check-"))

    def left(self) -> float:
        return self.args.deadline - (time.monotonic() - self.started)

    def step(self, name: str, seconds: float, body: Callable[[], Any]) -> None:
        if self.left() < seconds:
            self.summary["checks"][name] = f"skipped: {self.left():.0f} s left, needs {seconds:.0f}"
            print(f"{name}: skipped (time)")
            return
        try:
            self.summary[name] = body()
        except Exception as exc:
            self.summary["errors"][name] = "".join(traceback.format_exception(exc))[-3000:]
            print(f"{name}: error {type(exc).__name__}: {exc}")
        self.args.out.write_text(json.dumps(self.summary, indent=2, default=str))

    def run(self) -> int:
        self.step("model", 60, self.model_folder)
        self.step("engines", 240, self.engines)
        self.step("oom", 60, self.oom)
        self.step("study", 120, self.study)
        self.summary["seconds"] = round(time.monotonic() - self.started, 1)
        self.args.out.write_text(json.dumps(self.summary, indent=2, default=str))
        print(json.dumps(self.summary, indent=2, default=str))
        failed = [k for k, v in self.summary["checks"].items() if v is False]
        return 1 if failed or self.summary["errors"] else 0

    def model_folder(self) -> dict[str, Any]:
        from tools.model_dir import write_model_dir

        name = "tiny-llama" if self.dry else self.args.model
        if Path(name).is_dir():
            self.model = str(Path(name).resolve())
            return {"folder": self.model, "weights": "the folder's"}
        folder = write_model_dir(name, self.tmp / name)
        if not self.dry:  # verl loads weights: random ones of the real architecture, in bf16
            import torch
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_config(
                __import__("transformers").AutoConfig.from_pretrained(folder), torch_dtype=torch.bfloat16
            )
            model.save_pretrained(folder)
        self.model = str(folder)
        self.summary["checks"]["model"] = True
        return {"folder": self.model, "weights": "none (stand-in)" if self.dry else "random bf16"}

    def settings(self, engine: str, timeout: float) -> Any:
        from autotune.probe.contract import ProbeSettings

        return ProbeSettings(
            model=self.model, device=self.device, engine=engine, engine_python=self.verl_python,
            iterations=2, warmup_iterations=1, timeout_seconds=timeout,
        )  # fmt: skip

    def engines(self) -> dict[str, Any]:
        from autotune.config.knobs import ProbeConfig
        from autotune.trainers.registry import run_probe

        configs = CPU_CONFIGS if self.dry else GPU_CONFIGS
        found: dict[str, Any] = {}
        for name, fields in configs.items():
            row = {}
            for engine in ("builtin", "verl"):
                result = run_probe(ProbeConfig(**fields), self.settings(engine, 150))
                row[engine] = {
                    "status": result.status,
                    "samples_per_sec": round(result.samples_per_sec, 3),
                    "peak_gib": round(result.peak_memory_gib, 3),
                    "peak_source": result.peak_memory_source,
                    "phase_seconds": result.phase_seconds,
                    "message": result.message,
                }
                print(f"engines {name} {engine}: {result.status} {result.samples_per_sec:.2f} samples/s, "
                      f"{result.peak_memory_gib:.2f} GiB [{result.peak_memory_source}]")  # fmt: skip
            if row["builtin"]["samples_per_sec"] and row["verl"]["samples_per_sec"]:
                row["verl_over_builtin"] = {
                    "samples_per_sec": round(
                        row["verl"]["samples_per_sec"] / row["builtin"]["samples_per_sec"], 3
                    ),
                    "peak": round(row["verl"]["peak_gib"] / max(row["builtin"]["peak_gib"], 1e-9), 3),
                }
            found[name] = row
        self.summary["checks"]["engines"] = all(r["verl"]["status"] == "ok" for r in found.values())
        return found

    def oom(self) -> dict[str, Any]:
        from autotune.config.knobs import ProbeConfig
        from autotune.trainers.registry import run_probe

        result = run_probe(ProbeConfig(**(CPU_OOM if self.dry else OOM_CONFIG)), self.settings("verl", 300))
        self.summary["checks"]["oom"] = result.status == "oom"
        print(f"oom: {result.status} ({result.oom_kind}) {result.message[:160]}")
        return {"status": result.status, "oom_kind": result.oom_kind, "message": result.message}

    def study(self) -> dict[str, Any]:
        out = self.tmp / "study"
        command = [
            sys.executable, "-m", "autotune", "run", "--engine", "verl", "--verl-python", self.verl_python,
            "--model", self.model, "--space", str(SPACE), "--trials", "6", "--gpus", "1",
            "--device", self.device, "--out", str(out), "--json",
            "--time-budget", f"{max(60, int(self.left()) - 60)}s",  # stop with a report, not a kill
        ]  # fmt: skip
        # The stand-in's memory wall at micro batch 32 of the space's 256 tokens (its default suits the
        # oom step's tiny lengths)
        env = {**os.environ, "AUTOTUNE_FAKE_VERL_OOM_TOKENS": "4096"} if self.dry else None
        proc = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=max(60, self.left()), env=env
        )
        self.summary["checks"]["study"] = proc.returncode in (0, 1) and bool(proc.stdout.strip())
        print(f"study: exit {proc.returncode}")
        if not proc.stdout.strip():
            return {"exit_code": proc.returncode, "stderr": proc.stderr[-2000:]}
        summary = json.loads(proc.stdout)
        return {
            "exit_code": proc.returncode,
            "recommended": summary["recommended"],
            "trials": summary["trials"],
        }


if __name__ == "__main__":
    sys.exit(main())
