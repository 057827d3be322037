"""The fixes a broken divisibility rule suggests keep every other rule: `--set micro_batch_size=3` suggested
train_batch_size 18, which the rollout batch of 8 does not divide."""

from __future__ import annotations

import dataclasses
import itertools
import random
import re

from autotune.cli import main
from autotune.config.knobs import ProbeConfig, rollout_batch_fix, train_batch_fixes, train_batch_step
from autotune.config.rules import config_findings

CORES = 64  # the worker rule is not what these tests are about


def _broken(config: ProbeConfig, gpus: int) -> set[str]:
    return {f.key for f in config_findings(config, gpus, cores=CORES) if f.check == "divisibility"}


def _configs(count: int = 1500):
    rng = random.Random(7)
    for _ in range(count):
        n = rng.choice([1, 1, 2, 4])
        config = ProbeConfig(
            train_batch_size=rng.randint(1, 96),
            rollout_batch_size=rng.randint(1, 32),
            micro_batch_size=rng.randint(1, 8),
            gradient_accumulation_steps=rng.randint(1, 4),
            log_prob_micro_batch_size=rng.choice([None, rng.randint(1, 12)]),
            rollout_n=n,
            algorithm="grpo" if n > 1 else "ppo",
        )
        yield config, rng.choice([1, 2, 3, 4])


def test_the_reported_case_suggests_a_train_batch_every_rule_accepts(capsys):
    assert main(["probe", "--set", "micro_batch_size=3", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "train_batch_size: 18" not in err and "fix: train_batch_size: 24" in err
    assert _broken(ProbeConfig(micro_batch_size=3, train_batch_size=24), 1) == set()


def test_train_batch_fixes_keep_every_rule_a_train_batch_can_keep():
    for config, gpus in _configs():
        fixes = train_batch_fixes(config, gpus)
        assert all(t % train_batch_step(config, gpus) == 0 and t > 0 for t in fixes)
        for t in fixes:
            # only whole prompt groups per GPU (R % (W·n)) depend on nothing but the rollout batch
            assert _broken(dataclasses.replace(config, train_batch_size=t), gpus) <= {"rollout_batch_size"}


def test_train_batch_fixes_are_the_nearest_above_and_below():
    config = ProbeConfig(
        train_batch_size=300, rollout_batch_size=128, micro_batch_size=32, gradient_accumulation_steps=4
    )
    assert train_batch_step(config, 2) == 256
    assert train_batch_fixes(config, 2) == (512, 256)
    assert train_batch_fixes(dataclasses.replace(config, train_batch_size=512), 2) == (512,)
    assert train_batch_fixes(dataclasses.replace(config, train_batch_size=100), 2) == (256,)


def test_rollout_batch_fix_keeps_the_rollout_rules():
    for config, gpus in _configs():
        rollout = rollout_batch_fix(config, gpus)
        if rollout is None:
            assert config.train_batch_size % (gpus * config.rollout_n)
            continue
        fixed = dataclasses.replace(config, rollout_batch_size=rollout)
        assert not {"rollout_batch_size", "train_batch_size"} & {
            f.key for f in config_findings(fixed, gpus, cores=CORES) if "rollout_batch_size=" in f.problem
        }


def _suggested_train_batches(fix: str) -> list[int]:
    """The train batches a fix text names: `train_batch_size: 512 (4 rollouts) or 256 (2)`, `... 24 or 12`."""
    match = re.search(r"(?<!with )train_batch_size: (\d+)((?: \(\d+(?: rollouts)?\))?(?: or \d+)*)", fix)
    return [int(match.group(1))] + [int(v) for v in re.findall(r"or (\d+)", match.group(2))] if match else []


def test_every_suggested_train_batch_in_a_finding_keeps_the_other_rules():
    """The fix text itself: each train batch it names, applied alone, breaks no rule a train batch decides;
    a rollout batch named with its train batch, applied together, break none."""
    for config, gpus in itertools.islice(_configs(), 600):
        for finding in config_findings(config, gpus, cores=CORES):
            for t in _suggested_train_batches(finding.fix):
                broken = _broken(dataclasses.replace(config, train_batch_size=t), gpus)
                assert broken <= {"rollout_batch_size"}, (config, gpus, finding.line)
            paired = re.search(r"rollout_batch_size: (\d+) with train_batch_size: (\d+)", finding.fix)
            if paired:
                fixed = dataclasses.replace(
                    config, rollout_batch_size=int(paired.group(1)), train_batch_size=int(paired.group(2))
                )
                assert _broken(fixed, gpus) == set(), (config, gpus, finding.line)
