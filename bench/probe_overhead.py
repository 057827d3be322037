"""How much of a probe's wall time is spent outside the measured iterations (tiny-llama on CPU).

    python -m bench.probe_overhead [--iterations 2] [--repeats 2]

Start-up (interpreter, imports, process group, model build) and the warm-up iteration are the price of
isolating each probe in its own process; the tuner pays it on every trial. Ranks are forked from the warm
fork server (imports paid once per tuner, shown on the first line) unless AUTOTUNE_FORKSERVER=0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from autotune.config.knobs import ProbeConfig
from autotune.probe import forkserver
from autotune.probe.contract import ProbeSettings
from autotune.probe.launcher import run_probe

CONFIGS = {
    "issue example (T16 R8 m4 g2, 32+16 tokens)": ProbeConfig(
        train_batch_size=16,
        rollout_batch_size=8,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        max_prompt_length=32,
        max_response_length=16,
    ),
    "cpu-tiny mid-space (T32 R16 m4 g2, 32+32 tokens)": ProbeConfig(
        train_batch_size=32,
        rollout_batch_size=16,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        max_prompt_length=32,
        max_response_length=32,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    started = time.monotonic()
    server = forkserver.get()  # run_probe would start it in the first probe, outside its wall time
    if server is not None:
        print(f"fork server: started once in {time.monotonic() - started:.2f} s, not counted below")
    else:
        print(f"fork server: not used ({forkserver.SWITCH}={os.environ.get(forkserver.SWITCH, '')})")
    header = f"{'config':52} {'wall s':>7} {'startup':>8} {'warmup':>7} {'measured':>9} {'outside %':>9}"
    print(f"{header}  path")
    for name, config in CONFIGS.items():
        shares = []
        for _ in range(args.repeats):
            forked = forkserver.ForkServer.forked_total
            result = run_probe(
                config, ProbeSettings(model="tiny-llama", device="cpu", iterations=args.iterations)
            )
            assert result.status == "ok", result.message + result.stderr_tail
            outside = 1 - result.measured_seconds / result.wall_seconds
            shares.append(outside)
            print(
                f"{name:52} {result.wall_seconds:7.2f} {result.startup_seconds:8.2f} "
                f"{result.warmup_seconds:7.2f} {result.measured_seconds:9.2f} {outside:9.1%}  "
                + ("fork server" if forkserver.ForkServer.forked_total > forked else "plain spawn")
            )
        print(f"{'':52} median share outside the measured iterations: {statistics.median(shares):.1%}")


if __name__ == "__main__":
    main()
